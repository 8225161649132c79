"""The per-user reads: what is new since a token and the newest events of the most recent rooms,
through the Python API and ``GET /events``, ``GET /recent``."""

from __future__ import annotations

import json

from tests.bundled.events.conftest import store_of
from tests.bundled.events.test_remote import body, make


def ids(events):
    return [json.loads(e)["event_id"] for e in events]


async def test_new_events_since_a_token(main, client):
    store = store_of(main)
    timeline = store.timeline
    lobby = await store.create_room("@alice:hs", preset="public_chat")
    await store.change_membership(lobby, "@bob:hs", "@bob:hs", "join")
    elsewhere = await store.create_room("@alice:hs", preset="public_chat")  # bob never joins
    start = (await timeline.new_events("@bob:hs", None)).next

    sent = [
        await store.send(lobby, "@alice:hs", "m.room.message", {"msgtype": "m.text", "body": f"m{i}"}) for i in range(3)
    ]
    await store.send(elsewhere, "@alice:hs", "m.room.message", {"msgtype": "m.text", "body": "not for bob"})
    private = await store.create_room("@alice:hs", invite=["@bob:hs"])

    got = await timeline.new_events("@bob:hs", start)
    assert [r.room_id for r in got.rooms] == [lobby]
    assert ids(got.rooms[0].events) == sent  # oldest first
    assert not got.rooms[0].limited
    assert got.rooms[0].membership == "join"
    invite = [json.loads(e) for e in got.memberships]
    assert [(e["room_id"], e["content"]["membership"]) for e in invite] == [(private, "invite")]
    assert all(json.loads(e)["unsigned"]["membership"] == "join" for e in got.rooms[0].events)

    # over HTTP, the same answer
    r = await client("@bob:hs").get("/events", params={"from": start})
    assert r.status_code == 200, r.text
    answer = r.json()
    assert answer["next"] == got.next
    assert [e["event_id"] for e in answer["rooms"][lobby]["events"]] == sent
    assert [e["room_id"] for e in answer["memberships"]] == [private]

    # nothing changed since: answered by the change caches, without reading the database
    before = (timeline.answered_from_caches, timeline.read_database)
    await store.send(elsewhere, "@alice:hs", "m.room.message", {"msgtype": "m.text", "body": "still not for bob"})
    again = await timeline.new_events("@bob:hs", got.next)
    assert again.rooms == [] and again.memberships == []
    assert (timeline.answered_from_caches, timeline.read_database) == (before[0] + 1, before[1])
    # and a change in one of his rooms is found again
    later = await store.send(lobby, "@alice:hs", "m.room.message", {"msgtype": "m.text", "body": "new"})
    found = await timeline.new_events("@bob:hs", got.next)
    assert [ids(r.events) for r in found.rooms] == [[later]]
    assert timeline.read_database == before[1] + 1


async def test_limited_timeline_pages_back_from_prev_batch(main, client):
    store = store_of(main)
    room = await store.create_room("@alice:hs", preset="public_chat")
    start = (await store.timeline.new_events("@alice:hs", None)).next
    sent = [
        await store.send(room, "@alice:hs", "m.room.message", {"msgtype": "m.text", "body": f"m{i}"}) for i in range(15)
    ]
    got = await store.timeline.new_events("@alice:hs", start, limit=10)
    (timeline,) = got.rooms
    assert timeline.limited
    assert ids(timeline.events) == sent[5:]
    r = await client("@alice:hs").get(
        f"/rooms/{room}/messages", params={"from": timeline.prev_batch, "to": start, "limit": 100}
    )
    assert r.status_code == 200, r.text
    assert [e["event_id"] for e in r.json()["chunk"]] == sent[:5][::-1]


async def test_leave_kick_and_ban_end_the_timeline_at_the_leave(main):
    store = store_of(main)
    timeline = store.timeline
    rooms = [await store.create_room("@alice:hs", preset="public_chat") for _ in range(3)]
    for room in rooms:
        await store.change_membership(room, "@bob:hs", "@bob:hs", "join")
    start = (await timeline.new_events("@bob:hs", None)).next
    before = {
        room: await store.send(room, "@alice:hs", "m.room.message", {"msgtype": "m.text", "body": "before"})
        for room in rooms
    }
    leaves = {
        rooms[0]: await store.change_membership(rooms[0], "@bob:hs", "@bob:hs", "leave"),
        rooms[1]: await store.change_membership(rooms[1], "@alice:hs", "@bob:hs", "leave"),  # kick
        rooms[2]: await store.change_membership(rooms[2], "@alice:hs", "@bob:hs", "ban"),
    }
    for room in rooms:
        await store.send(room, "@alice:hs", "m.room.message", {"msgtype": "m.text", "body": "after bob went"})
    got = await timeline.new_events("@bob:hs", start)
    by_room = {r.room_id: r for r in got.rooms}
    assert set(by_room) == set(rooms)
    for room in rooms:
        assert ids(by_room[room].events) == [before[room], leaves[room]]
    assert [by_room[r].membership for r in rooms] == ["leave", "leave", "ban"]
    assert sorted(ids(got.memberships)) == sorted(leaves.values())
    # after the leave, nothing more from those rooms
    more = [
        await store.send(room, "@alice:hs", "m.room.message", {"msgtype": "m.text", "body": "later"}) for room in rooms
    ]
    assert more
    assert (await timeline.new_events("@bob:hs", got.next)).rooms == []


async def test_joined_visibility_hides_history_before_the_join_in_new_events(main):
    store = store_of(main)
    room = await store.create_room("@alice:hs", preset="public_chat", history_visibility="joined")
    start = (await store.timeline.new_events("@bob:hs", None)).next
    hidden = await store.send(room, "@alice:hs", "m.room.message", {"msgtype": "m.text", "body": "before bob"})
    join = await store.change_membership(room, "@bob:hs", "@bob:hs", "join")
    shown = await store.send(room, "@alice:hs", "m.room.message", {"msgtype": "m.text", "body": "after bob"})
    got = await store.timeline.new_events("@bob:hs", start)
    (timeline,) = got.rooms
    assert ids(timeline.events) == [join, shown]
    assert hidden not in ids(timeline.events)


async def test_backfilled_events_are_never_new(main, client):
    store = store_of(main)
    server = client("server")
    room = "!remote:elsewhere"
    create, c = make("m.room.create", "@zed:elsewhere", {"room_version": "10"}, [], 1, "")
    zed, z = make("m.room.member", "@zed:elsewhere", {"membership": "join"}, [c], 2, "@zed:elsewhere")
    old, o = make("m.room.message", "@zed:elsewhere", {"body": "old"}, [z], 3)
    bob, b = make("m.room.member", "@bob:hs", {"membership": "join"}, [o], 4, "@bob:hs")
    live, li = make("m.room.message", "@zed:elsewhere", {"body": "live"}, [b], 5)
    start = (await store.timeline.new_events("@bob:hs", None)).next
    # the room's recent part first (its old message is a gap), then the old part as backfill
    r = await server.post(f"/rooms/{room}/remote_events", content=body([bob, live], room_version="10"))
    assert r.status_code == 200, r.text
    middle = (await store.timeline.new_events("@bob:hs", start)).next
    r = await server.post(f"/rooms/{room}/remote_events", content=body([create, zed, old], backfill=True))
    assert r.status_code == 200, r.text
    got = await store.timeline.new_events("@bob:hs", start)
    assert [ids(t.events) for t in got.rooms] == [[b, li]]
    assert (await store.timeline.new_events("@bob:hs", middle)).rooms == []
    # yet the backfilled events are in the room's history, at their topological place
    r = await client("@bob:hs").get(f"/rooms/{room}/messages", params={"limit": 10})
    assert [e["event_id"] for e in r.json()["chunk"]] == [li, b, o, z, c]


async def test_recent_rooms_one_query_ranked_by_last_event(main, client):
    store = store_of(main)
    rooms = [await store.create_room("@alice:hs", preset="public_chat", name=f"r{i}") for i in range(8)]
    for room in rooms:
        await store.change_membership(room, "@bob:hs", "@bob:hs", "join")
    newest: dict[str, list[str]] = {room: [] for room in rooms}
    # activity in a shuffled order: the last room written to ranks first
    order = [3, 1, 4, 1, 5, 0, 2, 6, 5, 3, 5]
    for n, i in enumerate(order):
        newest[rooms[i]].append(
            await store.send(rooms[i], "@alice:hs", "m.room.message", {"msgtype": "m.text", "body": f"{n}"})
        )
    invited = await store.create_room("@carol:hs", invite=["@bob:hs"])
    ranking = [invited] + [rooms[i] for i in dict.fromkeys(reversed(order))]
    ranking += [r for r in reversed(rooms) if r not in ranking]  # rooms without messages, by bob's join

    got = await store.timeline.recent("@bob:hs", rooms=6, limit=2)
    assert [r.room_id for r in got] == ranking[:6]
    assert got[0].membership == "invite"
    assert [json.loads(e)["content"]["membership"] for e in got[0].events] == ["invite"]
    for timeline in got[1:]:
        # the per-room answer, one /messages call each, is the oracle
        page = await store.reads.messages("@bob:hs", timeline.room_id, limit=2)
        assert ids(timeline.events) == ids(page.chunk)[::-1]
        assert timeline.membership == "join"
        assert timeline.limited
    r = await client("@bob:hs").get("/recent", params={"rooms": 6, "limit": 2})
    assert r.status_code == 200, r.text
    assert [room["room_id"] for room in r.json()["rooms"]] == ranking[:6]
    assert [e["event_id"] for e in r.json()["rooms"][1]["events"]] == ids(got[1].events)
    # a prev_batch pages on from the first event returned
    page = await client("@bob:hs").get(
        f"/rooms/{got[1].room_id}/messages", params={"from": got[1].prev_batch, "limit": 1}
    )
    earlier = page.json()["chunk"][0]["event_id"]
    assert earlier not in ids(got[1].events)


async def test_recent_applies_history_visibility(main):
    store = store_of(main)
    room = await store.create_room("@alice:hs", preset="public_chat", history_visibility="joined")
    for i in range(5):
        await store.send(room, "@alice:hs", "m.room.message", {"msgtype": "m.text", "body": f"before {i}"})
    join = await store.change_membership(room, "@bob:hs", "@bob:hs", "join")
    after = await store.send(room, "@alice:hs", "m.room.message", {"msgtype": "m.text", "body": "after"})
    (timeline,) = await store.timeline.recent("@bob:hs", rooms=5, limit=4)
    assert ids(timeline.events) == [join, after]
    (alice_view,) = await store.timeline.recent("@alice:hs", rooms=5, limit=4)
    assert len(alice_view.events) == 4


async def test_bad_parameters_are_400s_naming_them(main, client):
    bob = client("@bob:hs")
    for path, params, field in (
        ("/events", {"from": "t1-2"}, "from"),
        ("/events", {"from": "x"}, "from"),
        ("/events", {"from": "s1", "limit": "0"}, "limit"),
        ("/events", {"limit": "abc"}, "limit"),
        ("/recent", {"rooms": "0"}, "rooms"),
        ("/recent", {"limit": "1001"}, "limit"),
        ("/recent", {"rooms": "-1"}, "rooms"),
    ):
        r = await bob.get(path, params=params)
        assert r.status_code == 400, (path, params, r.text)
        assert r.json()["error"].startswith(field), r.text


async def test_a_worker_started_later_answers_from_prefilled_caches_and_follows_new_events(main, host_cluster):
    store = store_of(main)
    room = await store.create_room("@alice:hs", preset="public_chat")
    await store.change_membership(room, "@bob:hs", "@bob:hs", "join")
    start = (await store.timeline.new_events("@bob:hs", None)).next
    sent = [
        await store.send(room, "@alice:hs", "m.room.message", {"msgtype": "m.text", "body": f"m{i}"}) for i in range(3)
    ]
    quiet = await store.create_room("@alice:hs", preset="public_chat")

    worker = await host_cluster("worker1")
    await host_cluster.following(worker, "events")
    remote = store_of(worker).timeline
    assert remote.rooms.earliest == 0  # this small database: every change is known
    got = await remote.new_events("@bob:hs", start)
    assert [ids(t.events) for t in got.rooms] == [sent]
    # nothing changed for bob after the token main gives now: no database read
    now = (await store.timeline.new_events("@bob:hs", None)).next
    await store.send(quiet, "@alice:hs", "m.room.message", {"msgtype": "m.text", "body": "elsewhere"})
    assert await worker.api.wait_for_stream_position("main", "events", store.timeline._stream.current_token())
    reads = remote.read_database
    assert (await remote.new_events("@bob:hs", now)).rooms == []
    assert remote.read_database == reads
    # a new event in bob's room replicates, and the worker's change cache finds it
    later = await store.send(room, "@alice:hs", "m.room.message", {"msgtype": "m.text", "body": "later"})
    assert await worker.api.wait_for_stream_position("main", "events", store.timeline._stream.current_token())
    found = await remote.new_events("@bob:hs", now)
    assert [ids(t.events) for t in found.rooms] == [[later]]


async def test_an_invite_to_a_joined_visibility_room_reaches_the_invitee(main, client):
    store = store_of(main)
    start = (await store.timeline.new_events("@bob:hs", None)).next
    room = await store.create_room("@alice:hs", history_visibility="joined")
    invite = await store.change_membership(room, "@alice:hs", "@bob:hs", "invite")
    got = await store.timeline.new_events("@bob:hs", start)
    assert ids(got.memberships) == [invite]
    (recent,) = await store.timeline.recent("@bob:hs", rooms=5)
    assert recent.membership == "invite" and ids(recent.events) == [invite]
    r = await client("@bob:hs").get("/events", params={"from": "s0", "limit": "0"})
    assert r.status_code == 400 and r.json()["errcode"] == "M_INVALID_PARAM", r.text
