"""What a remote batch is, whatever shape it comes in (issue 30, points 7, 8, 9 and 11).

* The empty state is a state: an event whose state before it is empty (a remote message whose
  prev_events are not held) gets a state group, is no outlier and no backward extremity once its
  successor arrives, and its state can be read.
* A new room's first batch may come in any order: its create event is found wherever it is.
* An ID twice in one batch: with other bytes the whole batch is refused (409, nothing stored), with the
  same bytes it is stored once.
* Relations and redaction targets as the room version reads them: ``m.relates_to`` is a relation only
  with a string ``rel_type`` and ``event_id``; a redaction's target is the top-level ``redacts`` before
  room version 11 and ``content.redacts`` from 11, on the wire and in storage.
"""

from __future__ import annotations

import itertools
from typing import Any

import httpx
from factstream_events.rules.eventid import content_hash
from factstream_events.rules.validate import check_event
from factstream_events.updates import events_updates
from hypothesis import given
from hypothesis import strategies as st

from factstream.host.app import Host
from tests.bundled.events.conftest import reads_of
from tests.bundled.events.remote_history import RemoteRoom
from tests.bundled.events.scenario import (
    BOB,
    MEMBER,
    REDACTION,
    Clients,
    RoomDriver,
    error_of,
    remote_body,
    table_counts,
)

ZED = "@zed:elsewhere"


async def post(client: Clients, room_id: str, events: list[Any], **extra: Any) -> httpx.Response:
    return await client("server").post(f"/rooms/{room_id}/remote_events", content=remote_body(events, **extra))


async def ok(client: Clients, room_id: str, events: list[Any], **extra: Any) -> dict[str, Any]:
    r = await post(client, room_id, events, **extra)
    assert r.status_code == 200, r.text
    return dict(r.json())


async def column(host: Host, sql: str, **params: Any) -> list[Any]:
    return [r[0] for r in await host.api.database().fetchall(sql, params)]


def chain(room_id: str, messages: int = 3) -> RemoteRoom:
    """create, zed's join, bob's join, ``messages`` messages: a remote room of version 10."""
    room = RemoteRoom(room_id)
    room.add("m.room.create", ZED, {"room_version": "10", "creator": ZED}, state_key="")
    room.add(MEMBER, ZED, {"membership": "join"}, state_key=ZED)
    room.add(MEMBER, BOB, {"membership": "join"}, state_key=BOB)
    for i in range(messages):
        room.add("m.room.message", ZED, {"msgtype": "m.text", "body": f"m{i}"})
    return room


# -- 7. the empty state is a state ----------------------------------------------------------------------------


async def assert_has_state(main: Host, room_id: str, event_id: str, expected: dict) -> None:
    [(group, outlier)] = await main.api.database().fetchall(
        "SELECT state_group, outlier FROM events WHERE event_id = %(e)s", {"e": event_id}
    )
    assert group is not None and outlier is False, event_id
    assert dict(await reads_of(main).state_ids(room_id, event_id)) == expected


async def test_an_event_after_the_empty_state_has_a_state_and_is_no_backward_extremity(main, client):
    for backfill, together in itertools.product((False, True), (False, True)):
        await empty_state_case(main, client, f"!gap{int(backfill)}{int(together)}:elsewhere", backfill, together)


async def empty_state_case(main: Host, client: Clients, room_id: str, backfill: bool, together: bool) -> None:
    """m1 and m2 follow m0, not held (apart or in one batch, normal or backfilled); then m3, then the rest."""
    room = chain(room_id, messages=4)
    create, zed_join, bob_join, m0, m1, m2, m3 = room.events
    first = [m1.event, m2.event] if together else [m1.event]
    # m1 and m2 follow m0, not held: the state before them is empty (the room's version is given)
    await ok(client, room.room_id, first, room_version="10", **({"backfill": True} if backfill else {}))
    if not together:
        await ok(client, room.room_id, [m2.event], **({"backfill": True} if backfill else {}))
    for m in (m1, m2):
        await assert_has_state(main, room.room_id, m.event_id, {})
    groups = await column(
        main,
        "SELECT count(DISTINCT state_group) FROM events WHERE event_id = ANY(%(ids)s)",
        ids=[m1.event_id, m2.event_id],
    )
    assert groups == [1]  # the room's one empty state
    backward = "SELECT event_id FROM event_backward_extremities WHERE room_id = %(r)s ORDER BY event_id"
    assert await column(main, backward, r=room.room_id) == [m0.event_id]
    # the successor arrives normally: m2 stops being an end, m0 stays the only gap
    await ok(client, room.room_id, [m3.event])
    assert await column(main, backward, r=room.room_id) == [m0.event_id]
    forward = "SELECT event_id FROM event_forward_extremities WHERE room_id = %(r)s"
    assert await column(main, forward, r=room.room_id) == [m3.event_id]
    await assert_has_state(main, room.room_id, m3.event_id, {})
    # the whole history, backfilled: no gap left
    await ok(client, room.room_id, [create.event, zed_join.event, bob_join.event, m0.event], backfill=True)
    assert await column(main, backward, r=room.room_id) == []
    await assert_has_state(main, room.room_id, m0.event_id, dict(room.state))


async def test_a_message_without_prev_events_and_a_state_event_after_it(main, client):
    room = chain("!bare:elsewhere", messages=0)
    lone = room.add("m.room.message", ZED, {"msgtype": "m.text", "body": "alone"}, prev=[], depth=7)
    topic = room.add("m.room.topic", ZED, {"topic": "t"}, state_key="", prev=[lone.event_id])
    await ok(client, room.room_id, [lone.event], room_version="10")
    await assert_has_state(main, room.room_id, lone.event_id, {})
    await ok(client, room.room_id, [topic.event])
    await assert_has_state(main, room.room_id, topic.event_id, {("m.room.topic", ""): topic.event_id})
    assert (
        await column(main, "SELECT event_id FROM event_backward_extremities WHERE room_id = %(r)s", r=room.room_id)
        == []
    )
    current = await reads_of(main).state_ids(room.room_id)
    assert dict(current) == {("m.room.topic", ""): topic.event_id}


# -- 8. a new room's first batch in any order -------------------------------------------------------------------


async def test_a_new_rooms_first_batch_may_come_in_any_order(main, client):
    for i, order in enumerate(itertools.permutations(range(4))):
        room = chain(f"!order{i}:elsewhere", messages=1)
        sent = [room.events[k] for k in order]
        answer = await ok(client, room.room_id, [b.event for b in sent])
        assert answer["stored"] == [b.event_id for b in room.events], order  # persisted create first
        assert dict(await reads_of(main).state_ids(room.room_id)) == room.state
        assert (await client(BOB).get(f"/rooms/{room.room_id}/event/{room.events[-1].event_id}")).status_code == 200


async def test_a_new_rooms_batch_whose_create_contradicts_the_version_given_is_refused(main, client):
    room = chain("!both:elsewhere", messages=1)
    before = await table_counts(main)
    r = await post(
        client, room.room_id, [room.events[-1].event, *(b.event for b in room.events[:-1])], room_version="9"
    )
    assert r.status_code == 400 and "room_version" in error_of(r), r.text
    assert await table_counts(main) == before
    await ok(client, room.room_id, [room.events[-1].event, *(b.event for b in room.events[:-1])], room_version="10")


# -- 9. duplicates inside one batch --------------------------------------------------------------------------------


def respaced(event: dict) -> dict:
    """The same event written with other bytes: ``remote_body`` writes each event as given, so a key order
    changes its bytes and not its ID."""
    return dict(reversed(list(event.items())))


async def test_an_id_twice_in_a_batch_with_other_bytes_refuses_the_whole_batch(main, client):
    room = chain("!dups:elsewhere", messages=2)
    create, zed_join, bob_join, m0, m1 = room.events
    await ok(client, room.room_id, [create.event, zed_join.event])
    before = await table_counts(main)
    tampered = dict(m0.event, content={"msgtype": "m.text", "body": "tampered"})
    cases = {
        "key order": ([bob_join.event, m0.event, respaced(m0.event)], None),
        "other content, ID given": (
            [bob_join.event, m0.event, m1.event, tampered],
            [None, m0.event_id, None, m0.event_id],
        ),
        "held event, then other bytes": ([zed_join.event, bob_join.event, respaced(zed_join.event)], None),
    }
    for name, (events, ids) in cases.items():
        r = await post(client, room.room_id, events, **({"event_ids": ids} if ids else {}))
        assert r.status_code == 409, (name, r.text)
        assert r.json()["errcode"] == "M_CONFLICT" and "twice" in error_of(r), r.text
        assert await table_counts(main) == before, name
    # a new room's first batch alike
    fresh = chain("!dups2:elsewhere", messages=1)
    r = await post(client, fresh.room_id, [b.event for b in fresh.events] + [respaced(fresh.events[1].event)])
    assert r.status_code == 409, r.text
    assert await table_counts(main) == before


async def test_an_id_twice_in_a_batch_with_the_same_bytes_is_stored_once(main, client):
    room = chain("!twice:elsewhere", messages=2)
    create, zed_join, bob_join, m0, m1 = room.events
    answer = await ok(
        client, room.room_id, [create.event, zed_join.event, bob_join.event, m0.event, m0.event, m1.event]
    )
    assert answer == {"stored": [b.event_id for b in room.events], "already_stored": []}
    assert await column(main, "SELECT count(*) FROM events WHERE event_id = %(e)s", e=m0.event_id) == [1]
    answer = await ok(client, room.room_id, [m1.event, m1.event])
    assert answer == {"stored": [], "already_stored": [m1.event_id]}


# -- 11. relations and redactions as the room version reads them -------------------------------------------------

TARGET = "$" + "t" * 43
RELATES = [
    ({"rel_type": "m.annotation", "event_id": TARGET, "key": "+"}, TARGET),
    ({"rel_type": "m.thread", "event_id": TARGET}, TARGET),
    ({"rel_type": "org.example.custom", "event_id": TARGET}, TARGET),
    ({"event_id": TARGET}, None),
    ({"m.in_reply_to": {"event_id": TARGET}}, None),
    ({"rel_type": 5, "event_id": TARGET}, None),
    ({"rel_type": None, "event_id": TARGET}, None),
    ({"rel_type": ["m.thread"], "event_id": TARGET}, None),
    ({"rel_type": "m.thread", "event_id": 5}, None),
    ({"rel_type": "m.thread"}, None),
    ("m.thread", None),
    ([TARGET], None),
]

_json = st.recursive(
    st.none() | st.booleans() | st.integers(-10, 10) | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=6,
)


@given(
    relates=st.one_of(
        _json,
        st.fixed_dictionaries(
            {}, optional={"rel_type": _json | st.text(max_size=8), "event_id": _json | st.just(TARGET)}
        ),
    )
)
def test_a_relation_needs_a_string_rel_type_and_event_id(relates: Any) -> None:
    event = {
        "room_id": "!r:hs", "type": "m.room.message", "sender": "@a:hs", "depth": 1, "origin_server_ts": 1,
        "prev_events": [], "content": {"msgtype": "m.text", "body": "b", "m.relates_to": relates},
    }  # fmt: skip
    is_relation = (
        isinstance(relates, dict)
        and isinstance(relates.get("rel_type"), str)
        and isinstance(relates.get("event_id"), str)
    )
    assert check_event(event).relates_to == (relates["event_id"] if is_relation else None)


async def wire_rows(main: Host) -> dict[str, tuple]:
    """The ``ev`` rows of the ``events`` stream, as a reader catching up reads them: event ID -> data."""
    rows, _, _ = await events_updates(main.api.database(), main.api.instance_name, 0, 10**9, 10_000)
    return {row.data[0]: row.data for _, row in rows if row.kind == "ev"}


async def test_relates_to_on_the_wire_and_in_storage_local_and_remote(main, client):
    local = await RoomDriver.create(client, BOB, preset="public_chat")
    room = chain("!rel:elsewhere", messages=0)
    await ok(client, room.room_id, [b.event for b in room.events])
    expected: dict[str, str | None] = {}
    backfilled: dict[str, str | None] = {}
    for i, (relates, want) in enumerate(RELATES):
        content = {"msgtype": "m.text", "body": f"r{i}", "m.relates_to": relates}
        expected[await local.send(BOB, "m.room.message", content)] = want
        remote = room.add("m.room.message", ZED, content)
        await ok(client, room.room_id, [remote.event])
        expected[remote.event_id] = want
        old = room.add("m.room.message", ZED, dict(content, body=f"old{i}"), prev=[], depth=1, append=False)
        await ok(client, room.room_id, [old.event], backfill=True)
        backfilled[old.event_id] = want
    stored = dict(
        await main.api.database().fetchall(
            "SELECT event_id, relates_to FROM events WHERE event_id = ANY(%(ids)s)", {"ids": [*expected, *backfilled]}
        )
    )
    assert stored == {**expected, **backfilled}
    wire = await wire_rows(main)
    assert {e: wire[e][5] for e in expected} == expected


def versioned_event(room_id: str, version: str, event_type: str, content: dict, prev: list[str], depth: int, **top):
    event = {
        "room_id": room_id, "type": event_type, "sender": ZED, "content": content, "prev_events": prev,
        "depth": depth, "origin_server_ts": 1_000 + depth, "auth_events": [], **top,
    }  # fmt: skip
    event["hashes"] = {"sha256": content_hash(event)}
    return event


#: How a redaction names its target: (top-level ``redacts``, ``content.redacts``) -> which of them counts,
#: per room version (``top``, ``content`` or None when none does).
NAMINGS = {"top only": ("a", None), "content only": (None, "a"), "both": ("a", "a"), "each another": ("a", "b")}


async def test_a_redactions_target_is_read_as_its_room_version_says(main, client):
    for version in [str(v) for v in range(1, 12)]:
        await redaction_case(main, client, version)


async def redaction_case(main: Host, client: Clients, version: str) -> None:
    """In a room of ``version``: one redaction per way of naming targets (:data:`NAMINGS`)."""
    room_id = f"!red{version}:elsewhere"
    events: list[dict] = []
    ids: list[str] = []

    def add(event_type: str, content: dict, state_key: str | None = None, **top: Any) -> str:
        extra = {"state_key": state_key} if state_key is not None else {}
        event = versioned_event(room_id, version, event_type, content, ids[-1:], len(ids) + 1, **extra, **top)
        event_id = f"$v{version}-{len(ids)}:elsewhere"
        events.append(event)
        ids.append(event_id)
        return event_id

    create_content = {"room_version": version} | ({} if version == "11" else {"creator": ZED})
    add("m.room.create", create_content, "")
    add(MEMBER, {"membership": "join"}, ZED)
    add(MEMBER, {"membership": "join"}, BOB)
    expected: dict[str, str | None] = {}
    redactions: list[str] = []
    for name, (top, inside) in NAMINGS.items():
        targets = {k: add("m.room.message", {"msgtype": "m.text", "body": f"{name} {k}"}) for k in "ab"}
        content = {"reason": name} | ({"redacts": targets[inside]} if inside else {})
        redaction = add(REDACTION, content, **({"redacts": targets[top]} if top else {}))
        redactions.append(redaction)
        named = inside if version == "11" else top
        expected[redaction] = targets[named] if named else None
        for k, target in targets.items():
            expected[target] = redaction if k == named else None
    await ok(client, room_id, events, event_ids=ids)
    rows = dict(
        await main.api.database().fetchall(
            "SELECT event_id, CASE WHEN type = %(red)s THEN redacts ELSE redacted_by END FROM events"
            " WHERE event_id = ANY(%(ids)s)",
            {"ids": list(expected), "red": REDACTION},
        )
    )
    assert rows == expected, version
    table = dict(
        await main.api.database().fetchall(
            "SELECT event_id, redacts FROM redactions WHERE room_id = %(r)s", {"r": room_id}
        )
    )
    assert table == {r: expected[r] for r in redactions if expected[r] is not None}
    wire = await wire_rows(main)
    assert {r: wire[r][4] for r in redactions} == {r: expected[r] for r in redactions}
    for event_id, redacted_by in expected.items():
        if event_id in redactions:
            continue
        served = (await client(BOB).get(f"/rooms/{room_id}/event/{event_id}")).json()
        assert ("body" in served["content"]) == (redacted_by is None), (version, event_id, served)


async def test_an_empty_batch_stores_nothing_and_needs_no_room_version(main: Host, client: Clients) -> None:
    """An empty batch is a no-op for a room held or not: nothing to version, nothing stored."""
    before = await table_counts(main)
    for room_id in ("!never:elsewhere", "!never2:elsewhere"):
        assert await ok(client, room_id, []) == {"stored": [], "already_stored": []}
    assert await table_counts(main) == before
