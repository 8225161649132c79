"""End-to-end replication on loopback: commit to reader callback, over TCP and over Redis.

The hosts are real ``Host`` objects (the same code ``factstream run`` runs). For latency and catch-up
writer and reader share one event loop (so both compete for one core); for throughput each reader
runs in its own process:

* latency: one fact per transaction at 1,000 facts/s; the reader's rows handler records the delay
  from the writer's COMMIT returning to the rows reaching it (p50, p99);
* throughput: the writer appends batches of 100 as fast as it can, in phases that alternate between
  no reader connected (the baseline) and two readers connected, each in its own process; facts/s
  delivered to the slowest reader vs the write rate alone (see ``throughput``);
* catch-up: 1,000,000 facts written while no reader runs; a reader then starts from behind (its
  position is older than the facts) and reads them from the database.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import statistics
import time
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

import msgspec
import psycopg

import factstream
from factstream import RegisterRowsHandler, RegisterStream, RowsHandlerSpec, StreamSpec, StreamTable
from factstream.config import load_config
from factstream.db.engine import libpq_url
from factstream.host.app import Host, freeze_startup_heap
from factstream.idgen.sequence import create_sequence_sql
from factstream.plugin.manager import load_plugins


class BenchRow(msgspec.Struct, frozen=True):
    key: str


BENCH_STREAM = StreamSpec(
    name="bench_e2e", row_type=BenchRow, tables=(StreamTable("bench_e2e", "instance_name", "stream_id"),)
)


class Probe:
    """A plugin (registered in-process) with the benchmark stream and a rows handler calling ``callback``."""

    def __init__(self) -> None:
        self.callback: Callable[[str, int, Sequence[Any]], None] | None = None

    @factstream.hookimpl
    def register_streams(self, register: RegisterStream) -> None:
        register(BENCH_STREAM)

    @factstream.hookimpl
    def register_rows_handlers(self, register: RegisterRowsHandler) -> None:
        register(RowsHandlerSpec(stream=BENCH_STREAM, handler=self.handle))

    def handle(self, host: Any, instance: str, token: int, rows: Sequence[BenchRow], local: bool) -> None:
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
        # Autovacuum of this table starts at moments that have nothing to do with replication and
        # takes a core for a while: whichever phase of the throughput benchmark it lands in loses.
        conn.execute("ALTER TABLE bench_e2e SET (autovacuum_enabled = false)")
        conn.execute("DROP SEQUENCE IF EXISTS bench_e2e_seq")
        for statement in create_sequence_sql("bench_e2e_seq"):
            conn.execute(statement)
        conn.execute("DELETE FROM stream_positions WHERE stream_name = 'bench_e2e'")


@contextlib.asynccontextmanager
async def cluster(
    url: str, redis_url: str | None, readers: int, probe: Probe, secret: str | None = None
) -> AsyncIterator[list[Host]]:
    """A main (writer) host and ``readers`` reader hosts, connected and ready."""
    port = free_port()
    names = ["main"] + [f"r{i}" for i in range(1, readers + 1)]
    deployment = f"bench{port}"
    hosts = []
    try:
        for name in names:
            settings = _settings(url, redis_url, name, names, port, deployment, secret)
            host = Host(settings, load_plugins(extra=[("bench_probe", probe)]))
            await host.start()
            hosts.append(host)
        for host in hosts[1:]:
            deadline = time.monotonic() + 10
            while not host.handler.following("bench_e2e"):
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{host.instance_name} never connected")
                await asyncio.sleep(0.01)
        yield hosts
    finally:
        for host in reversed(hosts):
            await host.stop()


async def latency(
    url: str, redis_url: str | None, seconds: float, rate: int = 1000, secret: str | None = None
) -> tuple[float, float, int]:
    probe = Probe()
    committed: dict[int, float] = {}
    delays: list[float] = []

    def rows_arrived(_instance: str, token: int, _rows: Sequence[Any]) -> None:
        sent = committed.get(token)
        if sent is not None:
            delays.append(time.perf_counter() - sent)

    probe.callback = rows_arrived
    async with cluster(url, redis_url, 1, probe, secret) as (main, _reader):
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


def _reader_process(
    url: str,
    redis_url: str | None,
    name: str,
    names: list[str],
    port: int,
    deployment: str,
    secret: str | None,
    pipe: Any,
    metrics: bool = True,
) -> None:
    """A reader host in its own process, driven through ``pipe`` by the throughput benchmark.

    Commands: ``("disconnect",)`` drops its replication link; ``("connect", token)`` reconnects and
    answers once it has caught up to ``token``; ``("wait", token)`` answers with the wall-clock time
    at which the rows of ``token`` reached its rows handler (waiting for them if need be: ``token`` is
    the last one written, so it is the last to arrive); ``("cpu",)`` answers the CPU seconds this
    process has used; ``("stop",)`` ends the process.
    """
    probe = Probe()
    last = [0, 0.0]  # the token of the latest rows handler call, and when it came

    def rows_arrived(_instance: str, token: int, _rows: Sequence[Any]) -> None:
        last[0] = token
        last[1] = time.time()

    probe.callback = rows_arrived

    async def position(host: Host) -> int:
        return host.id_generator("bench_e2e").get_current_token_for_writer("main")

    async def main() -> None:
        host = Host(
            _settings(url, redis_url, name, names, port, deployment, secret, metrics=metrics),
            load_plugins(extra=[("bench_probe", probe)]),
        )
        await host.start()
        freeze_startup_heap()  # as `factstream run` does
        while not host.handler.following("bench_e2e"):
            await asyncio.sleep(0.01)
        pipe.send("ready")
        while True:
            command = await asyncio.to_thread(pipe.recv)
            if command[0] == "stop":
                break
            if command[0] == "cpu":
                pipe.send(time.process_time())
            elif command[0] == "disconnect":
                await host.disconnect_replication()
                pipe.send("ok")
            elif command[0] == "connect":
                await host.connect_replication()
                while await position(host) < command[1]:
                    await asyncio.sleep(0.005)
                pipe.send("ok")
            elif command[0] == "wait":
                deadline = time.time() + 120
                while last[0] < command[1] and time.time() < deadline:
                    await asyncio.sleep(0.002)
                pipe.send(last[1] if last[0] == command[1] else float("nan"))
        await host.stop()

    asyncio.run(main())


def _settings(
    url: str,
    redis_url: str | None,
    name: str,
    names: list[str],
    port: int,
    deployment: str,
    secret: str | None,
    *,
    metrics: bool = True,
) -> Any:
    return load_config(
        environ={},
        deployment=deployment,
        instance_name=name,
        database={"url": url, "pool_size": 6},
        redis={"url": redis_url} if redis_url else {},
        instance_map={n: {"host": "127.0.0.1", "replication_port": port} for n in names},
        stream_writers={"bench_e2e": ["main"]},
        replication={"secret": secret} if secret else {},
        metrics={"enabled": metrics},
    )


async def throughput(
    url: str,
    redis_url: str | None,
    seconds: float,
    rounds: int = 4,
    secret: str | None = None,
    *,
    metrics: bool = True,
    cpu: dict[str, float] | None = None,
) -> tuple[float, float, float, list[float]]:
    """``(writes alone, writes with two readers, delivered to the slowest reader, per-round ratios)``.

    ``cpu``, when given, receives the CPU seconds spent during the "readers" phases by this process
    (the writer host: ``main``) and by the two reader processes together (``readers``), and the facts
    written in those phases (``facts``): CPU per fact is the figure that holds on any machine.

    Rates are facts/s; a round's ratio is its delivered rate over the write rate of the "alone" phase
    just before it, which shows how much the figures move within one run.

    One writer appends batches of 100 as fast as it can. Two reader hosts run in their own
    processes. The phases alternate, ``rounds`` times each, ``seconds / (2 * rounds)`` seconds long,
    so that both see the same drift of the disk's commit latency. In an "alone" phase the readers
    are disconnected and the writer knows it (no peers: it streams nothing). In a "readers" phase the
    readers have first caught up; a phase's delivery time runs from its first write to the moment
    the slowest reader's rows handler got the phase's last fact.
    """
    import multiprocessing

    port = free_port()
    deployment = f"bench{port}"
    names = ["main", "r1", "r2"]
    main = Host(
        _settings(url, redis_url, "main", names, port, deployment, secret, metrics=metrics),
        load_plugins(extra=[("bench_probe", Probe())]),
    )
    await main.start()
    ctx = multiprocessing.get_context("spawn")
    procs = []

    async def ask(command: tuple[Any, ...]) -> list[Any]:
        for _, pipe in procs:
            pipe.send(command)
        return [await asyncio.to_thread(pipe.recv) for _, pipe in procs]

    try:
        for name in names[1:]:
            ours, theirs = ctx.Pipe()
            proc = ctx.Process(
                target=_reader_process,
                args=(url, redis_url, name, names, port, deployment, secret, theirs, metrics),
            )
            proc.start()
            procs.append((proc, ours))
        for _, pipe in procs:
            if not await asyncio.to_thread(pipe.poll, 60):
                raise RuntimeError("a reader did not start")
            pipe.recv()
        gen = main.id_generator("bench_e2e")
        db = main.database()
        rows = [{"key": "k"}] * 100
        phase = seconds / (2 * rounds)

        async def write_for(duration: float) -> tuple[int, float, float]:
            written = 0
            start = time.time()
            while time.time() - start < duration:
                async with db.transaction() as txn:
                    await gen.append_many_txn(txn, "bench_e2e", rows)
                written += 100
            return written, start, time.time()

        alone = [0, 0.0]
        together = [0, 0.0]
        delivered = [0, 0.0]
        ratios = []
        for _ in range(rounds):
            await ask(("disconnect",))
            while main.transport is not None and main.transport.has_peers():
                await asyncio.sleep(0.05)
            if redis_url:
                await asyncio.sleep(1.5)  # the peer count is polled once a second: let it settle
            n, start, end = await write_for(phase)
            alone[0] += n
            alone[1] += end - start
            alone_rate = n / (end - start)

            await ask(("connect", gen.get_current_token()))
            readers_before = sum(await ask(("cpu",)))
            main_before = time.process_time()
            n, start, end = await write_for(phase)
            together[0] += n
            together[1] += end - start
            arrived = await ask(("wait", gen.get_current_token()))
            if cpu is not None:
                cpu["main"] = cpu.get("main", 0.0) + time.process_time() - main_before
                cpu["readers"] = cpu.get("readers", 0.0) + sum(await ask(("cpu",))) - readers_before
                cpu["facts"] = cpu.get("facts", 0.0) + n
            delivered[0] += n
            delivered[1] += max(arrived) - start
            ratios.append(n / (max(arrived) - start) / alone_rate)
        for _, pipe in procs:
            pipe.send(("stop",))
        return alone[0] / alone[1], together[0] / together[1], delivered[0] / delivered[1], ratios
    finally:
        for proc, _ in procs:
            proc.join(timeout=30)
            if proc.is_alive():
                proc.kill()
        await main.stop()


async def catch_up(url: str, redis_url: str | None, facts: int) -> float:
    """A running reader loses its link while ``facts`` are written, then reconnects and catches up."""
    probe = Probe()
    count = [0]

    def rows_arrived(_instance: str, _token: int, rows: Sequence[Any]) -> None:
        count[0] += len(rows)

    probe.callback = rows_arrived
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
        while reader.id_generator("bench_e2e").get_current_token_for_writer("main") < target:
            await asyncio.sleep(0.005)
        elapsed = time.perf_counter() - start
    assert count[0] == facts, f"the reader saw {count[0]} of {facts} facts"
    return count[0] / elapsed


#: The replication secret of the ``+secret`` runs (TCP handshake, signed Redis messages).
BENCH_SECRET = "benchmark replication secret"


def run(url: str, redis_url: str | None, seconds: float = 3.0, catch_up_facts: int = 1_000_000) -> list[str]:
    """Each transport without and with ``replication.secret`` (catch-up reads the database: without only)."""
    lines = []
    for name, transport, secret in (
        ("tcp", None, None),
        ("tcp+secret", None, BENCH_SECRET),
        ("redis", redis_url, None),
        ("redis+secret", redis_url, BENCH_SECRET),
    ):
        if transport is None and name.startswith("redis"):
            lines.append(f"{name}: skipped (no Redis URL)")
            continue
        prepare(url)
        p50, p99, n = asyncio.run(latency(url, transport, seconds, secret=secret))
        lines.append(
            f"{name:12s} latency at 1,000 facts/s: p50 {p50:6.2f} ms  p99 {p99:6.2f} ms  "
            f"({n} facts; target p99 <= 5 ms)"
        )
        prepare(url)
        alone, written, delivered, ratios = asyncio.run(throughput(url, transport, 2 * seconds, secret=secret))
        lines.append(
            f"{name:12s} throughput: writes alone {alone:9,.0f}/s; with 2 readers writes {written:9,.0f}/s, "
            f"delivered {delivered:9,.0f}/s per reader = {delivered / alone:4.2f}x the write rate alone "
            f"(rounds {min(ratios):.2f}x-{max(ratios):.2f}x; targets >= 20,000/s and >= 0.8x)"
        )
        if secret is not None:
            continue
        prepare(url)
        rate = asyncio.run(catch_up(url, transport, catch_up_facts))
        lines.append(f"{name:12s} catch-up of {catch_up_facts:,} facts: {rate:9,.0f} facts/s (target >= 100,000/s)")
    return lines


def metrics_ab(url: str, redis_url: str | None, seconds: float = 3.0, rounds: int = 4) -> list[str]:
    """Throughput with ``metrics.enabled`` off and on, alternating (off, on, off, on ...) in one run so
    that both see the same drift of the machine; the ratio is on over off (target >= 0.97).

    Delivered facts/s on a machine of few cores moves by more than the 3% looked for from one round to
    the next (writer, readers and PostgreSQL share the cores), so each line also gives the CPU per fact
    of the writer's process and of the readers' (the counting is CPU work: its share of that is the
    figure that holds on any machine), summed over all rounds of each side.
    """
    lines = []
    for name, transport in (("tcp", None), ("redis", redis_url)):
        if transport is None and name == "redis":
            continue
        rates: dict[bool, list[float]] = {False: [], True: []}
        cpu: dict[bool, dict[str, float]] = {False: {}, True: {}}
        for _ in range(rounds):
            for enabled in (False, True):
                prepare(url)
                _alone, _written, delivered, _ratios = asyncio.run(
                    throughput(url, transport, 2 * seconds, metrics=enabled, cpu=cpu[enabled])
                )
                rates[enabled].append(delivered)
        off, on = statistics.median(rates[False]), statistics.median(rates[True])

        def per_fact(side: bool, who: str, cpu: dict[bool, dict[str, float]] = cpu) -> float:
            return cpu[side][who] / cpu[side]["facts"] * 1e6

        lines.append(
            f"{name:12s} metrics on/off: delivered {on:9,.0f}/s on, {off:9,.0f}/s off = {on / off:4.2f}x "
            f"(rounds on {', '.join(f'{r:,.0f}' for r in rates[True])}; "
            f"off {', '.join(f'{r:,.0f}' for r in rates[False])}; target >= 0.97x)"
        )
        for who, what in (("main", "writer process"), ("readers", "2 reader processes")):
            lines.append(
                f"{name:12s} CPU per fact, {what}: {per_fact(True, who):6.2f} us on, {per_fact(False, who):6.2f} us "
                f"off = {per_fact(True, who) / per_fact(False, who):4.3f}x (target <= 1.03x)"
            )
    return lines
