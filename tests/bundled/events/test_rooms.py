"""Local rooms end to end, through the HTTP API and the Python API: create, send, state, membership,
pagination, and what each user is shown."""

from __future__ import annotations

import json

import pytest
from factstream_events.rules.errors import Forbidden
from factstream_events.rules.statemath import flatten

from tests.bundled.events.conftest import reads_of, store_of


async def test_create_send_and_read_back(main, client):
    alice = client("@alice:hs")
    r = await alice.post("/createRoom", json={"preset": "public_chat", "name": "Lobby"})
    assert r.status_code == 200, r.text
    room = r.json()["room_id"]
    sent = []
    for i in range(5):
        r = await alice.put(f"/rooms/{room}/send/m.room.message/t{i}", json={"msgtype": "m.text", "body": f"hello {i}"})
        assert r.status_code == 200, r.text
        sent.append(r.json()["event_id"])
    # the same transaction ID again: the same event, nothing new stored
    r = await alice.put(f"/rooms/{room}/send/m.room.message/t4", json={"msgtype": "m.text", "body": "hello 4"})
    assert r.json()["event_id"] == sent[-1]
    r = await alice.put(f"/rooms/{room}/send/m.room.message/t4", json={"msgtype": "m.text", "body": "other"})
    assert r.status_code == 409, r.text

    r = await alice.get(f"/rooms/{room}/messages", params={"limit": 3})
    assert r.status_code == 200, r.text
    page = r.json()
    assert [e["event_id"] for e in page["chunk"]] == sent[::-1][:3]
    assert all(e["unsigned"]["membership"] == "join" for e in page["chunk"])
    r = await alice.get(f"/rooms/{room}/messages", params={"limit": 3, "from": page["end"]})
    second = r.json()
    assert [e["event_id"] for e in second["chunk"]][:2] == sent[::-1][3:5]

    r = await alice.get(f"/rooms/{room}/event/{sent[0]}")
    assert r.status_code == 200, r.text
    assert r.json()["content"] == {"msgtype": "m.text", "body": "hello 0"}

    state = await reads_of(main).state_ids(room)
    assert state[("m.room.member", "@alice:hs")]
    assert state[("m.room.join_rules", "")]
    r = await alice.get(f"/rooms/{room}/state")
    assert {e["type"] for e in r.json()} >= {"m.room.create", "m.room.member", "m.room.power_levels", "m.room.name"}


async def test_join_leave_and_visibility(main, client):
    store = store_of(main)
    room = await store.create_room("@alice:hs", preset="private_chat", history_visibility="joined")
    before = await store.send(room, "@alice:hs", "m.room.message", {"msgtype": "m.text", "body": "before bob"})
    bob = client("@bob:hs")
    r = await bob.post(f"/rooms/{room}/join", json={})
    assert r.status_code == 403, r.text  # not invited, invite-only room
    r = await client("@alice:hs").post(f"/rooms/{room}/invite", json={"user_id": "@bob:hs"})
    assert r.status_code == 200, r.text
    r = await bob.post(f"/rooms/{room}/join", json={})
    assert r.status_code == 200, r.text
    after = await store.send(room, "@bob:hs", "m.room.message", {"msgtype": "m.text", "body": "after bob"})
    r = await bob.get(f"/rooms/{room}/messages", params={"limit": 50})
    ids = [e["event_id"] for e in r.json()["chunk"]]
    assert after in ids and before not in ids
    r = await client("@alice:hs").get(f"/rooms/{room}/messages", params={"limit": 50})
    assert before in [e["event_id"] for e in r.json()["chunk"]]
    r = await client("@carol:hs").get(f"/rooms/{room}/messages")
    assert r.status_code == 403


async def test_state_at_every_event_matches_a_replay(main):
    store = store_of(main)
    room = await store.create_room("@alice:hs", preset="public_chat")
    for i in range(40):
        user = f"@u{i}:hs"
        await store.change_membership(room, user, user, "join")
        if i % 3 == 0:
            await store.change_membership(room, user, user, "leave")
    async with main.api.database().autocommit() as conn:
        cur = await conn.execute(
            "SELECT e.event_id, e.type, e.state_key FROM events e WHERE room_id = %(r)s ORDER BY stream_ordering",
            {"r": room},
        )
        rows = await cur.fetchall()
    replay: dict[tuple[str, str], str] = {}
    store.states.forget()
    reads = reads_of(main)
    for event_id, event_type, state_key in rows:
        if state_key is not None:
            replay[(event_type, state_key)] = event_id
        assert await reads.state_ids(room, event_id) == replay


async def test_redaction_prunes_on_read(main, client):
    store = store_of(main)
    room = await store.create_room("@alice:hs", preset="public_chat")
    target = await store.send(room, "@alice:hs", "m.room.message", {"body": "secret", "msgtype": "m.text"})
    r = await client("@alice:hs").put(f"/rooms/{room}/redact/{target}/r1", json={"reason": "oops"})
    assert r.status_code == 200, r.text
    redaction = r.json()["event_id"]
    r = await client("@alice:hs").get(f"/rooms/{room}/event/{target}")
    event = r.json()
    assert event["content"] == {}
    assert event["unsigned"]["redacted_because"]["event_id"] == redaction
    raw = await client("server").get(f"/rooms/{room}/event/{target}", params={"raw": "true"})
    assert json.loads(raw.content)["content"]["body"] == "secret"


async def test_state_cache_can_be_cold(main):
    store = store_of(main)
    room = await store.create_room("@alice:hs", preset="public_chat")
    for i in range(20):
        await store.change_membership(room, f"@m{i}:hs", f"@m{i}:hs", "join")
    store.states.forget()
    state = await reads_of(main).state_ids(room)
    assert sum(1 for t, _ in state if t == "m.room.member") == 21
    assert flatten({}) == {}


async def test_kick_and_unban_only_apply_to_the_membership_they_name(main, client):
    store = store_of(main)
    room = await store.create_room("@alice:hs", preset="public_chat")
    await store.change_membership(room, "@bob:hs", "@bob:hs", "join")
    alice = client("@alice:hs")
    r = await alice.post(f"/rooms/{room}/unban", json={"user_id": "@bob:hs"})
    assert r.status_code == 403 and "not ban" in r.json()["error"], r.text  # unban must not kick bob
    assert (await reads_of(main).state_ids(room))[("m.room.member", "@bob:hs")]
    r = await alice.post(f"/rooms/{room}/ban", json={"user_id": "@bob:hs"})
    assert r.status_code == 200, r.text
    r = await alice.post(f"/rooms/{room}/kick", json={"user_id": "@bob:hs"})
    assert r.status_code == 403 and "membership is ban" in r.json()["error"], r.text  # kick must not unban
    r = await alice.post(f"/rooms/{room}/unban", json={"user_id": "@bob:hs"})
    assert r.status_code == 200, r.text
    r = await alice.post(f"/rooms/{room}/kick", json={"user_id": "@carol:hs"})
    assert r.status_code == 403 and "no membership" in r.json()["error"], r.text


async def test_the_python_api_judges_a_kick_and_an_unban_as_the_routes_do(main):
    """The verb is judged with the policy, under the room's lock, whoever writes: not only the route."""
    store = store_of(main)
    room = await store.create_room("@alice:hs", preset="public_chat")
    await store.change_membership(room, "@bob:hs", "@bob:hs", "join")
    await store.change_membership(room, "@bob:hs", "@bob:hs", "leave")
    with pytest.raises(Forbidden, match="@bob:hs cannot be kicked: their membership is leave, not join or invite"):
        await store.change_membership(room, "@alice:hs", "@bob:hs", "leave", verb="kick")
    with pytest.raises(Forbidden, match="cannot be unbanned: their membership is leave, not ban"):
        await store.change_membership(room, "@alice:hs", "@bob:hs", "leave", verb="unban")
    await store.change_membership(room, "@alice:hs", "@bob:hs", "ban")
    assert await store.change_membership(room, "@alice:hs", "@bob:hs", "leave", verb="unban")


async def test_create_room_refuses_an_unknown_history_visibility(main, client):
    r = await client("@alice:hs").post("/createRoom", json={"history_visibility": "sometimes"})
    assert r.status_code == 400 and r.json()["error"].startswith("history_visibility"), r.text
