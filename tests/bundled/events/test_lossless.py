"""Lossless storage: remote events whose JSON is far from canonical (keys in
any order, any whitespace, escapes where none are needed, large integers, floats, astral characters,
nested content) are read back byte for byte, through the HTTP API and the Python API.

Floats and integers beyond 2**53 in a message's content are not canonical JSON, but the reference hash
covers the pruned event (a message's content pruned to ``{}``), so the event still has an ID and must be
stored as received (``factstream_events.rules.canonical``: "floats or large integers ... must still be stored
as received"). Where canonical JSON is needed and impossible (a local event's content, a remote event
whose ID must be hashed over such a number) the answer is a 400 naming the field.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import random
from typing import Any

import msgspec
import pytest
from factstream_events.rules.canonical import MAX_CANONICAL_INT, MIN_CANONICAL_INT, CanonicalJsonError, canonical_json
from factstream_events.rules.errors import InvalidEvent
from factstream_events.store import RemoteEvent
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.bundled.events.conftest import reads_of, store_of
from tests.bundled.events.remote_history import Built, RemoteRoom
from tests.bundled.events.scenario import client_view

CREATOR = "@zed:elsewhere"
EVENTS = 1_000
BATCH = 100
WHITESPACE = ("", "", " ", "  ", "\n", "\t", "\r\n", " \n  ")
SHORT_ESCAPES = {'"': '\\"', "\\": "\\\\", "\n": "\\n", "\t": "\\t", "\r": "\\r", "\b": "\\b", "\f": "\\f"}
# Text worth escaping oddly: accents, CJK, right-to-left, combining marks, astral characters, controls.
ALPHABET = (
    "aZ09 /\\\"'\n\t\r\b\f\u0001\u001f\u007féÜ\u00a0中文日本語\u05d0\u0301\u2028\u2029\ufeff"
    "\U0001f600\U0001d11e\U0010fffd"
)
#: Numbers canonical JSON cannot hold (floats, integers beyond 2**53) that still fit PostgreSQL's bigint.
ODD_NUMBERS = (0.5, -0.0, 1e300, -2.5e-300, 3.141592653589793, 2**53, 2**63 - 1, -(2**63), 1e16)
NUMBERS = (0, 1, -1, 2**31, -(2**31), 2**32 + 7, MAX_CANONICAL_INT, MIN_CANONICAL_INT, 10**15)


def spaced(rng: random.Random) -> str:
    return rng.choice(WHITESPACE)


def write_text(text: str, rng: random.Random) -> str:
    """A JSON string for ``text``, each character raw or escaped at random (``\\u00e9``, ``\\/``, surrogate pairs)."""
    out = ['"']
    for char in text:
        code = ord(char)
        roll = rng.random()
        if char in SHORT_ESCAPES and roll < 0.5:
            out.append(SHORT_ESCAPES[char])
        elif char == "/" and roll < 0.5:
            out.append("\\/")
        elif char in '"\\' or code < 0x20 or roll < 0.3:
            if code > 0xFFFF:
                high, low = 0xD800 + ((code - 0x10000) >> 10), 0xDC00 + ((code - 0x10000) & 0x3FF)
                escaped = f"\\u{high:04x}\\u{low:04x}"
            else:
                escaped = f"\\u{code:04x}"
            out.append(escaped.upper().replace("\\U", "\\u") if rng.random() < 0.5 else escaped)
        else:
            out.append(char)
    out.append('"')
    return "".join(out)


def write_number(value: int | float, rng: random.Random) -> str:
    if isinstance(value, int):
        return "-0" if value == 0 and rng.random() < 0.3 else str(value)
    return rng.choice([repr(value), f"{value:.17g}", f"{value:.17e}", f"{value:.17E}"])


def write_json(value: Any, rng: random.Random) -> str:
    """``value`` as JSON in a random non-canonical spelling that parses back to it."""
    if isinstance(value, dict):
        keys = list(value)
        rng.shuffle(keys)
        items = [
            spaced(rng) + write_text(k, rng) + spaced(rng) + ":" + spaced(rng) + write_json(value[k], rng) + spaced(rng)
            for k in keys
        ]
        return "{" + ",".join(items) + spaced(rng) + "}"
    if isinstance(value, list):
        return "[" + ",".join(spaced(rng) + write_json(v, rng) + spaced(rng) for v in value) + spaced(rng) + "]"
    if isinstance(value, str):
        return write_text(value, rng)
    if value is None or isinstance(value, bool):
        return json.dumps(value)
    return write_number(value, rng)


def writer(rng: random.Random):
    def write(event: dict[str, Any]) -> bytes:
        text = write_json(event, rng)  # whitespace around the object belongs to the batch it travels in
        assert json.loads(text) == event  # the spelling is faithful
        return text.encode()

    return write


def random_text(rng: random.Random, size: int) -> str:
    return "".join(rng.choice(ALPHABET) for _ in range(size))


def random_value(rng: random.Random, depth: int, odd_numbers: bool) -> Any:
    roll = rng.random()
    if depth > 0 and roll < 0.2:
        return {random_text(rng, rng.randint(1, 6)): random_value(rng, depth - 1, odd_numbers) for _ in range(3)}
    if depth > 0 and roll < 0.3:
        return [random_value(rng, depth - 1, odd_numbers) for _ in range(rng.randint(0, 4))]
    if roll < 0.55:
        return random_text(rng, rng.randint(0, 30))
    if roll < 0.75:
        return rng.choice(NUMBERS) if rng.random() < 0.5 else rng.randint(MIN_CANONICAL_INT, MAX_CANONICAL_INT)
    if roll < 0.85 and odd_numbers:  # floats and integers canonical JSON cannot hold
        return rng.choice(ODD_NUMBERS)
    return rng.choice([True, False, None])


def history(room_id: str, seed: int, count: int = EVENTS) -> list[Built]:
    """``count`` events of a valid room history, each spelled differently: the room's first events
    (world-readable, so a user may read them too), a topic, then messages with random content (one
    in five holding floats or integers beyond 2**53)."""
    rng = random.Random(seed)
    write = writer(rng)
    room = RemoteRoom(room_id)
    room.create(CREATOR, history_visibility="world_readable", write=write)
    room.add("m.room.topic", CREATOR, {"topic": random_text(rng, 40)}, state_key="", write=write)
    while len(room.events) < count:
        i = len(room.events)
        content = {
            "msgtype": "m.text",
            "body": random_text(rng, rng.randint(0, 80)),
            "nested": random_value(rng, 3, odd_numbers=i % 5 == 0),
            "n": rng.choice(ODD_NUMBERS if i % 5 == 0 else NUMBERS),
        }
        room.add("m.room.message", CREATOR if i % 2 else "@yan:elsewhere", content, write=write)
    return room.events


def batch_body(events: list[Built], rng: random.Random, **extra: Any) -> bytes:
    """A remote batch whose own JSON is spaced oddly too; the events' bytes are embedded as they are."""
    items = b",".join(spaced(rng).encode() + b.raw + spaced(rng).encode() for b in events)
    tail = "".join(f',{spaced(rng)}"{k}":{spaced(rng)}{json.dumps(v)}' for k, v in extra.items())
    return b'{ "events" :[' + items + b"]" + tail.encode() + b"}"


def sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


async def read_back(main: Any, client: Any, room_id: str, events: list[Built]) -> None:
    """Every event's stored bytes, over HTTP (writer token, ``raw=true``) and the Python API, hash as sent."""
    server = client("server")
    reads = reads_of(main)
    for built in events:
        r = await server.get(f"/rooms/{room_id}/event/{built.event_id}", params={"raw": "true"})
        assert r.status_code == 200, r.text
        assert sha(r.content) == sha(built.raw), (built.event_id, built.raw[:200], r.content[:200])
        assert sha(await reads.event(None, built.event_id)) == sha(built.raw), built.event_id


async def test_thousand_non_canonical_events_read_back_byte_for_byte(main, client):
    server = client("server")
    rng = random.Random(7)
    over_http = history("!lossless-http:elsewhere", seed=1)
    over_api = history("!lossless-api:elsewhere", seed=2)
    assert len(over_http) == len(over_api) == EVENTS
    not_canonical = 0
    for built in over_http + over_api:  # the test sends no canonical JSON (where canonical JSON exists at all)
        try:
            assert built.raw != canonical_json(built.event)
        except CanonicalJsonError:
            not_canonical += 1
    assert not_canonical >= 2 * EVENTS // 5 - 10  # one message in five, in both rooms
    for spelling in (b"\\u00", b"\\ud83d", b"\\/", b"\\n", b"\xf0\x9f\x98\x80", b"\n", b"\t"):
        assert any(spelling in b.raw for b in over_http), spelling

    for start in range(0, EVENTS, BATCH):
        chunk = over_http[start : start + BATCH]
        r = await server.post("/rooms/!lossless-http:elsewhere/remote_events", content=batch_body(chunk, rng))
        assert r.status_code == 200, r.text
        assert r.json() == {"stored": [b.event_id for b in chunk], "already_stored": []}
    store = store_of(main)
    for start in range(0, EVENTS, BATCH):
        chunk = over_api[start : start + BATCH]
        outcome = await store.persist_remote("!lossless-api:elsewhere", [RemoteEvent(b.raw) for b in chunk])
        assert outcome.stored == [b.event_id for b in chunk]

    await read_back(main, client, "!lossless-http:elsewhere", over_http)
    await read_back(main, client, "!lossless-api:elsewhere", over_api)

    # A user's read (the room is world-readable) is the client format: the stored keys less the
    # federation-only ones, each value its stored bytes (nothing is re-encoded), then event_id and unsigned.
    alice = client("@alice:hs")
    for built in over_http[10::10] + over_api[15::10]:  # messages, after the room became world-readable
        r = await alice.get(f"/rooms/{built.event['room_id']}/event/{built.event_id}")
        assert r.status_code == 200, r.text
        shown = r.json()
        assert {k: v for k, v in shown.items() if k not in {"event_id", "unsigned"}} == client_view(built.event)
        assert shown["event_id"] == built.event_id
        stored = msgspec.json.decode(built.raw, type=dict[str, msgspec.Raw])
        for key in client_view(built.event):
            assert json.dumps(key).encode() + b":" + bytes(stored[key]) in r.content, (key, r.content[:200])


# -- any spelling, through either path (hypothesis) ------------------------------------------------------

json_text = st.text(st.characters(exclude_characters="\x00", exclude_categories=("Cs",)), max_size=12)
json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**63 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | json_text,
    lambda children: st.lists(children, max_size=4) | st.dictionaries(json_text, children, max_size=4),
    max_leaves=24,
)


async def test_any_spelling_of_any_content_round_trips(main, client):
    loop = asyncio.get_running_loop()
    store = store_of(main)
    server = client("server")
    room = RemoteRoom("!spellings:elsewhere")
    room.create(CREATOR)
    await store.persist_remote(room.room_id, [RemoteEvent(b.raw) for b in room.events])
    seen: list[str] = []

    async def one(content: dict[str, Any], seed: int, over_http: bool) -> None:
        rng = random.Random(seed)
        built = room.add("m.room.message", CREATOR, {"body": "x", **content}, write=writer(rng))
        if over_http:
            r = await server.post(f"/rooms/{room.room_id}/remote_events", content=batch_body([built], rng))
            assert r.status_code == 200, r.text
            assert r.json()["stored"] == [built.event_id]
        else:
            assert (await store.persist_remote(room.room_id, [RemoteEvent(built.raw)])).stored == [built.event_id]
        await read_back(main, client, room.room_id, [built])
        seen.append(built.event_id)

    @settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
    @given(st.dictionaries(json_text, json_values, max_size=6), st.integers(0, 2**32), st.booleans())
    def spellings(content: dict[str, Any], seed: int, over_http: bool) -> None:
        asyncio.run_coroutine_threadsafe(one(content, seed, over_http), loop).result(30)

    await asyncio.to_thread(spellings)
    assert len(seen) >= 50


# -- numbers canonical JSON cannot hold --------------------------------------------------------------------


async def test_numbers_canonical_json_cannot_hold_are_kept_where_no_hash_needs_them(main, client):
    server = client("server")
    room = RemoteRoom("!numbers:elsewhere")
    room.create(CREATOR)
    numbers = {"f": 1.5, "e": 1e300, "z": -0.0, "tiny": 5e-324, "big": 2**63 - 1, "neg": -(2**63), "n": 2**53}
    message = room.add("m.room.message", CREATOR, numbers, write=writer(random.Random(3)))
    # A state event keeping a float in its hashed (unpruned) content: its ID given beside it.
    levels = room.add("m.room.power_levels", CREATOR, {"users": {CREATOR: 100.0}, "ban": 2**60}, state_key="")
    r = await server.post(
        f"/rooms/{room.room_id}/remote_events",
        content=batch_body(
            room.events, random.Random(4), event_ids=[None] * (len(room.events) - 1) + [levels.event_id]
        ),
    )
    assert r.status_code == 200, r.text
    await read_back(main, client, room.room_id, room.events)
    assert json.loads(await reads_of(main).event(None, message.event_id))["content"]["e"] == 1e300

    # Integers beyond 64 bits: the HTTP API refuses them naming the field (PostgreSQL's bigint range
    # is the host's limit for any body); the Python API stores them as received.
    huge = room.add("m.room.message", CREATOR, {"n": [1, 2**70]}, prev=[message.event_id], append=False)
    r = await server.post(f"/rooms/{room.room_id}/remote_events", content=batch_body([huge], random.Random(5)))
    assert r.status_code == 400 and "events[0].content.n[1]" in r.text, r.text
    assert (await store_of(main).persist_remote(room.room_id, [RemoteEvent(huge.raw)])).stored == [huge.event_id]
    assert sha(await reads_of(main).event(None, huge.event_id)) == sha(huge.raw)


async def test_local_content_canonical_json_cannot_hold_is_a_400_naming_it(main, client):
    alice = client("@alice:hs")
    r = await alice.post("/createRoom", json={"preset": "public_chat"})
    room = r.json()["room_id"]
    cases = {
        b'{"msgtype": "m.text", "body": "pi", "a": {"b": [1, 2.5]}}': ("content.a.b[1]", "float"),
        b'{"msgtype": "m.text", "body": "big", "n": 9007199254740992}': ("content.n", "9007199254740992"),
    }
    for i, (body, (field, what)) in enumerate(cases.items()):
        r = await alice.put(f"/rooms/{room}/send/m.room.message/t{i}", content=body)
        assert r.status_code == 400, r.text
        assert field in r.text and what in r.text, r.text
    r = await alice.get(f"/rooms/{room}/messages", params={"limit": 100})
    assert not [e for e in r.json()["chunk"] if e["type"] == "m.room.message"]


async def test_remote_event_whose_id_needs_a_float_hashed_is_a_400_naming_it(main, client):
    server = client("server")
    room = RemoteRoom("!float-levels:elsewhere")
    room.create(CREATOR)
    room.add("m.room.power_levels", CREATOR, {"users": {CREATOR: 50.5}}, state_key="")
    with pytest.raises(InvalidEvent, match=r"events\[5\].*content\.users.*float"):
        await store_of(main).persist_remote(room.room_id, [RemoteEvent(b.raw) for b in room.events])
    r = await server.post(f"/rooms/{room.room_id}/remote_events", content=batch_body(room.events, random.Random(6)))
    assert r.status_code == 400, r.text
    assert "events[5]" in r.text and "content.users" in r.text and "float" in r.text, r.text
    assert await main.api.database().fetchall("SELECT count(*) FROM events") == [(0,)]
