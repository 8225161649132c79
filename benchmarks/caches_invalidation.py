"""Cache invalidation through the whole path: write, replicate, apply on a reader.

Two real ``Host`` s (main writes, worker1 reads) on loopback TCP in one event loop (so writer,
reader and their shared core compete; PostgreSQL runs beside them). A measurement ends when the
reader's caches-stream position reaches the last ID written: rows are applied before the position
advances, so by then every invalidation has been applied.

* per-key (the baseline): transactions of 100 ``invalidate_many`` keys, one caches-stream row each;
* ``cs_cache_fake``: transactions each changing one room's state for 1,000 members (20 rows of 50);
  the reader fans each out to the room's key and to every member's key in a member cache and a
  room-member cache. Reported as member invalidations per second against the baseline's keys/s;
* wire: bytes of the RDATA lines for a 1,000-member change, against 1,000 per-key rows;
* apply: the reader's cost per token of rows, for a stream with nothing to invalidate and for a
  per-key caches row.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import factstream
from factstream import CacheSpec
from factstream.config import load_config
from factstream.host.app import Host
from factstream.plugin.manager import load_plugins
from factstream.replication import wire

MEMBERS = 1_000
KEYS_PER_TXN = 100


class BenchCaches:
    """An in-process plugin with the benchmark's caches."""

    @factstream.hookimpl
    def register_caches(self, register: Callable[[CacheSpec], None]) -> None:
        register(CacheSpec("bench_key", max_size=100_000))
        register(CacheSpec("bench_room", max_size=100_000, depends_on_room_state=True))
        register(CacheSpec("bench_member", max_size=100_000, depends_on_room_state=True, room_state_key="member"))
        register(CacheSpec("bench_room_member", max_size=100_000, key_arity=2, depends_on_room_state=True))


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@contextlib.asynccontextmanager
async def pair(url: str) -> AsyncIterator[tuple[Host, Host]]:
    port = free_port()
    hosts: list[Host] = []
    try:
        for name in ("main", "worker1"):
            settings = load_config(
                environ={},
                deployment=f"benchcaches{port}",
                instance_name=name,
                database={"url": url, "pool_size": 4},
                instance_map={
                    "main": {"host": "127.0.0.1", "replication_port": port},
                    "worker1": {"host": "127.0.0.1"},
                },
            )
            host = Host(settings, load_plugins(extra=[("bench_caches", BenchCaches())]))
            await host.start()
            hosts.append(host)
        worker = hosts[1]
        deadline = time.monotonic() + 10
        while not worker.handler.following("caches"):
            if time.monotonic() > deadline:
                raise RuntimeError("worker1 never connected")
            await asyncio.sleep(0.01)
        yield hosts[0], hosts[1]
    finally:
        for host in reversed(hosts):
            await host.stop()


async def per_key(main: Host, worker: Host, seconds: float) -> float:
    """Keys invalidated on the reader per second, ``KEYS_PER_TXN`` per transaction."""
    db = main.database()
    n = 0
    last = 0
    start = time.perf_counter()
    while time.perf_counter() - start < seconds:
        keys = [(f"@user{(n + i) % 50_000}:hs",) for i in range(KEYS_PER_TXN)]
        async with db.transaction() as txn:
            ids = await main.caches.invalidate_many(txn, "bench_key", keys)
        last = ids[-1]
        n += KEYS_PER_TXN
    if not await worker.wait_for_stream_position("main", "caches", last, timeout=120):
        raise RuntimeError("the reader did not catch up")
    return n / (time.perf_counter() - start)


async def room_state(main: Host, worker: Host, seconds: float) -> tuple[float, float]:
    """(member invalidations per second, changes per second) for 1,000-member room-state changes."""
    db = main.database()
    members = [f"@member{i}:hs" for i in range(MEMBERS)]
    room_member = worker.caches.get("bench_room_member")
    changes = 0
    last = 0
    start = time.perf_counter()
    while time.perf_counter() - start < seconds:
        room = f"!room{changes}:hs"
        for m in members[:10]:  # something to clear on the reader
            room_member.set((room, m), 1)
        async with db.transaction() as txn:
            ids = await main.caches.invalidate_room_state(txn, room, members)
        last = ids[-1]
        changes += 1
    if not await worker.wait_for_stream_position("main", "caches", last, timeout=120):
        raise RuntimeError("the reader did not catch up")
    elapsed = time.perf_counter() - start
    if len(room_member):
        raise RuntimeError("room-member keys survived the fan-out")
    return changes * MEMBERS / elapsed, changes / elapsed


def wire_bytes() -> tuple[int, int, int, int]:
    """(bytes, rows) of a 1,000-member change as cs_cache_fake rows, and as one per-key row each."""
    from factstream.caches.invalidate import room_state_rows

    ts = int(time.time() * 1000)
    token = 1_000_000
    rows = room_state_rows("!room:example.org", [f"@member{i}:hs" for i in range(MEMBERS)])
    fan_out = [
        wire.RdataCommand("caches", "main", token + i, [name, keys, ts]).to_line()
        for i, (name, keys) in enumerate(rows)
    ]
    plain = [
        wire.RdataCommand("caches", "main", token + i, ["get_rooms_for_user", [f"@member{i}:hs"], ts]).to_line()
        for i in range(MEMBERS)
    ]
    return sum(len(x) + 1 for x in fan_out), len(fan_out), sum(len(x) + 1 for x in plain), len(plain)


def apply_cost(worker: Host, rounds: int = 200_000) -> tuple[float, float]:
    """Microseconds per token in the reader's invalidation callback: another stream; one per-key row."""

    class Row:
        __slots__ = ("cache_func", "invalidation_ts", "keys")

        def __init__(self) -> None:
            self.cache_func = "bench_key"
            self.keys = ["@user1:hs"]
            self.invalidation_ts = 0

    rows_other: list[Any] = [object()]
    rows_key: list[Any] = [Row()]
    apply = worker.caches.apply_rows
    start = time.perf_counter()
    for _ in range(rounds):
        apply("notes", rows_other)
    other = (time.perf_counter() - start) / rounds * 1e6
    start = time.perf_counter()
    for _ in range(rounds):
        apply("caches", rows_key)
    key = (time.perf_counter() - start) / rounds * 1e6
    return other, key


def run(url: str, seconds: float) -> list[str]:
    async def measure() -> list[str]:
        async with pair(url) as (main, worker):
            await per_key(main, worker, 0.5)  # warm-up
            baseline = await per_key(main, worker, seconds)
            members_rate, changes_rate = await room_state(main, worker, seconds)
            other_us, key_us = apply_cost(worker)
        fan_bytes, fan_rows, plain_bytes, plain_rows = wire_bytes()
        return [
            f"per-key invalidations, {KEYS_PER_TXN} a transaction (baseline): {baseline:,.0f} keys/s",
            f"cs_cache_fake, {MEMBERS:,}-member changes: {members_rate:,.0f} member invalidations/s "
            f"({changes_rate:,.1f} changes/s), {members_rate / baseline:.2f}x the per-key baseline",
            f"wire, one {MEMBERS:,}-member change: {fan_rows} rows, {fan_bytes:,} bytes as cs_cache_fake vs "
            f"{plain_rows:,} rows, {plain_bytes:,} bytes per key ({fan_bytes / plain_bytes:.2f}x the bytes)",
            f"reader apply per token: {other_us:.2f} us for a stream without invalidations, "
            f"{key_us:.2f} us for a per-key caches row ({key_us / other_us:.1f}x)",
        ]

    return asyncio.run(measure())
