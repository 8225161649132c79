"""Sync tokens as untrusted input (issue 42): any ``since`` is answered 200 or 400, never 500, never a hang.

The rule (docs/sync.md, "Token strings"): every field of a sync token holds a *sync position* spelt as
the serialiser spells it. A number is a whole number from 0 to ``2**63 - 1`` in ASCII digits, without
sign or leading zero; the room field is ``s<pos>`` or ``m<pos>~<id>.<pos>...`` whose writers are known
instance IDs, listed once each by increasing ID, each strictly ahead of the minimum; a topological
``t<topo>-<pos>`` is a position in one room's history, not a sync position. Anything else is a 400
whose message names ``since`` and the field.

First the parsers, directly: the core's (``RoomStreamToken.from_sync_field``, which reads a room field
with the core's ``RoomToken.parse``, the events plugin's parser too) accepts exactly the live room
tokens ``RoomToken.parse`` accepts. Then ``GET /sync`` (and the
plugin's ``GET /events``, which takes the same live room tokens as ``from``) over HTTP, on the
``events`` writer (``main``) and on a worker that replicates the events stream (``worker1``):
in-process hosts, real PostgreSQL.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine, Iterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from factstream import RoomToken
from factstream.host.app import Host
from factstream.plugin.manager import load_plugins
from factstream.sync import (
    MemoryInstanceIds,
    MultiWriterStreamToken,
    RoomStreamToken,
    StreamToken,
    SyncKey,
    SyncKeyKind,
    SyncKeyLayout,
    TokenError,
)
from factstream.sync.tokens import MAX_POSITION, parse_position
from factstream.testing import HostCluster

ALICE = "@alice:hs"
TOKENS = {"tok-alice": {"user": ALICE}}
BIG = 2**63  # one past the largest position
EXAMPLES = settings(max_examples=100, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)


# -- generated texts: near-valid room tokens and their mutations, and noise --------------------------------

NUMBERS = st.one_of(
    st.integers(0, 12).map(str),
    st.integers(0, 2**70).map(str),
    st.sampled_from(["", "-1", "-0", "00", "01", "+1", " 1", "1 ", "1\t", "\u0663", "0x1", "1_0", "x", "\x00"]),
    st.sampled_from([str(MAX_POSITION), str(BIG), str(10**30), "9" * 19, "9" * 20]),
)
#: Writer IDs: 1 to 3 are known to the parsers of this module (``known_names``), 999 is not.
IDS = st.one_of(st.sampled_from(["1", "2", "999"]), NUMBERS)


@st.composite
def clocks(draw: st.DrawFn) -> str:
    """``m<min>~<id>.<pos>...`` as the serialiser writes it (ids increasing, positions ahead), often broken."""
    minimum = draw(st.integers(0, 20))
    ids = sorted(draw(st.sets(st.sampled_from([1, 2, 3]), max_size=3)))
    entries = [f"{i}.{minimum + draw(st.integers(1, 5))}" for i in ids]
    text = "m" + "~".join([str(minimum), *entries])
    breakage = draw(st.sampled_from(["none", "none", "reverse", "duplicate", "at-minimum", "below", "trailing"]))
    if breakage == "reverse" and len(entries) > 1:
        text = "m" + "~".join([str(minimum), *reversed(entries)])
    elif breakage == "duplicate" and entries:
        text += "~" + entries[0]
    elif breakage in ("at-minimum", "below") and minimum > 0:
        at = minimum if breakage == "at-minimum" else minimum - 1
        text = "m" + "~".join([str(minimum), *entries, f"9.{at}"])
    elif breakage == "trailing":
        text += "~"
    return text


@st.composite
def free_clocks(draw: st.DrawFn) -> str:
    """``m`` tokens of arbitrary numbers and separators."""
    entries = draw(st.lists(st.tuples(IDS, st.sampled_from([".", "", ".."]), NUMBERS).map("".join), max_size=4))
    return "m" + "~".join([draw(NUMBERS), *entries]) + draw(st.sampled_from(["", "", "~"]))


ROOM_TEXTS = st.one_of(
    NUMBERS.map(lambda n: "s" + n),
    st.tuples(NUMBERS, NUMBERS).map(lambda t: f"t{t[0]}-{t[1]}"),
    clocks(),
    free_clocks(),
    st.text(alphabet="smtSM~.-+0123456789 x\x00\u0663", max_size=30),
    st.text(alphabet=st.characters(exclude_characters="_", exclude_categories=("Cs",)), max_size=20),
)


def known_names(instance_id: int) -> str:
    """IDs 1, 2 and 3 are writers ``w1``..``w3``; any other is unknown."""
    if instance_id in (1, 2, 3):
        return f"w{instance_id}"
    raise LookupError(instance_id)


def core_accepts(text: str) -> RoomStreamToken | None:
    try:
        return RoomStreamToken.from_sync_field(text, known_names, what="field 1 (room_key)")
    except TokenError as exc:
        assert str(exc).startswith("field 1 (room_key): "), exc
        return None


def room_token_accepts_live(text: str) -> RoomToken | None:
    """The room token's parser, for a live token whose writers are all known (as the core requires)."""
    try:
        token = RoomToken.parse(text)
    except TokenError:
        return None
    if not token.live or any(i not in (1, 2, 3) for i, _ in token.writers):
        return None
    return token


# -- the parsers -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("text", ["0", "1", "42", str(MAX_POSITION)])
def test_a_position_is_a_whole_number_from_zero_to_the_bigint_maximum(text):
    assert parse_position(text, "f") == int(text)


@pytest.mark.parametrize(
    "text", ["", "-1", "-0", "00", "01", "+1", " 1", "1 ", "\u0663", "1_0", "1.0", str(BIG), str(10**30), "9" * 400]
)
def test_anything_else_is_not_a_position(text):
    with pytest.raises(TokenError, match=r"^f: "):
        parse_position(text, "f")


@EXAMPLES
@given(ROOM_TEXTS)
def test_a_room_field_is_exactly_a_live_room_token_whose_writers_are_known(text):
    core, plugin = core_accepts(text), room_token_accepts_live(text)
    assert (core is None) == (plugin is None), (text, core, plugin)
    if core is not None and plugin is not None:
        assert core.topological is None
        assert core.stream == plugin.stream
        assert dict(core.instance_map) == {f"w{i}": p for i, p in plugin.writers}
        assert str(plugin) == text  # one spelling: what was accepted is what the serialiser writes
        assert core.serialize(lambda name: int(name[1:])) == text


@EXAMPLES
@given(ROOM_TEXTS)
def test_a_multi_writer_field_follows_the_same_rule_as_a_room_field(text):
    """``<pos>`` and ``m...`` in a multi-writer field are accepted exactly when ``s<pos>`` and ``m...``
    are in a room field: one rule for every position of a sync token."""
    if text.startswith("s") and not text.startswith("sm"):
        room_form, multi_form = text, text[1:]
    elif text.startswith("m"):
        room_form = multi_form = text
    else:
        return
    try:
        multi: MultiWriterStreamToken | None = MultiWriterStreamToken.from_sync_field(multi_form, known_names)
    except TokenError:
        multi = None
    room = core_accepts(room_form)
    assert (multi is None) == (room is None), (text, multi, room)
    if multi is not None and room is not None:
        assert (multi.stream, dict(multi.instance_map)) == (room.stream, dict(room.instance_map))


LAYOUT = SyncKeyLayout.of("to_device_key", SyncKey("room_key", SyncKeyKind.ROOM), "account_data_key")


def test_the_start_token_is_a_sync_position():
    ids = MemoryInstanceIds()
    start = StreamToken.start(LAYOUT)
    assert start.serialize(ids.id_for) == "0_s0_0"
    assert StreamToken.deserialize("0_s0_0", LAYOUT, ids.name_for) == start


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("1_t5-3_1", "field 2 (room_key): a topological room token 't5-3' is not a sync position"),
        ("0_s-5_0", "field 2 (room_key): invalid room token 's-5': the stream position is negative"),
        ("0_m5~_0", "field 2 (room_key): invalid room token 'm5~': an 'm' token lists at least one writer"),
        (
            "0_m5~1.3_0",
            "field 2 (room_key): invalid room token 'm5~1.3': writer 1 (instance 1) is at 3, not ahead of the minimum",
        ),
        (
            "0_m5~2.7~1.8_0",
            "field 2 (room_key): invalid room token 'm5~2.7~1.8': writer 2's instance ID 1 does not follow 2",
        ),
        ("-1_s0_0", "field 1 (to_device_key): expected an integer"),
        (f"0_s0_{BIG}", f"field 3 (account_data_key): {BIG} is out of range"),
        ("m5~_s0_0", "field 1 (to_device_key): an 'm' token lists at least one writer"),
    ],
)
def test_a_value_no_stream_can_be_at_is_refused_naming_the_field(text, message):
    with pytest.raises(TokenError) as info:
        StreamToken.deserialize(text, LAYOUT, MemoryInstanceIds({"w1": 1, "w2": 2}).name_for)
    assert str(info.value).startswith(message)


# -- over HTTP: the writer and a worker --------------------------------------------------------------------


@dataclass
class Cluster:
    """The events writer and a worker following its stream, with the instance IDs of both."""

    hosts: tuple[Host, Host]
    clients: tuple[httpx.AsyncClient, httpx.AsyncClient]
    main_id: int
    worker_id: int

    def __iter__(self) -> Iterator[tuple[Host, httpx.AsyncClient]]:
        return iter(zip(self.hosts, self.clients, strict=True))


@pytest.fixture
async def cluster(host_cluster: HostCluster) -> Cluster:
    if "events" not in load_plugins().registry.streams.names():
        pytest.skip("the bundled events plugin is not installed (uv sync --all-packages)")
    # A token ahead of a host is waited for at most 0.2 s, and so is a long poll.
    host_cluster.configure(http={"tokens": TOKENS, "catch_up_timeout_seconds": 0.2, "sync_timeout_max_seconds": 0.2})
    main = await host_cluster("main")
    worker = await host_cluster("worker1")
    await host_cluster.following(worker, "events")
    ids = main.sync.ids
    main_id, worker_id = await ids.get_id("main"), await ids.get_id("worker1")
    clients = (host_cluster.client(main, "tok-alice"), host_cluster.client(worker, "tok-alice"))
    return Cluster((main, worker), clients, main_id, worker_id)


def since_with(host: Host, **fields: str) -> str:
    """A ``since`` of ``host``'s layout: every field at the start but those given (by key name)."""
    layout = host.sync.layout
    return "_".join(fields.get(k.name, "s0" if k.kind is SyncKeyKind.ROOM else "0") for k in layout)


def field_of(host: Host, name: str) -> str:
    layout = host.sync.layout
    return f"field {layout.index(name) + 1} ({name})"


def int_key(host: Host) -> str:
    return next(k.name for k in host.sync.layout if k.kind is SyncKeyKind.INT)


async def get(client: httpx.AsyncClient, path: str, **params: str) -> httpx.Response:
    """One request with ``timeout=0``; it must be answered within 5 s (a hang fails here)."""
    return await asyncio.wait_for(client.get(path, params={**params, "timeout": "0"}), 5)


def bad_room_fields(main_id: int, worker_id: int) -> list[str]:
    low, high = sorted((main_id, worker_id))
    return [
        "t5-3",
        "t0-0",
        "t5--3",
        "s-5",
        "s-0",
        f"s{BIG}",
        f"s{10**30}",
        "s",
        "sx",
        "s+5",
        "s 5",
        "s5 ",
        "s05",
        "s\u0663",
        "S5",
        "5",
        "m",
        "m5",
        "m5~",
        "m-1~1.2",
        "m5~x.1",
        f"m5~{low}.",
        f"m5~{low}",
        f"m5~.{low}",
        f"m5~{low}.3",  # a listed writer at or below the minimum
        f"m5~{low}.5",
        "m5~999.7",  # no instance has ID 999
        f"m5~{high}.7~{low}.8",  # unsorted
        f"m5~{low}.7~{low}.8",  # duplicate
        f"m5~{low}.7~",
        f"m5~{low}.{BIG}",
        f"m5~{BIG}.7",
        "m0" + "".join(f"~{i}.1" for i in range(1, 70)),  # more writers than any token has
        "s" + "1" * 5000,
    ]


def good_room_fields(main_id: int, worker_id: int) -> list[str]:
    low, high = sorted((main_id, worker_id))
    return ["s0", "s1", f"s{MAX_POSITION}", f"m0~{main_id}.1", f"m0~{low}.1~{high}.2", f"m3~{low}.{MAX_POSITION}"]


BAD_INTS = ["-1", "-0", "01", "+1", " 1", "1.5", str(BIG), str(10**30), "m5~", "t5-3", "s1", "\u0663"]
GOOD_INTS = ["0", "1", str(MAX_POSITION)]


def refusal(response: httpx.Response, since: str) -> str | None:
    """What is wrong with the answer to a bad ``since`` (None: a 400 naming the parameter)."""
    if response.status_code != 400:
        return f"{since!r}: {response.status_code} {response.text[:200]}"
    body = response.json()
    if body["errcode"] != "M_INVALID_PARAM" or not body["error"].startswith(
        ("invalid sync token: since: ", "query parameter 'since' ")
    ):
        return f"{since!r}: {body}"
    return None


async def test_a_topological_room_token_in_since_is_a_400_naming_the_field_on_every_process(cluster):
    for host, client in cluster:
        response = await get(client, "/sync", since=since_with(host, room_key="t5-3"))
        assert response.status_code == 400, (host.instance_name, response.text)
        assert response.json() == {
            "errcode": "M_INVALID_PARAM",
            "error": f"invalid sync token: since: {field_of(host, 'room_key')}: a topological room token 't5-3'"
            " is not a sync position; give the next_batch of a /sync",
        }


async def test_every_malformed_room_field_is_a_400_naming_since_on_every_process(cluster):
    problems = []
    for host, client in cluster:
        for room in [*bad_room_fields(cluster.main_id, cluster.worker_id), ""]:
            since = since_with(host, room_key=room)
            response = await get(client, "/sync", since=since)
            if (problem := refusal(response, since)) is not None:
                problems.append(f"{host.instance_name} {problem}")
            elif f"since: {field_of(host, 'room_key')}: " not in response.json()["error"]:
                problems.append(f"{host.instance_name} {since!r}: the error does not name the field: {response.text}")
    assert problems == []


async def test_a_nul_in_since_is_a_400_naming_since_on_every_process(cluster):
    for host, client in cluster:
        since = since_with(host, room_key="s0\x00")
        assert refusal(await get(client, "/sync", since=since), since) is None


async def test_every_live_room_position_is_a_200_on_every_process(cluster):
    problems = []
    for host, client in cluster:
        service = host.sync
        for room in good_room_fields(cluster.main_id, cluster.worker_id):
            since = since_with(host, room_key=room)
            response = await get(client, "/sync", since=since)
            if response.status_code != 200:
                problems.append(f"{host.instance_name} {since!r}: {response.status_code} {response.text[:200]}")
            else:  # and what it answers is a sync token again
                await StreamToken.parse(response.json()["next_batch"], service.layout, service.ids)
    assert problems == []


async def test_an_integer_field_is_a_position_too_on_every_process(cluster):
    problems = []
    for host, client in cluster:
        key = int_key(host)
        for value in [*BAD_INTS, *GOOD_INTS]:
            since = since_with(host, **{key: value})
            response = await get(client, "/sync", since=since)
            if value in GOOD_INTS:
                if response.status_code != 200:
                    problems.append(f"{host.instance_name} {since!r}: {response.status_code} {response.text[:200]}")
            elif (problem := refusal(response, since)) is not None:
                problems.append(f"{host.instance_name} {problem}")
            elif f"since: {field_of(host, key)}: " not in response.json()["error"]:
                problems.append(f"{host.instance_name} {since!r}: the error does not name the field")
    assert problems == []


async def test_whole_tokens_that_are_no_sync_token_are_a_400_naming_since(cluster):
    problems = []
    for host, client in cluster:
        # "0_s0" + "_0" * 30: more fields than any layout (a token with fewer is an older layout's, and good)
        for since in ["_", "__", "0_s0" + "_0" * 30, "x" * 20_000, "0_s0_0" + "_0" * 5000, "1_t5-3_1", " 0_s0_0"]:
            if (problem := refusal(await get(client, "/sync", since=since), since)) is not None:
                problems.append(f"{host.instance_name} {problem}")
    assert problems == []


async def test_events_from_takes_exactly_the_live_room_tokens_sync_takes_on_every_process(cluster):
    """``GET /events?from=`` takes a live room token (the plugin's parser): the same tokens as ``/sync``'s
    room field are good and bad there, and a bad one is a 400 naming ``from``."""
    problems = []
    good_rooms = good_room_fields(cluster.main_id, cluster.worker_id)
    for host, client in cluster:
        for room in [*bad_room_fields(cluster.main_id, cluster.worker_id), *good_rooms]:
            response = await get(client, "/events", **{"from": room})
            good = room in good_rooms
            if response.status_code != (200 if good else 400):
                problems.append(
                    f"{host.instance_name} from={room[:60]!r}: {response.status_code} {response.text[:200]}"
                )
            elif not good and not response.json()["error"].startswith("from: "):
                problems.append(f"{host.instance_name} from={room[:60]!r}: {response.json()}")
    assert problems == []


def run_on_loop(
    loop: asyncio.AbstractEventLoop, check: Callable[[str], Coroutine[Any, Any, None]]
) -> Callable[[str], None]:
    """Hypothesis calls the test body synchronously (in a worker thread here): run each example on the
    test's own loop, where the hosts live."""

    def body(text: str) -> None:
        asyncio.run_coroutine_threadsafe(check(text), loop).result(30)

    return body


async def test_generated_room_fields_are_a_200_exactly_when_the_plugin_parser_takes_them(cluster):
    """On both processes: never a 500; a 400 naming ``since`` for every room field the events plugin's
    parser refuses as a live token with known writers, a 200 for every one it takes."""
    known = {cluster.main_id: "main", cluster.worker_id: "worker1"}

    async def check(room: str) -> None:
        for host, client in cluster:
            since = since_with(host, room_key=room)
            response = await get(client, "/sync", since=since)
            try:
                token = RoomToken.parse(room)
                good = token.live and all(i in known for i, _ in token.writers)
            except TokenError:
                good = False
            if good:
                assert response.status_code == 200, (host.instance_name, since, response.text)
            else:
                assert refusal(response, since) is None, (host.instance_name, since, response.text)

    loop = asyncio.get_running_loop()
    ids = st.sampled_from([str(cluster.main_id), str(cluster.worker_id), "999"])
    texts = st.one_of(
        ROOM_TEXTS, st.tuples(st.integers(0, 5), ids, st.integers(0, 9)).map(lambda t: f"m{t[0]}~{t[1]}.{t[2]}")
    )
    fuzz = EXAMPLES(given(texts)(run_on_loop(loop, check)))
    await asyncio.to_thread(fuzz)


async def test_generated_integer_fields_are_a_200_exactly_when_they_are_positions(cluster):
    async def check(value: str) -> None:
        for host, client in cluster:
            since = since_with(host, **{int_key(host): value})
            response = await get(client, "/sync", since=since)
            try:
                good = parse_position(value, "f") >= 0
            except TokenError:
                good = False
            if good:
                assert response.status_code == 200, (host.instance_name, since, response.text)
            else:
                assert refusal(response, since) is None, (host.instance_name, since, response.text)

    loop = asyncio.get_running_loop()
    texts = st.one_of(NUMBERS, st.integers(-(2**70), 2**70).map(str))
    fuzz = EXAMPLES(given(texts)(run_on_loop(loop, check)))
    await asyncio.to_thread(fuzz)
