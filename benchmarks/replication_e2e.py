"""End-to-end replication on loopback: commit to reader callback, over TCP and over Redis.

The hosts are real ``Host`` objects (the same code ``factstream run`` runs) sharing one event loop,
so writer and readers compete for one core as they would on a busy machine:

* latency: one fact per transaction at 1,000 facts/s; the reader's ``on_rows`` records the delay
  from the writer's COMMIT returning to the rows reaching it (p50, p99);
* throughput: the writer appends batches of 100 as fast as it can for a while, first with no readers
  (the baseline) and then with two readers; facts/s delivered to the readers vs the write rate;
* catch-up: 1,000,000 facts written while no reader runs; a reader then starts from behind (its
  position is older than the facts) and reads them from the database.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import statistics
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import msgspec
import psycopg

import factstream
from factstream import StreamSpec, StreamTable
from factstream.config import load_config
from factstream.db.engine import libpq_url
from factstream.host.app import Host
from factstream.idgen import create_sequence_sql
from factstream.plugins import load_plugins


class BenchRow(msgspec.Struct, frozen=True):
    key: str


class Probe:
    """A plugin (registered in-process) with the benchmark stream and a row callback."""

    def __init__(self) -> None:
        self.callback: Callable[[str, int, list[Any]], None] | None = None

    @factstream.hookimpl
    def register_streams(self, register: Callable[[StreamSpec], None]) -> None:
        register(
            StreamSpec(
                name="bench_e2e", row_type=BenchRow, tables=(StreamTable("bench_e2e", "instance_name", "stream_id"),)
            )
        )

    @factstream.hookimpl
    def on_rows(self, host: Any, stream: str, instance: str, token: int, rows: list[Any]) -> None:
        if self.callback is not None:
            self.callback(host.instance_name, token, rows)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def prepare(url: str) -> None:
    with psycopg.connect(libpq_url(url), autocommit=True) as conn:
        conn.execute("DROP TABLE IF EXISTS bench_e2e")
        conn.execute(
            "CREATE TABLE bench_e2e (stream_id BIGINT NOT NULL, instance_name TEXT NOT NULL, key TEXT NOT NULL)"
        )
        conn.execute("CREATE INDEX bench_e2e_id ON bench_e2e (stream_id)")
        conn.execute("DROP SEQUENCE IF EXISTS bench_e2e_seq")
        for statement in create_sequence_sql("bench_e2e_seq"):
            conn.execute(statement)
        conn.execute("DELETE FROM stream_positions WHERE stream_name = 'bench_e2e'")


@contextlib.asynccontextmanager
async def cluster(url: str, redis_url: str | None, readers: int, probe: Probe) -> AsyncIterator[list[Host]]:
    """A main (writer) host and ``readers`` reader hosts, connected and ready."""
    port = free_port()
    names = ["main"] + [f"r{i}" for i in range(1, readers + 1)]
    deployment = f"bench{port}"
    hosts = []
    try:
        for name in names:
            settings = load_config(
                environ={},
                deployment=deployment,
                instance_name=name,
                database={"url": url, "pool_size": 6},
                redis={"url": redis_url} if redis_url else {},
                instance_map={n: {"host": "127.0.0.1", "replication_port": port} for n in names},
                stream_writers={"bench_e2e": ["main"]},
            )
            host = Host(settings, load_plugins(extra=[("bench_probe", probe)]))
            await host.start()
            hosts.append(host)
        for host in hosts[1:]:
            deadline = time.monotonic() + 10
            while not any("bench_e2e" in s for s in host.handler._connected.values()):
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{host.instance_name} never connected")
                await asyncio.sleep(0.01)
        yield hosts
    finally:
        for host in reversed(hosts):
            await host.stop()


async def latency(url: str, redis_url: str | None, seconds: float, rate: int = 1000) -> tuple[float, float, int]:
    probe = Probe()
    committed: dict[int, float] = {}
    delays: list[float] = []

    def on_rows(_instance: str, token: int, _rows: list[Any]) -> None:
        sent = committed.get(token)
        if sent is not None:
            delays.append(time.perf_counter() - sent)

    probe.callback = on_rows
    async with cluster(url, redis_url, 1, probe) as (main, _reader):
        gen = main.id_generator("bench_e2e")
        db = main.database()
        interval = 1.0 / rate
        start = time.perf_counter()
        n = 0
        while time.perf_counter() - start < seconds:
            async with db.transaction() as txn:
                token = await gen.append_txn(txn, "bench_e2e", {"key": "k"})
            committed[token] = time.perf_counter()
            n += 1
            delay = start + n * interval - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
        await asyncio.sleep(0.5)
    delays.sort()
    p50 = statistics.median(delays) * 1000
    p99 = delays[int(len(delays) * 0.99) - 1] * 1000
    return p50, p99, len(delays)


async def throughput(url: str, redis_url: str | None, seconds: float, readers: int) -> tuple[float, float]:
    """(write rate, delivered rate per reader) for batches of 100."""
    probe = Probe()
    delivered: dict[str, int] = {}
    last_seen: dict[str, float] = {}

    def on_rows(instance: str, _token: int, rows: list[Any]) -> None:
        delivered[instance] = delivered.get(instance, 0) + len(rows)
        last_seen[instance] = time.perf_counter()

    probe.callback = on_rows
    rows = [{"key": "k"}] * 100
    async with cluster(url, redis_url, readers, probe) as hosts:
        main = hosts[0]
        gen = main.id_generator("bench_e2e")
        db = main.database()
        written = 0
        start = time.perf_counter()
        while time.perf_counter() - start < seconds:
            async with db.transaction() as txn:
                await gen.append_many_txn(txn, "bench_e2e", rows)
            written += 100
        write_time = time.perf_counter() - start
        deadline = time.perf_counter() + 60
        while readers and min(delivered.get(h.instance_name, 0) for h in hosts[1:]) < written:
            if time.perf_counter() > deadline:
                break
            await asyncio.sleep(0.01)
    if not readers:
        return written / write_time, 0.0
    slowest = min(
        delivered.get(f"r{i}", 0) / (last_seen.get(f"r{i}", start + 1e9) - start) for i in range(1, readers + 1)
    )
    return written / write_time, slowest


async def catch_up(url: str, redis_url: str | None, facts: int) -> float:
    """A running reader loses its link while ``facts`` are written, then reconnects and catches up."""
    probe = Probe()
    count = [0]

    def on_rows(_instance: str, _token: int, rows: list[Any]) -> None:
        count[0] += len(rows)

    probe.callback = on_rows
    async with cluster(url, redis_url, 1, probe) as (main, reader):
        await reader.disconnect_replication()
        gen = main.id_generator("bench_e2e")
        db = main.database()
        rows = [{"key": "k"}] * 1000
        for _ in range(facts // 1000):
            async with db.transaction() as txn:
                await gen.append_many_txn(txn, "bench_e2e", rows)
        target = gen.get_current_token()
        count[0] = 0
        start = time.perf_counter()
        await reader.connect_replication()
        while reader.id_generator("bench_e2e").get_current_token_for_writer("main") < target:  # noqa: ASYNC110
            await asyncio.sleep(0.005)
        elapsed = time.perf_counter() - start
    assert count[0] == facts, f"the reader saw {count[0]} of {facts} facts"
    return count[0] / elapsed


def run(url: str, redis_url: str | None, seconds: float = 3.0, catch_up_facts: int = 1_000_000) -> list[str]:
    lines = []
    for name, transport in (("tcp", None), ("redis", redis_url)):
        if name == "redis" and not transport:
            lines.append("redis: skipped (no Redis URL)")
            continue
        prepare(url)
        p50, p99, n = asyncio.run(latency(url, transport, seconds))
        lines.append(
            f"{name:5s} latency at 1,000 facts/s: p50 {p50:6.2f} ms  p99 {p99:6.2f} ms  ({n} facts; target p99 <= 5 ms)"
        )
        prepare(url)
        alone, _ = asyncio.run(throughput(url, transport, seconds, 0))
        prepare(url)
        written, delivered = asyncio.run(throughput(url, transport, seconds, 2))
        lines.append(
            f"{name:5s} throughput: writes alone {alone:9,.0f}/s; with 2 readers writes {written:9,.0f}/s, "
            f"delivered {delivered:9,.0f}/s per reader = {delivered / alone:4.2f}x the write rate alone "
            "(targets >= 20,000/s and >= 0.8x)"
        )
        prepare(url)
        rate = asyncio.run(catch_up(url, transport, catch_up_facts))
        lines.append(f"{name:5s} catch-up of {catch_up_facts:,} facts: {rate:9,.0f} facts/s (target >= 100,000/s)")
    return lines
