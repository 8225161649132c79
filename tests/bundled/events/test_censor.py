"""The censor job: a redacted event's stored JSON becomes its pruned form once the redaction is old
enough, and only then; users' reads do not change; a server's raw read does."""

from __future__ import annotations

import hashlib
import json
import time

import pytest
from factstream_events.rules.canonical import canonical_json, parse_event_json
from factstream_events.rules.eventid import content_hash, event_id_for
from factstream_events.rules.prune import prune_event
from factstream_events.write.censor import censor_once

from tests.bundled.events.conftest import TOKENS, store_of
from tests.bundled.events.test_remote import ROOM, body, make

DAY_MS = 86_400_000


@pytest.fixture
async def censoring(host_cluster):
    host_cluster.configure(http={"tokens": TOKENS})
    return await host_cluster("main", plugins={"events": {"censor_redactions_after_days": 2}})


async def raw(host, event_id):
    return await store_of(host).reads.event(None, event_id)


async def test_redacted_events_are_censored_after_the_retention_only(censoring, host_cluster):
    store = store_of(censoring)
    room = await store.create_room("@alice:hs", preset="public_chat")
    secret = await store.send(
        room, "@alice:hs", "m.room.message", {"msgtype": "m.text", "body": "secret", "extra": [1, 2]}
    )
    kept = await store.send(room, "@alice:hs", "m.room.message", {"msgtype": "m.text", "body": "kept"})
    name = await store.send(room, "@alice:hs", "m.room.name", {"name": "Secret name"}, state_key="")
    originals = {e: await raw(censoring, e) for e in (secret, kept, name)}
    redactions = [await store.redact(room, "@alice:hs", e) for e in (secret, name)]
    alice = host_cluster.client(censoring, "tok-alice-hs")
    seen_before = (await alice.get(f"/rooms/{room}/event/{secret}")).json()

    now = int(time.time() * 1000)
    # one day later: still within the two days, nothing is rewritten
    assert await censor_once(censoring.api, now_ms=now + DAY_MS) == 0
    assert {e: await raw(censoring, e) for e in originals} == originals
    # three days later: both targets are censored, the unredacted event is not
    assert await censor_once(censoring.api, now_ms=now + 3 * DAY_MS) == 2
    for event_id in (secret, name):
        stored = await raw(censoring, event_id)
        expected = canonical_json(prune_event(parse_event_json(originals[event_id]), "10"))
        assert stored == expected
        assert b"secret" not in stored.lower() and b"Secret name" not in stored
    assert await raw(censoring, kept) == originals[kept]
    # what a user reads is the same pruned event with the same redacted_because as before
    seen_after = (await alice.get(f"/rooms/{room}/event/{secret}")).json()
    assert seen_after["unsigned"].pop("age") >= seen_before["unsigned"].pop("age") >= 0  # counted at read time
    assert seen_after == seen_before
    assert seen_after["unsigned"]["redacted_because"]["event_id"] == redactions[0]
    # a second pass finds nothing more to do (the redactions are marked done)
    assert await censor_once(censoring.api, now_ms=now + 4 * DAY_MS) == 0
    done = await censoring.api.database().fetchall(
        "SELECT count(*) FROM redactions WHERE censored AND event_id = ANY(%(ids)s)", {"ids": redactions}
    )
    assert done[0][0] == 2


def redaction(target, content, prev, depth):
    event = {
        "room_id": ROOM,
        "type": "m.room.redaction",
        "sender": "@zed:elsewhere",
        "content": content,
        "redacts": target,
        "prev_events": [prev],
        "depth": depth,
        "origin_server_ts": 1_000 + depth,
        "auth_events": [],
    }
    event["hashes"] = {"sha256": content_hash(event)}
    return event, event_id_for(event, "10")


async def test_redactions_that_redact_nothing_censor_nothing(censoring, host_cluster):
    server = host_cluster.client(censoring, "tok-server")
    create, c = make("m.room.create", "@zed:elsewhere", {"room_version": "10"}, [], 1, "")
    join, j = make("m.room.member", "@zed:elsewhere", {"membership": "join"}, [c], 2, "@zed:elsewhere")
    msg, m = make("m.room.message", "@zed:elsewhere", {"body": "hello"}, [j], 3)
    events = [create, join, msg]
    # a redaction of the create event, one of an event that never arrives, and two of the message:
    # only the first of those two redacts it
    prev = m
    for depth, (target, content) in enumerate(((c, {}), ("$never-arrives", {}), (m, {}), (m, {"reason": "x"})), 4):
        event, prev = redaction(target, content, prev, depth)
        events.append(event)
    r = await server.post(f"/rooms/{ROOM}/remote_events", content=body(events))
    assert r.status_code == 200, r.text
    before = {e: await raw(censoring, e) for e in (c, j)}
    original_msg = await raw(censoring, m)
    assert await censor_once(censoring.api, now_ms=int(time.time() * 1000) + 3 * DAY_MS) == 1
    assert {e: await raw(censoring, e) for e in (c, j)} == before  # the create event is never redacted
    assert hashlib.sha256(await raw(censoring, m)).digest() != hashlib.sha256(original_msg).digest()
    assert json.loads(await raw(censoring, m))["content"] == {}
    left = await censoring.api.database().fetchall("SELECT redacts FROM redactions WHERE NOT censored")
    assert [r[0] for r in left] == ["$never-arrives"]  # kept for when (if) its target arrives


async def test_without_the_setting_nothing_is_ever_rewritten(main):
    store = store_of(main)
    room = await store.create_room("@alice:hs", preset="public_chat")
    secret = await store.send(room, "@alice:hs", "m.room.message", {"msgtype": "m.text", "body": "secret"})
    before = await raw(main, secret)
    await store.redact(room, "@alice:hs", secret)
    assert await censor_once(main.api, now_ms=int(time.time() * 1000) + 365 * DAY_MS) == 0
    assert await raw(main, secret) == before


async def test_a_bad_retention_stops_start_up_naming_the_key(host_cluster):
    from factstream import ConfigError

    with pytest.raises(ConfigError, match=r"plugins\.events\.censor_redactions_after_days"):
        await host_cluster("main", plugins={"events": {"censor_redactions_after_days": -1}})


async def test_the_job_runs_by_itself_on_the_events_writer(host_cluster, monkeypatch):
    from factstream_events.write import censor

    from factstream.testing import until

    monkeypatch.setattr(censor, "FIRST_RUN_SECONDS", 0.05)
    monkeypatch.setattr(censor, "INTERVAL_SECONDS", 0.05)
    host_cluster.configure(http={"tokens": TOKENS})
    # a retention of about a millisecond: due as soon as the job next looks
    main = await host_cluster("main", plugins={"events": {"censor_redactions_after_days": 1e-8}})
    store = store_of(main)
    room = await store.create_room("@alice:hs", preset="public_chat")
    secret = await store.send(room, "@alice:hs", "m.room.message", {"msgtype": "m.text", "body": "secret"})
    await store.redact(room, "@alice:hs", secret)

    async def censored():
        return b"secret" not in await raw(main, secret)

    await until(censored, 10, "the censor job to rewrite the redacted event")


async def test_redactions_of_missing_targets_do_not_stall_the_job(censoring, monkeypatch):
    from factstream_events.write import censor

    monkeypatch.setattr(censor, "BATCH", 2)
    store = store_of(censoring)
    room = await store.create_room("@alice:hs", preset="public_chat")
    # five redactions whose targets never arrive, older than the one that matters
    for i in range(5):
        await store.redact(room, "@alice:hs", f"$missing{i}")
    secret = await store.send(room, "@alice:hs", "m.room.message", {"msgtype": "m.text", "body": "secret"})
    await store.redact(room, "@alice:hs", secret)
    assert await censor_once(censoring.api, now_ms=int(time.time() * 1000) + 3 * DAY_MS) == 1
    assert b"secret" not in await raw(censoring, secret)
