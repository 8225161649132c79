"""``GET /events`` on a worker while main writes: every event reaches every reader exactly once across
successive ``next`` tokens (issue 30, point 6).

The skip this guards against: main's replication streamer took "my own position has not moved past
what I sent" for "I wrote nothing since", so an event whose ID completed while an earlier reservation
of main still waited for the sequence went out as a bare ``POSITION`` (no ``RDATA``). The worker
advanced past it with its change caches never told, and answered ``next=s<that ID>`` without the
event; no later token found it either, unless its room changed again. ``tests/reservations.py``
holds or slows main's sequence calls to open that window every time instead of now and then.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from factstream.host.app import Host
from tests.bundled.events.conftest import caught_up, main_and_worker, store_of, token_of
from tests.reservations import held_sequence, slow_sequence

pytestmark = pytest.mark.parametrize("transport", ["tcp", "redis"])

ALICE = "@alice:hs"
READERS = ("@bob:hs", "@carol:hs", "@dave:hs", "@eve:hs")
ROOMS = 6
MESSAGES = 60


def text(body: str) -> dict[str, str]:
    return {"msgtype": "m.text", "body": body}


def messages(answer: dict[str, Any]) -> list[str]:
    return [e["event_id"] for room in answer["rooms"].values() for e in room["events"] if e["type"] == "m.room.message"]


async def poll(client: httpx.AsyncClient, since: str) -> dict[str, Any]:
    response = await client.get("/events", params={"from": since, "limit": 100})
    assert response.status_code == 200, response.text
    return dict(response.json())


async def test_an_event_that_completes_while_an_earlier_reservation_waits_for_the_sequence_reaches_the_worker(
    host_cluster, transport
):
    main, worker = await main_and_worker(host_cluster, transport)
    store = store_of(main)
    held_room, quick_room = [await store.create_room(ALICE, preset="public_chat") for _ in range(2)]
    for room in (held_room, quick_room):
        await store.change_membership(room, "@bob:hs", "@bob:hs", "join")
    bob = host_cluster.client(worker, token_of("@bob:hs"))
    start = f"s{await caught_up(main, worker)}"

    with held_sequence(main.id_generator("events")) as held:
        first = asyncio.ensure_future(store.send(held_room, ALICE, "m.room.message", text("held")))
        await held.entered.wait()  # the first message's reservation waits for its ID
        quick = await store.send(quick_room, ALICE, "m.room.message", text("quick"))
        # main's position cannot pass the held reservation, but its watermark passes the quick message
        at = await caught_up(main, worker)
        answer = await poll(bob, start)
        assert answer["next"] == f"s{at}"
        assert messages(answer) == [quick]  # skipped before the fix: the worker never had its row
        held.release()
        slow = await first
    await caught_up(main, worker)
    after = await poll(bob, answer["next"])
    assert messages(after) == [slow]
    assert sorted(messages(await poll(bob, start))) == sorted([quick, slow])


async def test_readers_polling_a_worker_during_concurrent_sends_get_every_event_exactly_once(host_cluster, transport):
    main, worker = await main_and_worker(host_cluster, transport)
    store = store_of(main)
    rooms = [await store.create_room(ALICE, preset="public_chat") for _ in range(ROOMS)]
    joined = {user: [room for r, room in enumerate(rooms) if r % len(READERS) != i] for i, user in enumerate(READERS)}
    for user, mine in joined.items():
        for room in mine:
            await store.change_membership(room, user, user, "join")
    start = f"s{await caught_up(main, worker)}"
    clients = {user: host_cluster.client(worker, token_of(user)) for user in READERS}
    answers: dict[str, list[tuple[str, dict[str, Any]]]] = {user: [] for user in READERS}
    final: list[int] = []

    async def read(user: str) -> None:
        since = start
        while not final or int(since[1:]) < final[0]:
            answer = await poll(clients[user], since)
            answers[user].append((since, answer))
            since = answer["next"]
            await asyncio.sleep(0.002)

    async def send(n: int) -> str:
        return await store.send(rooms[n % ROOMS], ALICE, "m.room.message", text(f"m{n}"))

    readers = [asyncio.ensure_future(read(user)) for user in READERS]
    with slow_sequence(main.id_generator("events"), seed=30):
        sent = await asyncio.gather(*(send(n) for n in range(MESSAGES)))
    final.append(await caught_up(main, worker))
    await asyncio.wait_for(asyncio.gather(*readers), 20)

    where = await stream_orderings(main, sent)
    for user in READERS:
        expected = sorted((e for e in sent if where[e][1] in joined[user]), key=lambda e: where[e][0])
        check_answers(user, answers[user], expected, lambda e: where[e][0])


async def stream_orderings(host: Host, event_ids: list[str]) -> dict[str, tuple[int, str]]:
    rows = await host.database().fetchall(
        "SELECT event_id, stream_ordering, room_id FROM events WHERE event_id = ANY(%(ids)s)", {"ids": event_ids}
    )
    return {str(e): (int(s), str(r)) for e, s, r in rows}


def check_answers(
    user: str, answers: list[tuple[str, dict[str, Any]]], expected: list[str], position: Callable[[str], int]
) -> None:
    """Each answer holds exactly the expected events in ``(from, next]``, so the chain holds each once."""
    got: list[str] = []
    for since, answer in answers:
        low, high = int(since[1:]), int(answer["next"][1:])
        assert low <= high, (user, since, answer["next"])
        due = {e for e in expected if low < position(e) <= high}
        assert set(messages(answer)) == due, (user, since, answer["next"], json.dumps(answer)[:500])
        got += messages(answer)
    assert sorted(got, key=position) == expected and len(got) == len(set(got)), user
