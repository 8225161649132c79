"""Ephemeral streams (issue 46): typing and receipts delivered to two readers, and a typing change's
wake-up with 10,000 idle long polls.

1. **delivery to two readers**: three hosts in this process over TCP (``main`` writes every stream,
   ``worker1`` and ``worker2`` read). A run writes N changes on main, one at a time (each awaited), and
   ends when both readers' positions for main reach the last one. Three kinds, in the same run:
   the **baseline**, a plain table stream with one row per transaction (``[room_id, user_ids]``, the
   typing row's shape, through ``StreamWriter.append``); **typing** (``TypingWriter.set_typing``: no
   table, the writer's memory); **receipts** (``ReceiptsStore.receive``: a transaction that locks the
   key, deletes the old row and inserts the new one). Printed: changes per second and CPU
   microseconds per change (this process: the writer and both readers; not PostgreSQL's), and each
   one's ratio to the baseline.
2. **wake-up with 10,000 idle long polls**: one host (``main``); 10,000 users park a ``/sync`` long
   poll each (``SyncService.sync``, the whole handler minus HTTP); 100 of them are alone in a room of
   their own, the others in rooms of 100. A sample changes the typing of one of the 100 in their room
   (alternately starting and stopping) and times from the change to that user's ``sync`` returning
   with it; the user parks again. Baseline in the same run: the same samples with a message (a remote
   event persisted into the room) instead, the events plugin's wake-up.

Presence is off (``plugins.presence.enabled: false``): 10,000 users starting to sync make 10,000 presence
changes, each waking the users who share a room (a storm this benchmark is not about).
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Sequence
from pathlib import Path
from typing import Any

import msgspec
from events_storage import BATCH, SERVER, Clock, RemoteRoom, analyze, persist, persist_rounds, store_of
from sync_wakeup import free_port, percentiles, until

import factstream
from factstream import RegisterStream, StreamSpec, StreamTable
from factstream.host.app import Host
from factstream.plugin.manager import load_plugins
from factstream.testing import HostCluster

Emit = Callable[[str], None]
TABLE = "bench_ephemeral"


class BaselineRow(msgspec.Struct, frozen=True):
    room_id: str
    user_ids: list[str]


class Baseline:
    """A plain table stream of the typing row's shape (``[room_id, user_ids]``, the list as a text array)."""

    @factstream.hookimpl
    def register_streams(self, register: RegisterStream) -> None:
        register(
            StreamSpec(name=TABLE, row_type=BaselineRow, tables=(StreamTable(TABLE, "instance_name", "stream_id"),))
        )


def prepare(url: str) -> None:
    import psycopg

    from factstream.db.engine import libpq_url

    with psycopg.connect(libpq_url(url), autocommit=True) as conn:
        conn.execute(f"DROP TABLE IF EXISTS {TABLE}")
        conn.execute(f"DROP SEQUENCE IF EXISTS {TABLE}_seq")
        conn.execute(
            f"CREATE TABLE {TABLE} (stream_id BIGINT NOT NULL UNIQUE, instance_name TEXT NOT NULL, "
            "room_id TEXT NOT NULL, user_ids TEXT[] NOT NULL)"
        )
        conn.execute(f"CREATE SEQUENCE {TABLE}_seq")
        conn.execute(f"SELECT nextval('{TABLE}_seq')")


@contextlib.asynccontextmanager
async def cluster_of(url: str, instances: Sequence[str], **config: Any) -> AsyncIterator[HostCluster]:
    with tempfile.TemporaryDirectory(prefix="factstream-ephemeral-bench-") as state:
        cluster = HostCluster(
            Path(state),
            database=url,
            instances=tuple(instances),
            plugin_host=lambda: load_plugins(extra=[("benchephemeral", Baseline())]),
        ).configure(plugins={"presence": {"enabled": False}}, **config)
        try:
            yield cluster
        finally:
            await cluster.close()


# -- 1. delivery to two readers ----------------------------------------------------------------------------


async def _delivered(readers: Sequence[Host], stream: str, position: int) -> None:
    await until(lambda: all(r.parts.streams[stream].current_token("main") >= position for r in readers), 60, "delivery")


async def _run(
    main: Host, readers: Sequence[Host], stream: str, write: Callable[[int], Any], n: int
) -> tuple[float, float]:
    cpu, wall = time.process_time(), time.perf_counter()
    for i in range(n):
        await write(i)
    await _delivered(readers, stream, main.parts.streams[stream].current_token("main"))
    return time.perf_counter() - wall, time.process_time() - cpu


async def delivery(url: str, changes: int, emit: Emit) -> None:
    from factstream_receipts import ReceiptsRow, ReceiptsStore
    from factstream_typing import TypingWriter

    port = free_port()
    config = {"instance_map": {"main": {"http_port": port}}, "stream_writers": {TABLE: ["main"]}}
    async with cluster_of(url, ("main", "worker1", "worker2"), **config) as cluster:
        main = await cluster("main", http={"port": port, "bind": "127.0.0.1"})
        readers = [await cluster("worker1"), await cluster("worker2")]
        await _delivered(readers, "typing", main.parts.streams["typing"].current_token("main"))
        table = main.api.stream(TABLE, BaselineRow)
        typing = main.api.state(TypingWriter)
        receipts = main.api.state(ReceiptsStore)
        rooms = [f"!r{i}:{SERVER}" for i in range(100)]

        async def baseline(i: int) -> None:
            async with main.api.database().transaction() as txn:
                await table.append(txn, BaselineRow(rooms[i % 100], [f"@u{i % 7}:{SERVER}"]))

        async def type_(i: int) -> None:
            # 700 users start typing (7 in each of the 100 rooms), then stop, and so on: every call a change
            changed = typing.set_typing(rooms[i % 100], f"@u{(i // 100) % 7}:{SERVER}", (i // 700) % 2 == 0, 60_000)
            assert changed is not None

        async def receipt(i: int) -> None:
            row = ReceiptsRow(rooms[i % 100], "m.read", f"@u{i % 7}:{SERVER}", f"$e{i}", None, {"ts": i})
            await receipts.receive(row, i + 1)

        kinds = (
            ("baseline (table stream)", TABLE, baseline),
            ("typing", "typing", type_),
            ("receipts", "receipts", receipt),
        )
        results = {}
        for name, stream, write in kinds:
            wall, cpu = await _run(main, readers, stream, write, changes)
            results[name] = (changes / wall, cpu / changes * 1e6)
        base_rate, base_cpu = results["baseline (table stream)"]
        for name, (rate, cpu) in results.items():
            emit(
                f"{name:24} {changes:,} changes to 2 readers: {rate:,.0f}/s ({rate / base_rate:.2f}x baseline), "
                f"{cpu:,.0f} µs CPU per change ({cpu / base_cpu:.2f}x)"
            )


# -- 2. wake-up with 10,000 idle long polls -----------------------------------------------------------------


def owner(i: int) -> str:
    return f"@w{i}:bench.local"


async def build(host: Host, polls: int, owners: int, emit: Emit) -> list[RemoteRoom]:
    store = store_of(host)
    clock = Clock("ephemeral", 600, emit)
    own = [RemoteRoom(f"@c{i}:{SERVER}") for i in range(owners)]
    work = [(r.room_id, (lambda i=i, r=r: [*r.start(), r.member(owner(i), "join")])) for i, r in enumerate(own)]
    crowd = [owner(i) for i in range(owners, polls)]
    crowd_rooms = [RemoteRoom(f"@crowd{i}:{SERVER}") for i in range((len(crowd) + BATCH - 1) // BATCH)]
    work += [(r.room_id, r.start) for r in crowd_rooms]
    await persist_rounds(store, [work], clock, what="the rooms")
    joins = [
        (r.room_id, (lambda n=n, r=r: [r.member(u, "join") for u in crowd[n * BATCH : (n + 1) * BATCH]]))
        for n, r in enumerate(crowd_rooms)
    ]
    await persist_rounds(store, [joins], clock, what="the crowd's joins")
    await analyze(host)
    emit(f"built in {clock.elapsed:.0f} s: {owners} users alone in a room, {len(crowd):,} in rooms of {BATCH}")
    return own


def _typing(body: dict[str, Any], room: str) -> list[str] | None:
    part = body.get("rooms", {}).get("join", {}).get(room, {})
    for event in part.get("ephemeral", {}).get("events", []):
        if event["type"] == "m.typing":
            return list(event["content"]["user_ids"])
    return None


async def wakeups(url: str, polls: int, samples: int, emit: Emit) -> None:
    from factstream_typing import TypingWriter

    async with cluster_of(url, ("main",), http={"sync_timeout_max_seconds": 600}) as cluster:
        host = await cluster("main")
        rooms = await build(host, polls, 100, emit)
        service, api = host.sync, host.api
        since = await service.current().to_string(service.ids)
        futures = {i: asyncio.ensure_future(service.sync(owner(i), since, 600, api=api)) for i in range(polls)}
        await until(lambda: service.notifier.open_waits == polls, 600, "polls to park")
        emit(f"{polls:,} long polls parked")
        typing, store = api.state(TypingWriter), store_of(host)
        rng = random.Random(5)
        lat: dict[str, list[float]] = {"typing": [], "message (baseline)": []}
        for n in range(samples):
            i = rng.randrange(len(rooms))
            room = rooms[i]
            kind = "typing" if n % 2 else "message (baseline)"
            started = time.perf_counter()
            if kind == "typing":
                typing.set_typing(room.room_id, owner(i), owner(i) not in _current(typing, room.room_id), 600_000)
            else:
                await persist(store, room.room_id, [room.message(room.creator, n)])
            body = await asyncio.wait_for(futures[i], 10)
            lat[kind].append(time.perf_counter() - started)
            if kind == "typing":
                assert _typing(body, room.room_id) is not None, body
            futures[i] = asyncio.ensure_future(service.sync(owner(i), body["next_batch"], 600, api=api))
            await until(lambda: service.notifier.open_waits == polls, 30, "the poll to park again")
        service.notifier.close()
        await asyncio.gather(*futures.values(), return_exceptions=True)
    base = percentiles(lat["message (baseline)"])
    for kind, values in lat.items():
        p50, p99 = percentiles(values)
        emit(
            f"wake-up by {kind:18} with {polls:,} idle long polls: p50 {p50:.2f} ms, p99 {p99:.2f} ms "
            f"({p50 / base[0]:.2f}x / {p99 / base[1]:.2f}x the message's)"
        )


def _current(typing: Any, room: str) -> tuple[str, ...]:
    now = typing.view.rooms.get(room)
    return now.users if now is not None else ()


def run(url: str, *, changes: int = 2_000, polls: int = 10_000, samples: int = 200, emit: Emit = print) -> None:
    prepare(url)
    asyncio.run(delivery(url, changes, emit))
    asyncio.run(wakeups(url, polls, samples, emit))
