"""Events stream replication to two readers (issue 32), against the write rate alone.

The writer is a real ``Host`` (instance ``main``, writer of ``events`` and ``backfill``) in this
process, driven through ``EventsStore``; each of the two readers is a real ``Host`` with every
installed plugin (the events plugin's reader side included) in its own process, as in
``replication_e2e.throughput``. Two workloads, each in phases that alternate between the readers
disconnected (the baseline: the writer knows it and streams nothing) and both readers connected
(caught up before the phase starts):

* **remote**: batches of 100 events through ``EventsStore.persist_remote`` into four rooms at once
  (``events_storage.RemoteSender``: 95 messages and 5 joins of new members a batch, made before the
  phase starts), so rows are ``ev`` rows and a few ``state`` rows;
* **local**: ``EventsStore.send`` of one message per transaction, one task in each of four rooms.

For each: events/s written alone; events/s written with the readers and delivered to the slowest
reader (from the phase's first write to the moment the last reader's rows handler got the phase's
last event); their ratio; **reader CPU per row** (``time.process_time`` of the reader process from
the phase's start until at most 2 ms after its last row, over the rows its handler got in that time:
everything that process did to receive them), also net of the CPU the reader spends connected with
nothing written (measured once, 1 s, and printed); and the writer's CPU per event (its process,
during the writes) alone and with the readers. Rows are counted by a rows handler of the ``events``
stream registered in the readers (one Python call per token, next to the events plugin's own
handler, and no clock but ``time.time``).

``uv run python benchmarks/run.py --only events-replication --seconds S``: each workload writes for
``2 x S`` seconds, in four pairs of phases, over TCP and then over Redis; under two minutes at S = 3.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import os
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from events_storage import BATCH, RemoteSender, analyze, store_of, verdict

import factstream
from factstream import RegisterRowsHandler, RowsHandlerSpec
from factstream.config import load_config
from factstream.host.app import Host, freeze_startup_heap
from factstream.plugin.manager import load_plugins
from factstream.testing import HostCluster

Emit = Callable[[str], None]

READERS = ("r1", "r2")
ROOMS = 4
LOCAL_SENDER = "@bench:local"


# -- the readers --------------------------------------------------------------------------------------------


class RowCounter:
    """A plugin (registered in the reader processes) counting the ``events`` stream's rows as they arrive."""

    def __init__(self) -> None:
        self.rows = 0
        self.token = 0
        self.at = 0.0  # wall clock of the latest call

    @factstream.hookimpl
    def register_rows_handlers(self, register: RegisterRowsHandler) -> None:
        from factstream_events import EVENTS_STREAM_SPEC

        register(RowsHandlerSpec(stream=EVENTS_STREAM_SPEC, handler=self.handle))

    def handle(self, _host: Any, _instance: str, token: int, rows: Sequence[Any], _local: bool) -> None:
        self.rows += len(rows)
        self.token = token
        # No CPU clock here: ``time.process_time`` is a system call (28 us on the 2-core machine).
        self.at = time.time()


def _reader_process(config: dict[str, Any], pipe: Any) -> None:
    """A reader host in its own process, driven through ``pipe``.

    Commands: ``("disconnect",)`` drops its replication link; ``("connect", token)`` reconnects, answers
    once it has caught up to ``token`` and starts counting rows and CPU from there; ``("wait", token)``
    waits until the rows of ``token`` (the last written) reached it and answers ``(wall clock of their
    arrival, rows since the connect, CPU seconds and seconds since the connect)``, at most 2 ms after the
    last row (the poll's step: its CPU and the idle CPU of those ms are counted);
    ``("idle", seconds)`` answers the CPU seconds a second it spends connected with nothing written,
    over ``seconds``; ``("stop",)`` ends the process.
    """
    counter = RowCounter()

    async def main() -> None:
        host = Host(load_config(environ={}, **config), load_plugins(extra=[("bench_counter", counter)]))
        await host.start()
        freeze_startup_heap()  # as `factstream run` does
        assert host.handler is not None
        while not host.handler.following("events"):
            await asyncio.sleep(0.01)
        pipe.send("ready")
        rows0, cpu0, wall0 = 0, 0.0, 0.0
        while True:
            command = await asyncio.to_thread(pipe.recv)
            if command[0] == "stop":
                break
            if command[0] == "disconnect":
                await host.disconnect_replication()
                pipe.send("ok")
            elif command[0] == "connect":
                await host.connect_replication()
                while host.id_generator("events").get_current_token_for_writer("main") < command[1]:
                    await asyncio.sleep(0.005)
                rows0, cpu0, wall0 = counter.rows, time.process_time(), time.time()
                pipe.send("ok")
            elif command[0] == "wait":
                deadline = time.time() + 120
                while counter.token < command[1] and time.time() < deadline:
                    await asyncio.sleep(0.002)
                cpu, wall = time.process_time(), time.time()
                arrived = counter.at if counter.token >= command[1] else math.nan
                pipe.send((arrived, counter.rows - rows0, cpu - cpu0, wall - wall0))
            elif command[0] == "idle":
                cpu, wall = time.process_time(), time.time()
                await asyncio.sleep(command[1])
                pipe.send((time.process_time() - cpu) / (time.time() - wall))
        await host.stop()

    asyncio.run(main())


class Readers:
    """The reader processes of one transport, each answering the commands of :func:`_reader_process`."""

    def __init__(self, cluster: HostCluster) -> None:
        import multiprocessing

        ctx = multiprocessing.get_context("spawn")
        self.procs = []
        for name in READERS:
            ours, theirs = ctx.Pipe()
            proc = ctx.Process(target=_reader_process, args=(cluster.config(name), theirs))
            proc.start()
            self.procs.append((proc, ours))

    async def ready(self) -> None:
        for _, pipe in self.procs:
            if not await asyncio.to_thread(pipe.poll, 120):
                raise RuntimeError("a reader did not start")
            pipe.recv()

    async def ask(self, *command: Any) -> list[Any]:
        for _, pipe in self.procs:
            pipe.send(command)
        return [await asyncio.to_thread(pipe.recv) for _, pipe in self.procs]

    def stop(self) -> None:
        for proc, pipe in self.procs:
            if proc.is_alive():
                with contextlib.suppress(OSError):
                    pipe.send(("stop",))
        for proc, _ in self.procs:
            proc.join(timeout=30)
            if proc.is_alive():
                proc.kill()


# -- the writer's workloads -----------------------------------------------------------------------------------


class Workload:
    """What the writer does in a phase: :meth:`prepare` (untimed), then :meth:`write` for ``seconds``."""

    name = ""

    async def start(self, store: Any) -> None:
        raise NotImplementedError

    def prepare(self, seconds: float) -> None:
        """Make what a phase of ``seconds`` may need (nothing by default)."""

    async def write(self, store: Any, seconds: float) -> int:
        """Write for ``seconds``; returns the events written."""
        raise NotImplementedError


class Remote(Workload):
    name = f"remote batches of {BATCH}, {ROOMS} rooms at once"

    def __init__(self) -> None:
        self.sender = RemoteSender(ROOMS)

    async def start(self, store: Any) -> None:
        await self.sender.start(store)
        self.sender.top_up(5)  # a warm-up
        await self.sender.run(store, 3600)

    def prepare(self, seconds: float) -> None:
        self.sender.top_up(max(2, int(seconds * 40_000 / BATCH / ROOMS)))  # more than a phase can use

    async def write(self, store: Any, seconds: float) -> int:
        before: int = self.sender.rate.count
        await self.sender.run(store, seconds)
        return int(self.sender.rate.count) - before


class Local(Workload):
    name = f"local sends, one a transaction, {ROOMS} rooms at once"

    def __init__(self) -> None:
        self.rooms: list[str] = []
        self.sent = 0

    async def start(self, store: Any) -> None:
        self.rooms = [await store.create_room(LOCAL_SENDER, preset="public_chat") for _ in range(ROOMS)]
        await self.write(store, 0.5)  # a warm-up

    async def write(self, store: Any, seconds: float) -> int:
        loop = asyncio.get_running_loop()
        stop = loop.time() + seconds
        written = [0]

        async def one(room_id: str) -> None:
            while loop.time() < stop:
                self.sent += 1
                body = {"msgtype": "m.text", "body": f"hello {self.sent}"}
                await store.send(room_id, LOCAL_SENDER, "m.room.message", body)
                written[0] += 1

        await asyncio.gather(*(one(room_id) for room_id in self.rooms))
        return written[0]


# -- the measurement ------------------------------------------------------------------------------------------


@dataclass
class Figures:
    """One workload's sums over its rounds (events, rows, seconds of wall clock and of CPU)."""

    alone: list[float] = field(default_factory=lambda: [0, 0.0, 0.0])  # events, seconds, writer CPU
    together: list[float] = field(default_factory=lambda: [0, 0.0, 0.0])  # the same, with the readers
    delivered_seconds: float = 0.0  # first write to the slowest reader's last row, summed
    reader_rows: list[int] = field(default_factory=lambda: [0] * len(READERS))
    reader_cpu: list[float] = field(default_factory=lambda: [0.0] * len(READERS))
    reader_seconds: list[float] = field(default_factory=lambda: [0.0] * len(READERS))
    ratios: list[float] = field(default_factory=list)

    def lines(self, label: str, name: str, idle: Sequence[float]) -> list[str]:
        """The workload's two lines; ``idle``: each reader's CPU seconds a second when nothing is written."""
        alone_rate = self.alone[0] / self.alone[1]
        written = self.together[0] / self.together[1]
        delivered = self.together[0] / self.delivered_seconds
        ratio = delivered / alone_rate
        per_row = [cpu / rows * 1e6 for cpu, rows in zip(self.reader_cpu, self.reader_rows, strict=True)]
        busy = [
            (cpu - rate * seconds) / rows * 1e6
            for cpu, rows, seconds, rate in zip(
                self.reader_cpu, self.reader_rows, self.reader_seconds, idle, strict=True
            )
        ]
        rows_per_event = sum(self.reader_rows) / len(READERS) / self.together[0]
        writer_alone = self.alone[2] / self.alone[0] * 1e6
        writer_with = self.together[2] / self.together[0] * 1e6
        return [
            f"{label:6s} {name}: writes alone {alone_rate:7,.0f} events/s; with 2 readers writes {written:7,.0f}/s, "
            f"delivered {delivered:7,.0f}/s to the slowest = {ratio:4.2f}x the write rate alone (target >= 0.8x: "
            f"{verdict(ratio >= 0.8)}; rounds {min(self.ratios):.2f}x-{max(self.ratios):.2f}x)",
            f"{label:6s} {name}: reader CPU {sum(per_row) / len(per_row):5.1f} us/row (readers "
            f"{min(per_row):.1f}-{max(per_row):.1f}; {sum(busy) / len(busy):.1f} net of idle; "
            f"{rows_per_event:.2f} rows/event); writer CPU "
            f"{writer_alone:6.1f} us/event alone, {writer_with:6.1f} with 2 readers "
            f"({writer_with - writer_alone:+.1f})",
        ]


async def _timed(write: Callable[[], Awaitable[int]]) -> tuple[int, float, float, float]:
    """``(events, wall clock at the start, seconds, writer CPU seconds)`` of one phase's writes."""
    cpu, start = time.process_time(), time.time()
    n = await write()
    return n, start, time.time() - start, time.process_time() - cpu


async def measure(
    main: Host, readers: Readers, workload: Workload, seconds: float, rounds: int, redis: bool
) -> Figures:
    """Alternate ``rounds`` phases alone and with the readers, ``seconds / rounds`` each."""
    store = store_of(main)
    gen = main.id_generator("events")
    phase = seconds / rounds
    out = Figures()
    for _ in range(rounds):
        await readers.ask("disconnect")
        while main.transport is not None and main.transport.has_peers():
            await asyncio.sleep(0.05)
        if redis:
            await asyncio.sleep(1.5)  # the peer count is polled once a second: let it settle
        workload.prepare(phase)
        n, _, dt, cpu = await _timed(lambda: workload.write(store, phase))
        out.alone = [out.alone[0] + n, out.alone[1] + dt, out.alone[2] + cpu]
        alone_rate = n / dt

        workload.prepare(phase)
        await readers.ask("connect", gen.get_current_token())
        n, start, dt, cpu = await _timed(lambda: workload.write(store, phase))
        out.together = [out.together[0] + n, out.together[1] + dt, out.together[2] + cpu]
        answers = await readers.ask("wait", gen.get_current_token())
        last = max(answer[0] for answer in answers)
        if math.isnan(last):
            raise RuntimeError("a reader never got the phase's last event")
        out.delivered_seconds += last - start
        for i, (_, rows, reader_cpu, reader_seconds) in enumerate(answers):
            out.reader_rows[i] += rows
            out.reader_cpu[i] += reader_cpu
            out.reader_seconds[i] += reader_seconds
        out.ratios.append(n / (last - start) / alone_rate)
    return out


@contextlib.asynccontextmanager
async def writer(url: str, redis_url: str | None) -> AsyncIterator[tuple[HostCluster, Host]]:
    """The writer host of a cluster ``main``, ``r1``, ``r2`` over Redis when ``redis_url`` is given, else TCP.

    The deployment name is new each time: over Redis it is the channel, which other runs may share."""
    with tempfile.TemporaryDirectory(prefix="factstream-events-replication-") as state:
        cluster = HostCluster(
            Path(state),
            database=url,
            redis_url=redis_url,
            transport="redis" if redis_url else "tcp",
            deployment=f"evrepl{os.getpid()}x{time.monotonic_ns() % 1_000_000}",
            instances=("main", *READERS),
        )
        try:
            main = await cluster("main")
            freeze_startup_heap()
            yield cluster, main
        finally:
            await cluster.close()


async def run_transport(url: str, redis_url: str | None, seconds: float, rounds: int) -> list[str]:
    label = "redis" if redis_url else "tcp"
    lines = []
    async with writer(url, redis_url) as (cluster, main):
        workloads: list[Workload] = [Remote(), Local()]
        store = store_of(main)
        for workload in workloads:
            await workload.start(store)
        await analyze(main)
        readers = Readers(cluster)
        try:
            await readers.ready()
            idle = await readers.ask("idle", 1.0)
            lines.append(
                f"{label:6s} readers connected, nothing written: "
                + ", ".join(f"{rate * 1000:.1f}" for rate in idle)
                + " ms CPU a second"
            )
            for workload in workloads:
                figures = await measure(main, readers, workload, seconds, rounds, redis_url is not None)
                lines += figures.lines(label, workload.name, idle)
        finally:
            readers.stop()
    return lines


def run(url: str, redis_url: str | None, seconds: float = 3.0, *, rounds: int = 4, emit: Emit = print) -> None:
    """Over TCP, then over Redis (skipped without ``redis_url``): each workload ``2 x seconds`` of writes,
    ``rounds`` pairs of phases. Emits each transport's lines once it is done."""
    for transport in ("tcp", "redis"):
        if transport == "redis" and not redis_url:
            emit("redis: skipped (no Redis URL)")
            continue
        for line in asyncio.run(run_transport(url, redis_url if transport == "redis" else None, 2 * seconds, rounds)):
            emit(line)
