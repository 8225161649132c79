"""What a remote batch cannot do to a room's local users, whatever a writer forwards from another server.

* An event at the deepest depth canonical JSON holds does not freeze the room: a local event after it
  takes that depth (the reference caps a new event's depth the same way).
* A room has one create event: a second one is refused, in the room's first batch or later.
* A cycle across batches (IDs given beside events) cannot leave a room without latest events, which
  would make the next local event start the room's state again from nothing.
"""

from __future__ import annotations

from typing import Any

import httpx
import pytest
from factstream_events.rules.eventid import content_hash, event_id_for

from tests.bundled.events.scenario import BOB, MEMBER, Clients, table_counts

ZED = "@zed:elsewhere"
MAX_SAFE = 2**53 - 1


def make(room_id: str, version: str, event_type: str, content: dict[str, Any], prev: list[str], depth: int,
         *, sender: str = ZED, state_key: str | None = None) -> tuple[dict[str, Any], str]:  # fmt: skip
    """A complete remote event of ``version`` and its ID (its reference hash, or one made up where
    the hash cannot be computed: a depth beyond canonical JSON in versions before 6)."""
    event: dict[str, Any] = {"room_id": room_id, "type": event_type, "sender": sender, "content": content}
    event |= {"prev_events": prev, "depth": depth, "origin_server_ts": 1, "auth_events": []}
    if state_key is not None:
        event["state_key"] = state_key
    if depth > MAX_SAFE:
        return event, f"$deep{len(prev)}{depth}"
    event["hashes"] = {"sha256": content_hash(event)}
    return event, event_id_for(event, version)


def public_room(room_id: str, version: str) -> tuple[list[dict[str, Any]], list[str]]:
    """A remote room where zed (100) and bob (a local user) are joined: its events and their IDs."""
    events: list[dict[str, Any]] = []
    ids: list[str] = []
    for event_type, content, key in (
        ("m.room.create", {"room_version": version, "creator": ZED}, ""),
        (MEMBER, {"membership": "join"}, ZED),
        ("m.room.power_levels", {"users": {ZED: 100}}, ""),
        ("m.room.join_rules", {"join_rule": "public"}, ""),
        (MEMBER, {"membership": "join"}, BOB),
    ):
        event, event_id = make(room_id, version, event_type, content, ids[-1:], len(ids) + 1,
                               sender=BOB if key == BOB else ZED, state_key=key)  # fmt: skip
        events.append(event)
        ids.append(event_id)
    return events, ids


async def post(client: Clients, room_id: str, events: list[Any], **extra: Any) -> httpx.Response:
    return await client("server").post(f"/rooms/{room_id}/remote_events", json={"events": events, **extra})


async def send(client: Clients, room_id: str, body: str) -> httpx.Response:
    content = {"msgtype": "m.text", "body": body}
    return await client(BOB).put(f"/rooms/{room_id}/send/m.room.message/{body}", json=content)


@pytest.mark.parametrize(("version", "depth"), [("10", MAX_SAFE), ("5", MAX_SAFE), ("5", 2**63 - 1)])
async def test_an_event_at_the_deepest_depth_does_not_freeze_the_room(main, client, version, depth):
    room_id = f"!deep{version}{depth % 1000}:elsewhere"
    events, ids = public_room(room_id, version)
    r = await post(client, room_id, events)
    assert r.status_code == 200, r.text
    deep, deep_id = make(room_id, version, "m.room.message", {"msgtype": "m.text", "body": "deep"}, ids[-1:], depth)
    r = await post(client, room_id, [deep], event_ids=[deep_id])
    assert r.status_code == 200, r.text
    for body in ("after", "and-after"):
        r = await send(client, room_id, body)
        assert r.status_code == 200, r.text
        raw = await client("server").get(f"/rooms/{room_id}/event/{r.json()['event_id']}", params={"raw": "true"})
        assert raw.json()["depth"] == MAX_SAFE


async def test_a_room_has_one_create_event(main, client):
    """A second create event (its own or another's content, after the room's events or without
    prev_events, normal or as an outlier, in the room's first batch or later) is refused naming the
    event, and nothing of its batch is stored: it would replace the room's creator and version in its
    state. The same create again is only already stored."""
    room_id = "!creates:elsewhere"
    events, ids = public_room(room_id, "10")
    other = {"room_version": "10", "creator": BOB}
    later, _ = make(room_id, "10", "m.room.create", other, ids[-1:], 9, state_key="")
    rootless, _ = make(room_id, "10", "m.room.create", other, [], 1, state_key="")
    with_prev, _ = make(
        room_id, "10", "m.room.create", {"room_version": "10", "creator": ZED}, ids[:1], 2, state_key=""
    )
    # in the room's first batch: a second create, or the only one with prev_events
    for batch, field in (([*events, rootless], "events[5].type"), ([with_prev, *events[1:]], "events[0].prev_events")):
        r = await post(client, room_id, batch)
        assert r.status_code == 400 and r.json()["error"].startswith(field), r.text
    counts = await table_counts(main)
    assert counts["rooms"] == 0 and counts["events"] == 0, counts
    r = await post(client, room_id, events)
    assert r.status_code == 200, r.text
    before = await table_counts(main)
    message, _ = make(room_id, "10", "m.room.message", {"msgtype": "m.text", "body": "x"}, ids[-1:], 9)
    for batch, extra in (([later], {}), ([message, rootless], {}), ([rootless], {"outlier": True})):
        r = await post(client, room_id, batch, **extra)
        assert r.status_code == 400 and "already has a create event" in r.json()["error"], r.text
    assert await table_counts(main) == before
    r = await post(client, room_id, events[:1], outlier=True)
    assert r.status_code == 200 and r.json()["already_stored"] == ids[:1], r.text
    state = await client("server").get(f"/rooms/{room_id}/state", params={"server": "true"})
    assert [e["content"]["creator"] for e in state.json() if e["type"] == "m.room.create"] == [ZED]


async def test_a_cycle_across_batches_cannot_leave_the_room_without_latest_events(main, client):
    """IDs given beside events (or chosen inside them, room versions 1 and 2) can make a cycle across
    batches: ``a`` follows the room's latest event and ``b`` (not held), then ``b`` follows ``a``. Stored,
    ``b`` would replace ``a`` as the room's latest event without being one (``a`` names it): the room
    would have none, and the next local event, with no prev_events, would take the empty state as the
    room's. The batch that closes the cycle is refused and nothing of it is stored."""
    room_id = "!cycle:elsewhere"
    events, ids = public_room(room_id, "10")
    r = await post(client, room_id, events)
    assert r.status_code == 200, r.text
    a, _ = make(room_id, "10", "m.room.message", {"msgtype": "m.text", "body": "a"}, ["$b", ids[-1]], 9)
    b, _ = make(room_id, "10", "m.room.message", {"msgtype": "m.text", "body": "b"}, ["$a"], 10)
    r = await post(client, room_id, [a], event_ids=["$a"])
    assert r.status_code == 200, r.text
    before = await table_counts(main)
    r = await post(client, room_id, [b], event_ids=["$b"])
    assert r.status_code == 400 and r.json()["error"].startswith("events: the batch would leave room"), r.text
    assert await table_counts(main) == before
    r = await send(client, room_id, "after")
    assert r.status_code == 200, r.text
    state = await client(BOB).get(f"/rooms/{room_id}/state")
    assert {(e["type"], e["state_key"]) for e in state.json()} == {
        ("m.room.create", ""),
        ("m.room.power_levels", ""),
        ("m.room.join_rules", ""),
        (MEMBER, ZED),
        (MEMBER, BOB),
    }
