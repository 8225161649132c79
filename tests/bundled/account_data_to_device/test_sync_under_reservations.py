"""``/sync`` on a worker for the bundled streams while main writes with reservations in flight (issue
30, point 6, for the core's own streams).

The skip ``tests/bundled/events/test_new_events_replicated.py`` pins down was on the writer's side of
replication, so it hit every stream: a row whose ID completed while an earlier reservation of main
still waited for the sequence went out as a bare ``POSITION`` (its captured row dropped). The worker
then passed it without its rows handlers, its cache invalidations or its wake-up: a long poll of
its user was not woken (and, with nothing newer for that user, never got it) and ``account_data``'s
cached value stayed stale for good. Main's sequence calls are held or slowed here
(``tests/reservations.py``); appends take their IDs inside their ``INSERT``, so the window is opened by
``get_next_mult`` reservations of the same writer beside them.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import random
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from factstream.host.app import Host
from factstream.idgen.generator import MultiWriterIdGenerator
from factstream.testing import HostCluster
from tests.bundled.account_data_to_device.support import TOKENS, USERS
from tests.reservations import held_sequence, slow_sequence

pytestmark = pytest.mark.parametrize("transport", ["tcp", "redis"])

STREAMS = ("account_data", "to_device")
ALICE, BOB = USERS[0], USERS[1]
DEVICE = "PHONE"
#: Writes per user and stream in the stress test.
WRITES = 12


async def pair(host_cluster: HostCluster, transport: str) -> tuple[Host, Host]:
    host_cluster.configure(transport=transport, http={"tokens": TOKENS})
    main = await host_cluster("main")
    worker = await host_cluster("worker1")
    await host_cluster.following(worker, *STREAMS)
    return main, worker


async def caught_up(main: Host, worker: Host, stream: str) -> int:
    position = main.id_generator(stream).get_current_token()
    assert await worker.wait_for_stream_position("main", stream, position, timeout=10)
    return position


async def write(on_main: dict[str, httpx.AsyncClient], stream: str, user: str, n: int) -> None:
    """One item for ``user`` (``on_main``: a client of main per user): their account data of type
    ``m.t<n>``, or a to_device message from alice to their phone."""
    if stream == "account_data":
        response = await on_main[user].put(f"/user/{user}/account_data/m.t{n}", json={"n": n})
    else:
        messages = {user: {DEVICE: {"n": n}}}
        response = await on_main[ALICE].put(f"/sendToDevice/m.test/{user}-{n}", json={"messages": messages})
    assert response.status_code == 200, response.text


async def sync(client: httpx.AsyncClient, since: str | None, timeout_ms: int) -> dict[str, Any]:
    params = {"timeout": str(timeout_ms), "device": DEVICE} | ({"since": since} if since else {})
    response = await client.get("/sync", params=params)
    assert response.status_code == 200, response.text
    return dict(response.json())


def numbers(answer: dict[str, Any], stream: str) -> list[int]:
    return [item["content"]["n"] for item in answer["streams"].get(stream, [])]


@contextlib.asynccontextmanager
async def reserving(gen: MultiWriterIdGenerator) -> AsyncIterator[None]:
    """A reservation of ``gen`` (no row written: a gap) held in flight until the block ends."""
    with held_sequence(gen) as held:

        async def reserve() -> None:
            async with gen.get_next_mult(1):
                pass

        task = asyncio.ensure_future(reserve())
        await held.entered.wait()
        yield
    await task


@pytest.mark.parametrize("stream", STREAMS)
async def test_a_write_that_completes_while_a_reservation_waits_for_the_sequence_reaches_the_worker(
    host_cluster, client_for, row_recorder, transport, stream
):
    main, worker = await pair(host_cluster, transport)
    on_main, reader = {user: client_for(main, user) for user in USERS}, client_for(worker, BOB)
    await write(on_main, stream, BOB, 0)
    await caught_up(main, worker, stream)
    since = (await sync(reader, None, 0))["next_batch"]  # the phone is known; the first item is delivered
    if stream == "account_data":  # the worker caches bob's m.t1 (absent) now
        assert (await reader.get(f"/user/{BOB}/account_data/m.t1")).status_code == 404

    async with reserving(main.id_generator(stream)):
        poll = asyncio.ensure_future(sync(reader, since, 5000))
        await asyncio.sleep(0.1)
        await write(on_main, stream, BOB, 1)
        at = await caught_up(main, worker, stream)
        assert row_recorder.rows("worker1", stream)[-1].token == at  # the row came, not only its position
        answer = await asyncio.wait_for(poll, 3)  # woken by the row (before the fix: the whole 5 s, empty)
        assert numbers(answer, stream) == [1]
        if stream == "account_data":  # the invalidation came with the row
            assert (await reader.get(f"/user/{BOB}/account_data/m.t1")).json() == {"n": 1}


async def test_long_polls_on_a_worker_get_every_item_once_while_main_writes_with_slow_reservations(
    host_cluster, client_for, row_recorder, transport
):
    main, worker = await pair(host_cluster, transport)
    on_main = {user: client_for(main, user) for user in USERS}
    readers = {user: client_for(worker, user) for user in USERS}
    tokens = {user: (await sync(readers[user], None, 0))["next_batch"] for user in USERS}
    before = {stream: main.id_generator(stream).get_current_token() for stream in STREAMS}
    got: dict[tuple[str, str], list[int]] = {(user, stream): [] for user in USERS for stream in STREAMS}
    expected = list(range(WRITES))
    done = asyncio.Event()

    async def read(user: str) -> None:
        since = tokens[user]
        while not all(sorted(got[user, s]) == expected for s in STREAMS):
            answer = await sync(readers[user], since, 1000)
            for stream in STREAMS:
                got[user, stream] += numbers(answer, stream)
            since = answer["next_batch"]

    async def gaps(gen: MultiWriterIdGenerator) -> None:
        """Reservations of main that write nothing, their sequence calls slowed, beside the writes."""
        while not done.is_set():
            async with gen.get_next_mult(1):
                pass

    polls = [asyncio.ensure_future(read(user)) for user in USERS]
    with contextlib.ExitStack() as slow:
        background = []
        for seed, stream in enumerate(STREAMS):
            gen = main.id_generator(stream)
            slow.enter_context(slow_sequence(gen, seed=seed, most=0.005))
            background += [asyncio.ensure_future(gaps(gen)) for _ in range(2)]
        order = list(itertools.product(range(WRITES), USERS, STREAMS))
        random.Random(30).shuffle(order)
        for start in range(0, len(order), 6):  # six writes at a time
            await asyncio.gather(*(write(on_main, stream, user, n) for n, user, stream in order[start : start + 6]))
        done.set()
        await asyncio.gather(*background)
    for stream in STREAMS:
        await caught_up(main, worker, stream)
    await asyncio.wait(polls, timeout=10)  # a reader whose item was skipped waits for ever
    for task in polls:
        task.cancel()
    for (user, stream), numbers_got in got.items():
        assert sorted(numbers_got) == expected, (user, stream, numbers_got)
    for stream in STREAMS:  # the worker's pipeline saw every token main wrote, once each, in order
        written = [r.token for r in row_recorder.rows("main", stream) if r.token > before[stream]]
        replicated = [r.token for r in row_recorder.rows("worker1", stream) if r.token > before[stream]]
        assert replicated == sorted(written), (stream, sorted(set(written) - set(replicated)))
