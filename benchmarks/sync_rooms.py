"""Rooms in ``/sync`` (issue 32): wake-ups, incremental and initial syncs of the events plugin's rooms.

One host (instance ``main``, writer of ``events`` and ``backfill``) in this process. Everything is read
the way a client's request reads it: ``host.sync.sync(...)`` (the whole ``/sync`` handler
minus HTTP: token parsing, the notifier, the events plugin's ``sync_rows``), and for the incremental
and initial syncs also over HTTP (uvicorn on loopback, one kept-alive connection; the clock stops when
the response's last byte is read, the JSON is parsed after).

The rooms are built once per run as a remote server would send them (``EventsStore.persist_remote``,
room version 10, the generator of ``events_storage``): the reader ``@reader:bench.local`` is in
1,000 rooms of 20 events (5 of the room's start, the reader's join, 14 messages) and
``@reader200:bench.local`` in 200 of them (the reference's other size). Of the 10,000 idle users
``@w<i>:bench.local``, 100 are in a room of their own (the room's start and the user's join: the rooms
the wake-up samples write to) and the others in rooms of 100 where nothing is sent (10,000 new rooms
would take minutes to build; how the idle polls spread over rooms does not touch a wake-up's path).

1. **wake-up**: every idle user parks a ``/sync`` long poll (10,000 open at once); a sample commits
   one remote message into the room of one of the 100 (at random) and times from the commit returning to that
   user's ``sync`` returning (with the message); the user parks again. Requests woken per event
   (``Notifier.on_new_event``'s count) must be exactly one. Target: p99 <= 5 ms.
2. **incremental**: a sample takes the reader's current token, commits one message in each of 10
   random rooms of its 1,000, then times ``sync(since=token)``, which must hold exactly those 10
   rooms. Target: p99 <= 10 ms; the reference answered in 60 ms (aim: 20x).
3. **initial**: ``sync()`` with no ``since`` and a timeline limit of 10, for the reader in 1,000
   rooms (every room in the response, 10 events each, ``limited``), and for the reader in 200.
   Target: p99 <= 300 ms at 1,000 rooms; the reference took 13.3 s (1,000) and 1.4 s (200) (aim: 40x).

The reference's figures are the issue's (Synapse 1.163 on PostgreSQL, this machine, rooms of 20
events), not measured in this run.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass
from typing import Any

from events_storage import (
    BATCH,
    SERVER,
    Clock,
    RemoteRoom,
    SetupTimeout,
    analyze,
    events_host,
    ms,
    pct,
    persist,
    persist_rounds,
    store_of,
    verdict,
)
from sync_wakeup import free_port, until

from factstream.host.app import Host

Emit = Callable[[str], None]

READER = "@reader:bench.local"
READER200 = "@reader200:bench.local"
TOKEN = "tok-reader"
TOKEN200 = "tok-reader200"
#: The reference's figures as the issue states them (Synapse 1.163 on PostgreSQL, this machine).
REFERENCE_INITIAL_1000 = 13.3
REFERENCE_INITIAL_200 = 1.4
REFERENCE_INCREMENTAL = 0.060
TIMELINE_LIMIT = 10
FILTER = {"room": {"timeline": {"limit": TIMELINE_LIMIT}}}


@dataclass
class Sizes:
    rooms: int = 1_000
    small_rooms: int = 200
    polls: int = 10_000
    changed: int = 10
    wake_rooms: int = 100
    wake_samples: int = 300
    incremental_samples: int = 300
    initial_samples: int = 30


def idle_user(i: int) -> str:
    return f"@w{i}:bench.local"


@contextlib.asynccontextmanager
async def rooms_host(url: str, port: int) -> AsyncIterator[Host]:
    """One started host on ``url`` (migrated), serving HTTP on ``port`` with the readers' tokens."""
    http = {
        "port": port,
        "bind": "127.0.0.1",
        "sync_timeout_max_seconds": 600,
        "token_table": False,
        "tokens": {TOKEN: {"user": READER}, TOKEN200: {"user": READER200}},
    }
    async with events_host(url, http=http) as host:
        yield host


# -- building the rooms ----------------------------------------------------------------------------------


async def build(
    host: Host, sizes: Sizes, setup_seconds: float, emit: Emit
) -> tuple[list[RemoteRoom], list[RemoteRoom]]:
    """The readers' rooms (20 events each) and the idle users' rooms; returns the readers' rooms and the
    rooms of the idle users who have one of their own (``idle_user(i)`` is in the ``i``-th)."""
    store = store_of(host)
    clock = Clock("sync-rooms", setup_seconds, emit)
    reader_rooms = [RemoteRoom(f"@c{i}:{SERVER}") for i in range(sizes.rooms)]

    def reader_batch(i: int, room: RemoteRoom) -> Callable[[], list[bytes]]:
        def make() -> list[bytes]:
            batch = [*room.start(), room.member(READER, "join")]
            if i < sizes.small_rooms:
                batch.append(room.member(READER200, "join"))
            return batch + [room.message(room.creator, n) for n in range(20 - len(batch))]

        return make

    await persist_rounds(
        store, [[(r.room_id, reader_batch(i, r)) for i, r in enumerate(reader_rooms)]], clock, what="readers' rooms"
    )
    # The users whose rooms get the sampled events have a room each; the others share rooms of
    # ``crowd`` members where nothing is sent (a room of its own for each of 10,000 users would take
    # minutes to build: a new room's first batch is the expensive one).
    owners = min(sizes.wake_rooms, sizes.polls)
    idle_rooms = [RemoteRoom(f"@c{i}:{SERVER}") for i in range(owners)]

    def idle_batch(i: int, room: RemoteRoom) -> Callable[[], list[bytes]]:
        return lambda: [*room.start(), room.member(idle_user(i), "join")]

    work = [(r.room_id, idle_batch(i, r)) for i, r in enumerate(idle_rooms)]
    crowd = [idle_user(i) for i in range(owners, sizes.polls)]
    crowd_rooms = [RemoteRoom(f"@crowd{i}:{SERVER}") for i in range((len(crowd) + BATCH - 1) // BATCH)]
    work += [(r.room_id, r.start) for r in crowd_rooms]
    await persist_rounds(store, [work], clock, what="the idle users' rooms")

    def joins(at: int, room: RemoteRoom) -> Callable[[], list[bytes]]:
        return lambda: [room.member(u, "join") for u in crowd[at : at + BATCH]]

    rounds = [[(r.room_id, joins(n * BATCH, r)) for n, r in enumerate(crowd_rooms)]]
    await persist_rounds(store, rounds, clock, what="the crowd's joins")
    await analyze(host)
    emit(
        f"built in {clock.elapsed:.0f} s: {READER} in {sizes.rooms:,} rooms of 20 events ({READER200} in"
        f" {sizes.small_rooms} of them); {sizes.polls:,} idle users: {owners} in a room each, {len(crowd):,} in"
        f" {len(crowd_rooms)} rooms of {BATCH} (remote batches, as a server receives them)"
    )
    return reader_rooms, idle_rooms


async def message(store: Any, room: RemoteRoom, n: int) -> None:
    """Commit one message of the room's remote creator (a federation transaction of one event)."""
    done = await persist(store, room.room_id, [room.message(room.creator, n)])
    assert len(done.stored) == 1, "a new message is stored"


# -- HTTP ------------------------------------------------------------------------------------------------


class HttpClient:
    """One kept-alive connection to the host's ``/sync``; :meth:`sync` returns (seconds, body)."""

    def __init__(self, port: int, token: str) -> None:
        self.port = port
        self.token = token
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def sync(self, since: str | None, filter: dict[str, Any]) -> tuple[float, dict[str, Any]]:
        if self.reader is None or self.writer is None:
            self.reader, self.writer = await asyncio.open_connection("127.0.0.1", self.port)
        from urllib.parse import quote

        query = f"timeout=0&filter={quote(json.dumps(filter, separators=(',', ':')))}"
        if since is not None:
            query += f"&since={quote(since)}"
        request = f"GET /sync?{query} HTTP/1.1\r\nHost: bench\r\nAuthorization: Bearer {self.token}\r\n\r\n"
        start = time.perf_counter()
        self.writer.write(request.encode())
        head = await self.reader.readuntil(b"\r\n\r\n")
        length = 0
        for line in head.split(b"\r\n"):
            if line.lower().startswith(b"content-length:"):
                length = int(line.split(b":", 1)[1])
        body = await self.reader.readexactly(length)
        took = time.perf_counter() - start
        assert head.startswith(b"HTTP/1.1 200"), head + body[:300]
        return took, json.loads(body)

    async def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            with contextlib.suppress(Exception):
                await self.writer.wait_closed()


# -- 3. initial sync ---------------------------------------------------------------------------------------


def check_initial(body: dict[str, Any], rooms: int) -> None:
    joined = body.get("rooms", {}).get("join", {})
    assert len(joined) == rooms, f"{len(joined)} rooms in the initial sync, not {rooms}"
    for room in joined.values():
        assert len(room["timeline"]["events"]) == TIMELINE_LIMIT and room["timeline"]["limited"], room["timeline"]
        assert room["state"]["events"], "an initial sync gives each room's state"


async def bench_initial(host: Host, port: int, sizes: Sizes, emit: Emit) -> None:
    service = host.sync
    for user, token, rooms, reference in (
        (READER, TOKEN, sizes.rooms, REFERENCE_INITIAL_1000),
        (READER200, TOKEN200, sizes.small_rooms, REFERENCE_INITIAL_200),
    ):
        check_initial(await service.sync(user, None, 0, api=host.api, filter=FILTER), rooms)  # and a warm-up
        times = []
        cpu = time.process_time()
        for _ in range(sizes.initial_samples):
            start = time.perf_counter()
            body = await service.sync(user, None, 0, api=host.api, filter=FILTER)
            times.append(time.perf_counter() - start)
        cpu = (time.process_time() - cpu) / sizes.initial_samples
        check_initial(body, rooms)
        client = HttpClient(port, token)
        http_times = []
        try:
            for _ in range(sizes.initial_samples):
                took, body = await client.sync(None, FILTER)
                http_times.append(took)
        finally:
            await client.close()
        check_initial(body, rooms)
        target = f"target p99 <= 300 ms: {verdict(pct(times, 0.99) <= 0.300)}; " if rooms == sizes.rooms else ""
        emit(
            f"{f'initial sync, {rooms:,} rooms, timeline limit {TIMELINE_LIMIT}':52s} {ms(times)}  ({target}"
            f"reference {reference:.1f} s: {reference / pct(times, 0.5):,.0f}x at p50,"
            f" {reference / pct(times, 0.99):,.0f}x at p99, aim 40x; {len(times)} syncs)"
        )
        emit(f"{'  CPU of this process (not PostgreSQL) per sync':52s} {cpu * 1000:8.2f} ms")
        emit(
            f"{'  over HTTP':52s} {ms(http_times)}  ({reference / pct(http_times, 0.5):,.0f}x at p50,"
            f" {reference / pct(http_times, 0.99):,.0f}x at p99; {len(json.dumps(body)) / 1e6:.1f} MB a response)"
        )


# -- 2. incremental sync -----------------------------------------------------------------------------------


async def bench_incremental(host: Host, port: int, rooms: Sequence[RemoteRoom], sizes: Sizes, emit: Emit) -> None:
    service = host.sync
    store = store_of(host)
    rng = random.Random(17)
    by_id = {r.room_id: r for r in rooms}
    client = HttpClient(port, TOKEN)
    since = (await service.sync(READER, None, 0, api=host.api, filter=FILTER))["next_batch"]
    times: list[float] = []
    http_times: list[float] = []
    nothing: list[float] = []
    try:
        for i in range(2 * sizes.incremental_samples):
            changed = rng.sample(list(by_id), sizes.changed)
            for n, room_id in enumerate(changed):
                await message(store, by_id[room_id], i * sizes.changed + n)
            if i % 2 == 0:
                start = time.perf_counter()
                body = await service.sync(READER, since, 0, api=host.api, filter=FILTER)
                times.append(time.perf_counter() - start)
            else:
                took, body = await client.sync(since, FILTER)
                http_times.append(took)
            joined = body.get("rooms", {}).get("join", {})
            assert sorted(joined) == sorted(changed), f"{len(joined)} rooms in an incremental sync, not the 10 changed"
            assert all(len(room["timeline"]["events"]) == 1 for room in joined.values())
            since = body["next_batch"]
            if i % 10 == 0:  # nothing new: answered from the change caches
                start = time.perf_counter()
                empty = await service.sync(READER, since, 0, api=host.api, filter=FILTER)
                nothing.append(time.perf_counter() - start)
                assert not empty.get("rooms"), empty
    finally:
        await client.close()
    p50, p99 = pct(times, 0.5), pct(times, 0.99)
    ref = REFERENCE_INCREMENTAL
    emit(
        f"{f'incremental sync, {sizes.changed} of {len(rooms):,} rooms changed':52s} {ms(times)}  (target p99 <= 10 ms:"
        f" {verdict(p99 <= 0.010)}; reference {ref * 1000:.0f} ms: {ref / p50:.0f}x at p50, {ref / p99:.0f}x at p99,"
        f" aim 20x; {len(times)} syncs)"
    )
    emit(
        f"{'  over HTTP':52s} {ms(http_times)}  ({ref / pct(http_times, 0.5):.0f}x at p50,"
        f" {ref / pct(http_times, 0.99):.0f}x at p99; {len(http_times)} syncs)"
    )
    emit(f"{f'incremental sync, nothing new in {len(rooms):,} rooms':52s} {ms(nothing)}  ({len(nothing)} syncs)")


# -- 1. wake-ups with idle long polls ----------------------------------------------------------------------


async def bench_wakeups(host: Host, rooms: Sequence[RemoteRoom], sizes: Sizes, emit: Emit) -> None:
    service = host.sync
    notifier = service.notifier
    store = store_of(host)
    woken = [0]
    notify = notifier.on_new_event

    def counted(*args: Any, **kwargs: Any) -> int:
        n = notify(*args, **kwargs)
        woken[0] += n
        return n

    notifier.on_new_event = counted  # type: ignore[method-assign]  # counts the requests each write wakes
    since = await service.current().to_string(service.ids)
    polls = sizes.polls
    started = time.perf_counter()
    futures: dict[int, asyncio.Future[dict[str, Any]]] = {}
    for i in range(polls):
        futures[i] = asyncio.ensure_future(service.sync(idle_user(i), since, 600, api=host.api, filter=FILTER))
        if i % 500 == 499:
            await asyncio.sleep(0)  # let the parked ones get to their wait
    await until(lambda: notifier.open_waits == polls, 300, "polls to park")
    await until(lambda: sum(notifier.listening(idle_user(i)) for i in range(polls)) == polls, 60, "listeners")
    parked = time.perf_counter() - started
    rng = random.Random(23)
    latencies = []
    strays = 0
    for n in range(sizes.wake_samples):
        i = rng.randrange(len(rooms))
        before = woken[0]
        await message(store, rooms[i], n)
        committed = time.perf_counter()
        body = await asyncio.wait_for(futures[i], 10)
        latencies.append(time.perf_counter() - committed)
        events = [json.loads(bytes(e)) for e in body["rooms"]["join"][rooms[i].room_id]["timeline"]["events"]]
        assert [e["type"] for e in events] == ["m.room.message"], events
        strays += woken[0] - before - 1
        futures[i] = asyncio.ensure_future(
            service.sync(idle_user(i), body["next_batch"], 600, api=host.api, filter=FILTER)
        )
        await until(lambda: notifier.listening(idle_user(i)) == 1, 10, "the poll to park again")  # noqa: B023
    others_done = sum(1 for f in futures.values() if f.done())
    notifier.close()
    await asyncio.gather(*futures.values())
    p99 = pct(latencies, 0.99)
    emit(f"{polls:,} long polls parked in {parked:.1f} s ({polls / parked:,.0f}/s)")
    emit(
        f"{f'wake-up for a new room event, {polls:,} idle polls':52s} {ms(latencies)}  (target p99 <= 5 ms:"
        f" {verdict(p99 <= 0.005)}; {len(latencies)} events; other requests woken: {strays}, other polls"
        f" answered: {others_done})"
    )


# -- entry points ------------------------------------------------------------------------------------------


async def run_async(url: str, sizes: Sizes, setup_seconds: float, emit: Emit) -> None:
    port = free_port()
    async with rooms_host(url, port) as host:
        try:
            reader_rooms, idle_rooms = await build(host, sizes, setup_seconds, emit)
        except SetupTimeout as exc:
            emit(f"SKIPPED: {exc}")
            return
        await bench_initial(host, port, sizes, emit)
        await bench_incremental(host, port, reader_rooms, sizes, emit)
        await bench_wakeups(host, idle_rooms, sizes, emit)


def run(url: str, *, polls: int = 10_000, setup_seconds: float = 120.0, emit: Emit = print) -> None:
    """Build the rooms on the migrated database ``url`` and run the three measurements, emitting lines."""
    asyncio.run(run_async(url, Sizes(polls=polls), setup_seconds, emit))
