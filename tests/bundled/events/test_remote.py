"""Remote events through POST /rooms/{room_id}/remote_events: stored as received, idempotent, with
the graph's ends, outliers and backfill."""

from __future__ import annotations

import hashlib
import json

from factstream_events.rules.canonical import canonical_json
from factstream_events.rules.eventid import content_hash, event_id_for

from tests.bundled.events.conftest import reads_of

ROOM = "!remote:elsewhere"


def make(event_type, sender, content, prev, depth, state_key=None, ts=1_000):
    event = {
        "room_id": ROOM,
        "type": event_type,
        "sender": sender,
        "content": content,
        "prev_events": prev,
        "depth": depth,
        "origin_server_ts": ts + depth,
        "auth_events": [],
    }
    if state_key is not None:
        event["state_key"] = state_key
    event["hashes"] = {"sha256": content_hash(event)}
    return event, event_id_for(event, "10")


def history():
    create, c = make("m.room.create", "@zed:elsewhere", {"room_version": "10"}, [], 1, "")
    join, j = make("m.room.member", "@zed:elsewhere", {"membership": "join"}, [c], 2, "@zed:elsewhere")
    msgs = []
    prev = j
    for i in range(3):
        m, prev = make("m.room.message", "@zed:elsewhere", {"body": f"m{i}"}, [prev], 3 + i)
        msgs.append((m, prev))
    return [(create, c), (join, j), *msgs]


def body(events, **extra):
    """A batch body whose events are written with their own spacing and key order (not canonical)."""
    parts = []
    for event in events:
        text = json.dumps(event, indent=1, sort_keys=False, ensure_ascii=True)
        parts.append(text)
    return (
        '{"events": [' + ", ".join(parts) + "]" + "".join(f', "{k}": {json.dumps(v)}' for k, v in extra.items()) + "}"
    ).encode()


async def test_remote_batch_is_stored_byte_for_byte_and_ids_follow_the_reference_hash(main, client):
    server = client("server")
    events = history()
    raw = body([e for e, _ in events])
    r = await server.post(f"/rooms/{ROOM}/remote_events", content=raw)
    assert r.status_code == 200, r.text
    assert r.json()["stored"] == [i for _, i in events]
    texts = [json.dumps(e, indent=1, ensure_ascii=True).encode() for e, _ in events]
    for (event, event_id), text in zip(events, texts, strict=True):
        got = await server.get(f"/rooms/{ROOM}/event/{event_id}", params={"raw": "true"})
        assert hashlib.sha256(got.content).hexdigest() == hashlib.sha256(text).hexdigest()
        assert got.content != canonical_json(event)
    # the same bytes again: nothing new; other bytes under the same ID: 409, the first kept
    r = await server.post(f"/rooms/{ROOM}/remote_events", content=raw)
    assert r.json() == {"stored": [], "already_stored": [i for _, i in events]}
    changed = dict(events[-1][0], content={"body": "tampered"})
    r = await server.post(f"/rooms/{ROOM}/remote_events", content=body([changed], event_ids=[events[-1][1]]))
    assert r.status_code == 409, r.text


async def test_missing_prev_events_become_backward_extremities(main, client):
    server = client("server")
    events = history()
    # only the last message, whose prev is unknown: it becomes a backward extremity
    r = await server.post(f"/rooms/{ROOM}/remote_events", content=body([events[-1][0]], room_version="10"))
    assert r.status_code == 200, r.text
    rows = await main.api.database().fetchall(
        "SELECT event_id FROM event_backward_extremities WHERE room_id = %(r)s", {"r": ROOM}
    )
    assert [r[0] for r in rows] == [events[-2][1]]
    # backfill the rest: negative stream orderings, and the gap closes
    r = await server.post(f"/rooms/{ROOM}/remote_events", content=body([e for e, _ in events[:-1]], backfill=True))
    assert r.status_code == 200, r.text
    orderings = dict(
        await main.api.database().fetchall(
            "SELECT event_id, stream_ordering FROM events WHERE room_id = %(r)s", {"r": ROOM}
        )
    )
    assert all(orderings[i] < 0 for _, i in events[:-1]) and orderings[events[-1][1]] > 0
    rows = await main.api.database().fetchall(
        "SELECT event_id FROM event_backward_extremities WHERE room_id = %(r)s", {"r": ROOM}
    )
    assert rows == []
    walk = await server.get(f"/rooms/{ROOM}/backfill", params={"v": events[-1][1], "limit": 10})
    assert [json.loads(json.dumps(p))["depth"] for p in walk.json()["pdus"]] == [5, 4, 3, 2, 1]


async def test_outlier_then_normal_keeps_its_ordering_and_enters_the_stream_again(main, client):
    server = client("server")
    events = history()
    first = await server.post(f"/rooms/{ROOM}/remote_events", content=body([e for e, _ in events[:2]]))
    assert first.status_code == 200, first.text
    msg, msg_id = events[2]
    r = await server.post(f"/rooms/{ROOM}/remote_events", content=body([msg], outlier=True))
    assert r.status_code == 200, r.text
    [(before, outlier)] = await main.api.database().fetchall(
        "SELECT stream_ordering, outlier FROM events WHERE event_id = %(e)s", {"e": msg_id}
    )
    assert outlier is True
    r = await server.post(f"/rooms/{ROOM}/remote_events", content=body([msg]))
    assert r.json()["stored"] == [msg_id]
    [(after, outlier)] = await main.api.database().fetchall(
        "SELECT stream_ordering, outlier FROM events WHERE event_id = %(e)s", {"e": msg_id}
    )
    assert (after, outlier) == (before, False)
    ex = await main.api.database().fetchall(
        "SELECT stream_id FROM ex_outlier_stream WHERE event_id = %(e)s", {"e": msg_id}
    )
    assert len(ex) == 1 and ex[0][0] > before
    state = await reads_of(main).state_ids(ROOM, msg_id)
    assert state[("m.room.member", "@zed:elsewhere")] == events[1][1]


async def test_bad_batches_are_refused_naming_the_field_and_store_nothing(main, client):
    server = client("server")
    events = history()
    good = [e for e, _ in events]
    cases = {
        b"not json": "M_NOT_JSON",
        b'{"events": [1]}': "M_BAD_JSON",
        body([dict(good[0], depth=-1)]): "depth",
        body([{k: v for k, v in good[0].items() if k != "type"}]): "type",
        body([dict(good[0], sender=5)]): "sender",
        body([dict(good[0], content={"x": "a\u0000b"})]): "NUL",
    }
    for raw, expected in cases.items():
        r = await server.post(f"/rooms/{ROOM}/remote_events", content=raw)
        assert 400 <= r.status_code < 500, (raw[:60], r.text)
        assert expected in r.text, (raw[:60], r.text)
    big = dict(good[0], content={"pad": "x" * 70_000})
    r = await server.post(f"/rooms/{ROOM}/remote_events", content=body([big]))
    assert r.status_code == 400 and "65536" in r.text.replace(",", ""), r.text
    rows = await main.api.database().fetchall("SELECT count(*) FROM events")
    assert rows == [(0,)]
    r = await client("@alice:hs").post(f"/rooms/{ROOM}/remote_events", content=body(good))
    assert r.status_code == 403


async def test_a_batch_without_a_version_needs_a_held_room_and_then_uses_its_version(main, client):
    server = client("server")
    events = history()
    # not held, no create event in the batch and no version beside it: nothing is stored
    r = await server.post(f"/rooms/{ROOM}/remote_events", content=body([events[-1][0]]))
    assert r.status_code == 400 and "room_version" in r.text, r.text
    rows = await main.api.database().fetchall("SELECT count(*) FROM rooms WHERE room_id = %(r)s", {"r": ROOM})
    assert rows[0][0] == 0
    # once the create event made the room, later batches take its version (computed IDs match)
    first = await server.post(f"/rooms/{ROOM}/remote_events", content=body([e for e, _ in events[:2]]))
    assert first.status_code == 200, first.text
    for event, event_id in events[2:]:
        r = await server.post(f"/rooms/{ROOM}/remote_events", content=body([event]))
        assert r.status_code == 200 and r.json()["stored"] == [event_id], r.text
