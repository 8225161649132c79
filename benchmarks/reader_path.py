"""One reader's CPU per row, in process: ``uv run python benchmarks/reader_path.py [--transport T] [--profile]``.

A real reader ``Host`` (the benchmark stream and its rows handler probe, as in ``replication_e2e``, with
every installed plugin loaded, as there) is fed RDATA runs of plain rows of one stream by a fake writer
in the same event loop: over TCP (a fake replication server on loopback) or over Redis (the fake
writer publishes packed messages, as factstream writers do; signed for ``redis+secret``). Each
chunk (``--chunk`` rows, 190 by default: what the real writer sends per pass at full speed) is sent
once the reader's rows handler has had the previous one, so the reader reads every chunk alone, as it
does behind a busy writer. Printed: CPU µs per row of this process (``time.process_time``: the fake
writer's share is a socket write or a ``PUBLISH`` per chunk; Redis itself is another process), and
wall µs per row.

The reader's path is what the replication benchmark's ratio follows (docs/benchmarks.md): the readers
share the machine's cores with the writer.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import os
import pstats
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import psycopg

from factstream.db.engine import libpq_url

sys.path.insert(0, str(Path(__file__).resolve().parent))

import replication_e2e
from replication_e2e import Probe, _settings, free_port, prepare

STREAM = "bench_e2e"


def chunks(first: int, total: int, size: int, end: bytes) -> list[tuple[int, list[bytes]]]:
    """``(last token, lines)`` per chunk: ``RDATA bench_e2e main <token> ["k"]`` for ``total`` tokens from ``first``."""
    out = []
    for start in range(first, first + total, size):
        tokens = range(start, min(start + size, first + total))
        out.append((tokens[-1], [b'RDATA %s main %d ["k"]%s' % (STREAM.encode(), t, end) for t in tokens]))
    return out


class Feeder:
    """Counts what the reader's rows handler got, and wakes the fake writer at the end of a chunk."""

    def __init__(self) -> None:
        self.last = 0
        self.rows = 0
        self.expect = 0
        self.arrived: asyncio.Event | None = None

    def rows_arrived(self, _instance: str, token: int, rows: Sequence[Any]) -> None:
        self.last = token
        self.rows += len(rows)
        if token == self.expect and self.arrived is not None:
            self.arrived.set()

    async def feed(self, send: Any, plan: list[tuple[int, list[bytes]]]) -> None:
        self.arrived = asyncio.Event()
        for last, lines in plan:
            self.expect = last
            self.arrived.clear()
            send(lines)
            try:
                await asyncio.wait_for(self.arrived.wait(), 30)
            except TimeoutError:
                raise RuntimeError(f"the reader's rows handler stopped at {self.last} (waiting for {last})") from None


async def _wait_following(host: Any, poke: Any = None) -> None:
    deadline = time.monotonic() + 20
    while not host.handler.following(STREAM):
        if time.monotonic() > deadline:
            raise RuntimeError("the reader never followed the stream")
        if poke is not None:
            poke()
        await asyncio.sleep(0.05)


async def measure(url: str, redis_url: str | None, secret: str | None, total: int, size: int, profile: bool) -> str:
    feeder = Feeder()
    probe = Probe()
    probe.callback = feeder.rows_arrived
    port = free_port()
    deployment = f"readerpath{port}"
    names = ["main", "r1"]
    settings = _settings(url, redis_url, "r1", names, port, deployment, secret)
    position = b"POSITION %s main 1 1" % STREAM.encode()
    server = None
    publisher = None
    if redis_url is None:
        if secret is not None:
            raise SystemExit("--secret is for Redis only here (over TCP it costs nothing per row)")
        writers: list[asyncio.StreamWriter] = []

        async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            writer.write(b"SERVER %s\n%s\n" % (deployment.encode(), position))
            writers.append(writer)
            while await reader.read(65536):
                pass

        server = await asyncio.start_server(serve, "127.0.0.1", port)

        def send(lines: list[bytes]) -> None:
            writers[-1].write(b"".join(lines))

        end = b"\n"
        poke = None
    else:
        from factstream.replication.auth import ReplicationSecret
        from factstream.replication.resp import RedisAddress

        address = RedisAddress.from_url(redis_url)
        _, publisher = await asyncio.open_connection(address.host, address.port)
        sign = ReplicationSecret(secret, deployment).sign if secret is not None else None
        channel = deployment.encode()

        def publish(message: bytes) -> None:
            if sign is not None:
                message = sign(message, b"main")
            assert publisher is not None
            publisher.write(
                b"*3\r\n$7\r\nPUBLISH\r\n$%d\r\n%s\r\n$%d\r\n%s\r\n" % (len(channel), channel, len(message), message)
            )

        def send(lines: list[bytes]) -> None:
            publish(b"\n".join(lines))  # packed, as between factstream processes

        end = b""

        def poke() -> None:
            publish(position)

    host = replication_e2e.Host(settings, replication_e2e.load_plugins(extra=[("bench_probe", probe)]))
    await host.start()
    replication_e2e.freeze_startup_heap()
    try:
        await _wait_following(host, poke)
        await feeder.feed(send, chunks(2, 20 * size, size, end))  # warm-up
        plan = chunks(20 * size + 2, total, size, end)
        feeder.rows = 0
        profiler = cProfile.Profile() if profile else None
        cpu, wall = time.process_time(), time.perf_counter()
        if profiler is not None:
            profiler.enable()
        await feeder.feed(send, plan)
        if profiler is not None:
            profiler.disable()
        cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    finally:
        await host.stop()
        if server is not None:
            server.close()
        if publisher is not None:
            publisher.close()
    assert feeder.rows == total, f"the rows handler saw {feeder.rows} of {total} rows"
    if profiler is not None:
        stats = pstats.Stats(profiler)
        stats.sort_stats("tottime").print_stats(25)
        stats.sort_stats("cumulative").print_stats(30)
    name = "redis" if redis_url else "tcp"
    return (
        f"{name + ('+secret' if secret else ''):12s} {total:,} rows in chunks of {size}: "
        f"CPU {cpu / total * 1e6:5.2f} µs/row, wall {wall / total * 1e6:5.2f} µs/row"
    )


def _prepare(url: str) -> None:
    """The benchmark's scratch table, its sequence at 1 (the fake writer's POSITION; RDATA is not checked)."""
    prepare(url)
    with psycopg.connect(libpq_url(url), autocommit=True) as conn:
        conn.execute("SELECT nextval('bench_e2e_seq')")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", type=int, default=570_000)
    parser.add_argument("--chunk", type=int, default=190)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--transport", choices=["tcp", "redis", "redis+secret"], action="append")
    parser.add_argument("--profile", action="store_true", help="cProfile the feeding (one run per transport)")
    args = parser.parse_args()
    server = os.environ.get("FACTSTREAM_BENCH_DATABASE_URL") or os.environ.get("FACTSTREAM_TEST_DATABASE_URL")
    redis_url = os.environ.get("FACTSTREAM_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
    if not server:
        raise SystemExit("set FACTSTREAM_BENCH_DATABASE_URL or FACTSTREAM_TEST_DATABASE_URL")
    from factstream.migrate import Migrator
    from factstream.testing import create_database, drop_database

    url = create_database(server, prefix="fs_bench")
    try:
        migrator = Migrator(url, replication_e2e.load_plugins())
        migrator.upgrade()
        migrator.close()
        transports = args.transport or ["tcp", "redis", "redis+secret"]
        for _ in range(1 if args.profile else args.repeat):
            for name in transports:
                redis = redis_url if name.startswith("redis") else None
                secret = "reader path secret" if name.endswith("+secret") else None
                _prepare(url)
                print(asyncio.run(measure(url, redis, secret, args.rows, args.chunk, args.profile)), flush=True)
    finally:
        drop_database(url)


if __name__ == "__main__":
    main()
