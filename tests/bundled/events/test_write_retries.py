"""The write path's second attempts and what its one statement answers for itself.

A batch's writes and its COMMIT go in one round trip, so whatever must undo a batch fails its
statement: a local batch written without looking first that meets a held event (persisted again,
looking first), a planned state already stored (persisted again, group by group), a transaction ID
claimed by a concurrent request (the first request's event is the answer). An event redacted before it
arrives is redacted by the insert itself, on the local path as on the remote one.
"""

from __future__ import annotations

import asyncio
import json

from factstream_events.rules.validate import MEMBER, REDACTION, check_event
from factstream_events.shared.rows import STREAM, EventsRow
from factstream_events.write.create import LocalWrite
from factstream_events.write.persist import NewEvent

from factstream.host.app import Host
from tests.bundled.events.conftest import reads_of, store_of
from tests.bundled.events.scenario import post_remote, remote_event

BOB = "@bob:hs"


async def _count(host: Host, sql: str, **params: object) -> int:
    rows = await host.api.database().fetchall(sql, params)
    return int(rows[0][0])


async def _stored(host: Host, event_id: str) -> NewEvent:
    rows = await host.api.database().fetchall("SELECT json FROM event_json WHERE event_id = %(e)s", {"e": event_id})
    raw = bytes(rows[0][0])
    event = json.loads(raw)
    return NewEvent(event_id, raw, event, check_event(event))


async def test_a_local_batch_meeting_a_held_event_is_persisted_again_and_stores_nothing_twice(main):
    store = store_of(main)
    room = await store.create_room("@alice:hs", preset="public_chat")
    first = await store.send(room, "@alice:hs", "m.room.message", {"msgtype": "m.text", "body": "once"})
    second = await store.send(room, "@alice:hs", "m.room.message", {"msgtype": "m.text", "body": "then"})
    held = await _stored(main, first)  # not a forward extremity: only the database knows it is held
    events = await _count(main, "SELECT count(*) FROM events WHERE room_id = %(r)s", r=room)
    writer = main.api.stream(STREAM, EventsRow)
    token = writer.current_token()

    outcome = await store.persister.persist_local(room, LocalWrite(events=(held,)))

    assert outcome.stored == [] and outcome.duplicates == [first]
    assert await _count(main, "SELECT count(*) FROM events WHERE room_id = %(r)s", r=room) == events
    # the room still takes writes, after the event it holds
    after = await store.send(room, "@alice:hs", "m.room.message", {"msgtype": "m.text", "body": "after"})
    assert writer.current_token() > token
    edges = await main.api.database().fetchall(
        "SELECT prev_event_id FROM event_edges WHERE event_id = %(e)s", {"e": after}
    )
    assert edges == [(second,)]


async def test_a_state_already_stored_is_reused_not_stored_again(main, client):
    """Two branches (one sets the name, one the topic) merged twice, by two batches: the second merge
    plans the resolved state as new, the room holds it already (the first merge stored it), so that
    batch is persisted again and reuses the stored group."""
    room_id = "!merged-twice:elsewhere"
    zed = "@zed:elsewhere"
    create = remote_event(room_id, "m.room.create", zed, {"room_version": "10"}, [], 1, state_key="")
    join = remote_event(room_id, MEMBER, zed, {"membership": "join"}, [create[1]], 2, state_key=zed)
    name = remote_event(room_id, "m.room.name", zed, {"name": "n"}, [join[1]], 3, state_key="")
    topic = remote_event(room_id, "m.room.topic", zed, {"topic": "t"}, [join[1]], 3, state_key="")
    await post_remote(client, room_id, [create[0], join[0], name[0], topic[0]])
    first = remote_event(room_id, "m.room.message", zed, {"body": "first merge"}, [name[1], topic[1]], 4)
    await post_remote(client, room_id, [first[0]])
    groups = await _count(main, "SELECT count(*) FROM state_groups WHERE room_id = %(r)s", r=room_id)

    second = remote_event(room_id, "m.room.message", zed, {"body": "second merge"}, [name[1], topic[1]], 4)
    await post_remote(client, room_id, [second[0]])

    rows = dict(
        await main.api.database().fetchall(
            "SELECT event_id, state_group FROM events WHERE room_id = %(r)s", {"r": room_id}
        )
    )
    assert rows[second[1]] == rows[first[1]]
    assert len({rows[name[1]], rows[topic[1]], rows[first[1]]}) == 3
    assert await _count(main, "SELECT count(*) FROM state_groups WHERE room_id = %(r)s", r=room_id) == groups
    state = await reads_of(main).state_ids(room_id, at=second[1])
    assert state[("m.room.name", "")] == name[1] and state[("m.room.topic", "")] == topic[1]
    # the room goes on: an event after both merges
    last = remote_event(room_id, "m.room.message", zed, {"body": "after"}, [first[1], second[1]], 5)
    assert (await post_remote(client, room_id, [last[0]]))["stored"] == [last[1]]


async def test_one_transaction_id_sent_twice_at_once_stores_one_event(main):
    store = store_of(main)
    room = await store.create_room("@alice:hs", preset="public_chat")
    before = await _count(main, "SELECT count(*) FROM events WHERE room_id = %(r)s", r=room)

    sends = [
        store.send(room, "@alice:hs", "m.room.message", {"msgtype": "m.text", "body": "once only"}, txn_id="same")
        for _ in range(4)
    ]
    got = await asyncio.gather(*sends)

    assert len(set(got)) == 1
    assert await _count(main, "SELECT count(*) FROM events WHERE room_id = %(r)s", r=room) == before + 1
    claims = await main.api.database().fetchall("SELECT event_id FROM event_txn_ids WHERE txn_id = 'send/same'")
    assert claims == [(got[0],)]


async def test_a_local_event_redacted_before_it_arrives_is_redacted_by_its_insert(main, client):
    """The redaction of an event not yet held is stored first; when the event is then written through the
    local path (which does not look first), it is stored redacted by that redaction."""
    room_id = "!early-local:elsewhere"
    zed = "@zed:elsewhere"
    create = remote_event(room_id, "m.room.create", zed, {"room_version": "10"}, [], 1, state_key="")
    zed_join = remote_event(room_id, MEMBER, zed, {"membership": "join"}, [create[1]], 2, state_key=zed)
    bob_join = remote_event(room_id, MEMBER, BOB, {"membership": "join"}, [zed_join[1]], 3, state_key=BOB)
    await post_remote(client, room_id, [create[0], zed_join[0], bob_join[0]])
    target = remote_event(room_id, "m.room.message", zed, {"body": "to be redacted"}, [bob_join[1]], 4)
    redaction = remote_event(room_id, REDACTION, zed, {"reason": "early"}, [target[1]], 5, redacts=target[1])
    await post_remote(client, room_id, [redaction[0]])

    raw = json.dumps(target[0]).encode()
    new = NewEvent(target[1], raw, target[0], check_event(target[0]))

    outcome = await store_of(main).persister.persist_local(room_id, LocalWrite(events=(new,)))

    assert outcome.stored == [target[1]]
    rows = await main.api.database().fetchall("SELECT redacted_by FROM events WHERE event_id = %(e)s", {"e": target[1]})
    assert rows == [(redaction[1],)]
    r = await client(BOB).get(f"/rooms/{room_id}/event/{target[1]}")
    assert r.status_code == 200, r.text
    assert r.json()["content"] == {}
    assert r.json()["unsigned"]["redacted_because"]["event_id"] == redaction[1]
