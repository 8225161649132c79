"""/sync wake-up latency and memory with many idle long polls.

One host (instance ``main``) writes a synced stream whose rows belong to users (``user_field``). A
sample: commit one row for a random user whose long poll is parked, and time until that poll's
response is complete; the poll is then parked again, so the number of idle polls stays constant.

* **service level** (``SyncService.sync``, the whole /sync handler minus HTTP, in process):
  10,000 idle polls. Memory per idle poll from ``tracemalloc`` (Python allocations while parking
  them). Baseline: the same wake-ups with one poll open, so the ratio shows what the idle polls cost
  a wake-up.
* **HTTP** (uvicorn on loopback, the client in a separate process holding one keep-alive connection
  per poll, so each process stays under its file-descriptor limit): 10,000 idle polls. Memory per
  idle poll is the server process's RSS growth while they were parked (connections, request tasks,
  Starlette requests, notifier state). Latency runs from the commit (wall clock, same machine) to
  the client having read the whole response.

The write's own commit is not in the latency: the clock starts after it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import socket
import statistics
import sys
import tempfile
import time
import tracemalloc
from collections.abc import AsyncIterator, Callable
from typing import Any

import msgspec

import factstream
from factstream import RegisterStream, StreamSpec, StreamTable
from factstream.config import load_config
from factstream.host.app import Host
from factstream.plugin.manager import load_plugins

POLLS = 10_000
SAMPLES = 200
TABLE = "bench_sync"


class BenchRow(msgspec.Struct, frozen=True):
    user_id: str
    body: str


class BenchSync:
    """An in-process plugin: one synced stream whose rows belong to ``user_id``."""

    @factstream.hookimpl
    def register_streams(self, register: RegisterStream) -> None:
        register(
            StreamSpec(
                name=TABLE,
                row_type=BenchRow,
                tables=(StreamTable(TABLE, "instance_name", "stream_id"),),
                sync_key="bench_sync_key",
                user_field="user_id",
            )
        )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def user(i: int) -> str:
    return f"@u{i}:bench"


def prepare(url: str) -> None:
    import psycopg

    from factstream.db.engine import libpq_url

    with psycopg.connect(libpq_url(url), autocommit=True) as conn:
        conn.execute(f"DROP TABLE IF EXISTS {TABLE}")
        conn.execute(f"DROP SEQUENCE IF EXISTS {TABLE}_seq")
        conn.execute(
            f"CREATE TABLE {TABLE} (stream_id BIGINT NOT NULL UNIQUE, instance_name TEXT NOT NULL, "
            "user_id TEXT NOT NULL, body TEXT NOT NULL)"
        )
        conn.execute(f"CREATE INDEX {TABLE}_user ON {TABLE} (user_id, stream_id)")
        conn.execute(f"CREATE SEQUENCE {TABLE}_seq")
        conn.execute(f"SELECT nextval('{TABLE}_seq')")
        conn.execute("DELETE FROM sync_token_keys WHERE sync_key = 'bench_sync_key'")


@contextlib.asynccontextmanager
async def bench_host(
    url: str, http_port: int | None = None, users: int = 0, *, metrics: bool = True
) -> AsyncIterator[Host]:
    settings = load_config(
        environ={},
        deployment="bench-sync",
        instance_name="main",
        state_dir=tempfile.mkdtemp(prefix="factstream-bench-sync-"),
        database={"url": url},
        stream_writers={TABLE: ["main"]},
        http={
            "port": http_port or 0,
            "sync_timeout_max_seconds": 600,
            "token_table": False,
            "tokens": {f"t{i}": {"user": user(i)} for i in range(users)},
        },
        metrics={"enabled": metrics},
    )
    host = Host(settings, load_plugins(extra=[("benchsync", BenchSync())]))
    await host.start()
    try:
        yield host
    finally:
        await host.stop()


async def write(host: Host, who: str) -> float:
    """Commit one row for ``who``; returns the wall-clock time right after the commit."""
    async with host.database().transaction() as txn:
        await host.api.stream(TABLE, BenchRow).append(txn, BenchRow(user_id=who, body="ping"))
    return time.time()


async def until(predicate: Callable[[], bool], timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        await asyncio.sleep(0.01)


def percentiles(latencies: list[float]) -> tuple[float, float]:
    ordered = sorted(latencies)
    p50 = statistics.median(ordered)
    p99 = ordered[min(len(ordered) - 1, round(0.99 * (len(ordered) - 1)))]
    return p50 * 1000, p99 * 1000


# -- service level -------------------------------------------------------------------------------------------


async def service_level(url: str, polls: int, samples: int, *, measure_memory: bool) -> dict[str, Any]:
    async with bench_host(url) as host:
        service = host.sync
        since = await service.current().to_string(service.ids)
        futures: dict[int, asyncio.Future[dict[str, Any]]] = {}
        if measure_memory:
            tracemalloc.start()
            before = tracemalloc.get_traced_memory()[0]
        for i in range(polls):
            futures[i] = asyncio.ensure_future(service.sync(user(i), since, 600, api=host.api))
        await until(lambda: service.notifier.open_waits == polls, 120, "polls to park")
        await until(lambda: sum(service.notifier.listening(user(i)) for i in range(polls)) == polls, 60, "listeners")
        per_poll = 0.0
        if measure_memory:
            per_poll = (tracemalloc.get_traced_memory()[0] - before) / polls
            tracemalloc.stop()
        rng = random.Random(7)
        latencies = []
        for _ in range(samples):
            i = rng.randrange(polls)
            committed = await write(host, user(i))
            response = await asyncio.wait_for(futures[i], 10)
            latencies.append(time.time() - committed)
            assert [item["body"] for item in response["streams"][TABLE]] == ["ping"], response
            futures[i] = asyncio.ensure_future(service.sync(user(i), response["next_batch"], 600, api=host.api))
            await until(lambda: service.notifier.open_waits == polls, 10, "the poll to park again")
        others_done = sum(1 for f in futures.values() if f.done())
        service.notifier.close()
        await asyncio.gather(*futures.values())
    p50, p99 = percentiles(latencies)
    return {"p50": p50, "p99": p99, "per_poll": per_poll, "stray": others_done}


# -- HTTP, with the client in another process ----------------------------------------------------------------


async def _client(port: int, polls: int, since: str) -> None:
    """The client process: one keep-alive connection and one parked /sync per user; prints each wake-up."""
    out = sys.stdout

    async def read_response(reader: asyncio.StreamReader) -> bytes:
        head = await reader.readuntil(b"\r\n\r\n")
        length = 0
        for line in head.split(b"\r\n"):
            if line.lower().startswith(b"content-length:"):
                length = int(line.split(b":", 1)[1])
        return await reader.readexactly(length)

    def request(i: int, token: str) -> bytes:
        return (
            f"GET /sync?since={token}&timeout=600000 HTTP/1.1\r\nHost: bench\r\nAuthorization: Bearer t{i}\r\n\r\n"
        ).encode()

    async def poll(i: int, opened: asyncio.Semaphore) -> None:
        async with opened:
            reader, writer = await asyncio.open_connection("127.0.0.1", port)
        token = since
        while True:
            writer.write(request(i, token))
            body = await read_response(reader)
            done = time.time()
            data = json.loads(body)
            if data["streams"]:
                out.write(f"{i} {done!r}\n")
                out.flush()
            token = data["next_batch"]

    opened = asyncio.Semaphore(200)
    tasks = [asyncio.ensure_future(poll(i, opened)) for i in range(polls)]
    await asyncio.gather(*tasks)


async def http_level(url: str, polls: int, samples: int, *, metrics: bool = True) -> dict[str, Any]:
    port = free_port()
    async with bench_host(url, http_port=port, users=polls, metrics=metrics) as host:
        service = host.sync
        since = await service.current().to_string(service.ids)
        rss_before = rss_bytes()
        client = await asyncio.create_subprocess_exec(
            sys.executable,
            __file__,
            "--client",
            str(port),
            str(polls),
            since,
            stdout=asyncio.subprocess.PIPE,
        )
        try:
            await until(lambda: service.notifier.open_waits == polls, 300, "HTTP polls to park")
            await asyncio.sleep(1.0)
            per_poll = (rss_bytes() - rss_before) / polls
            rng = random.Random(11)
            latencies = []
            assert client.stdout is not None
            for _ in range(samples):
                i = rng.randrange(polls)
                committed = await write(host, user(i))
                line = await asyncio.wait_for(client.stdout.readline(), 10)
                woken, at = line.decode().split()
                assert int(woken) == i, (woken, i)
                latencies.append(float(at) - committed)
                await until(lambda: service.notifier.open_waits == polls, 10, "the HTTP poll to park again")
        finally:
            client.terminate()
            await client.wait()
    p50, p99 = percentiles(latencies)
    return {"p50": p50, "p99": p99, "per_poll": per_poll}


def run(url: str, polls: int = POLLS, samples: int = SAMPLES) -> list[str]:
    """Run every measurement on the migrated database ``url``; returns report lines."""
    prepare(url)
    lines = []
    base = asyncio.run(service_level(url, 1, samples, measure_memory=False))
    many = asyncio.run(service_level(url, polls, samples, measure_memory=True))
    lines.append(f"service level, 1 open poll (baseline): wake-up p50 {base['p50']:.2f} ms, p99 {base['p99']:.2f} ms")
    lines.append(
        f"service level, {polls:,} idle polls: wake-up p50 {many['p50']:.2f} ms "
        f"({many['p50'] / base['p50']:.2f}x baseline), p99 {many['p99']:.2f} ms "
        f"({many['p99'] / base['p99']:.2f}x); others woken: {many['stray']}; "
        f"{many['per_poll'] / 1024:.1f} KiB Python memory per idle poll"
    )
    http = asyncio.run(http_level(url, polls, samples))
    lines.append(
        f"HTTP (uvicorn, loopback), {polls:,} idle keep-alive polls: wake-up p50 {http['p50']:.2f} ms "
        f"({http['p50'] / base['p50']:.2f}x baseline), p99 {http['p99']:.2f} ms; "
        f"{http['per_poll'] / 1024:.1f} KiB server RSS per idle poll"
    )
    return lines


def metrics_ab(url: str, polls: int = POLLS, samples: int = SAMPLES, rounds: int = 2) -> list[str]:
    """HTTP wake-ups with ``metrics.enabled`` off and on, alternating in one run; the ratio is the p50
    latency on over off (target <= 1.03: no more than 3% slower)."""
    prepare(url)
    p50s: dict[bool, list[float]] = {False: [], True: []}
    for _ in range(rounds):
        for enabled in (False, True):
            p50s[enabled].append(asyncio.run(http_level(url, polls, samples, metrics=enabled))["p50"])
    off, on = statistics.median(p50s[False]), statistics.median(p50s[True])
    return [
        f"HTTP /sync wake-up, {polls:,} idle polls, metrics on/off: p50 {on:.2f} ms on, {off:.2f} ms off = "
        f"{on / off:.2f}x (rounds on {', '.join(f'{p:.2f}' for p in p50s[True])}; "
        f"off {', '.join(f'{p:.2f}' for p in p50s[False])}; target <= 1.03x)"
    ]


if __name__ == "__main__":
    if len(sys.argv) >= 2 and sys.argv[1] == "--client":
        asyncio.run(_client(int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]))
    else:
        bench_url = os.environ["FACTSTREAM_BENCH_DATABASE_URL"]
        for report in run(bench_url, int(os.environ.get("BENCH_POLLS", POLLS))):
            print(report, flush=True)
