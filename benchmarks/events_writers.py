"""Several event writers (issue 35): remote batches of 100 through N real writer processes, beside N plain
psycopg processes writing the same rows, measured in the same run.

For each N in 1, 2 and 4, on a fresh scratch database:

* **the writers**: ``factstream run`` processes ``w1`` .. ``wN`` (``stream_writers.events`` and
  ``stream_writers.backfill`` both ``[w1 .. wN]``) and a ``main`` instance that writes neither (the
  first entry of the ``instance_map``: it serves TCP replication, so every writer gets the others'
  rows through it, as in a deployment). Each writer gets 4 rooms whose owner is that writer
  (``factstream_events.shared.sharding.writer_for(room, [w1 .. wN])``), and this process sends each room's
  batches to its writer's ``POST /rooms/{room_id}/remote_events`` (a writer token), one keep-alive
  connection and one request at a time per room, every room in flight at once. The events are made
  beforehand as ``events_storage`` makes them (room version 10, hashes and a signature, no
  ``event_id``; 95 messages and 5 joins of new members a batch), and the request bodies with them.
* **the baseline**: N processes (``multiprocessing``), each with one synchronous psycopg connection
  and 4 rooms of its own, writing the rows of the same kind of batches as ``events_storage``'s remote
  baseline (``nextval`` for 100 IDs, ``executemany`` per table, the forward extremity and the room's
  row, one transaction a batch; events parsed and hashed beforehand) into copies of the tables, the
  4 rooms' batches taken in turn.

The two sides alternate in rounds (4 by default) so that both see the same drift of the machine; a
round runs until its deadline, then lets the requests in flight finish, and its rate is the events
written over the time from its start to its last answer. Printed per N: aggregate events/s of each
side, their ratio (target >= 0.8x), the scaling of each side from N = 1, and the **CPU per event**:
user + system time (``psutil``, ``/proc/<pid>/stat``; the server runs on this machine) of the writer
processes and of their PostgreSQL backends (``pg_stat_activity.application_name`` ``factstream/wK``)
over the rounds, divided by the events written; the same for the baseline's processes and backends
(``application_name`` ``bench-baseline-K``); and beside it what ``main`` and this process (the HTTP
client) spent. CPU per event is the figure that holds on another machine: the rates here are bounded
by two cores that 2N + 2 processes share.

``uv run python benchmarks/run.py --only events-writers [--seconds S] [--events-scale F]``: each side
writes ``S x F`` seconds per N (4 rounds); about a minute per N at ``S = 8`` on the 2-core machine.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import math
import multiprocessing
import os
import signal
import sys
import tempfile
import time
import urllib.parse
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import psycopg
from events_storage import (
    BATCH,
    ROOM_VERSION,
    SERVER,
    RemoteRoom,
    _baseline_room,
    _baseline_rows,
    baseline_write_batch,
    prepare_baseline,
    remote_batches,
    verdict,
)

from factstream.db.engine import libpq_url
from factstream.testing import ProcessCluster, create_database, drop_database, free_port

Emit = Callable[[str], None]

COUNTS = (1, 2, 4)
ROOMS_PER_WRITER = 4
TOKEN = "bench-writer"
#: How long a ``factstream run`` may take to start (its imports alone took a minute on the loaded machine).
START_TIMEOUT = 600.0
#: Batches per room sent before the rounds (after the room's first 5 events): warms the pools, the
#: caches and the statistics ``ANALYZE`` then gathers.
WARM_UP_BATCHES = 5
#: How long the CPU of every process is measured with nothing written, before the rounds.
IDLE_SECONDS = 3.0
_TABLES = ("events", "event_json", "event_edges", "state_groups", "current_state_events", "rooms",
           "room_memberships", "bench_events", "bench_event_json", "bench_event_edges", "bench_rooms",
           "bench_event_forward_extremities")  # fmt: skip


# -- HTTP: one keep-alive connection a room --------------------------------------------------------------------


class HttpConnection:
    """A keep-alive HTTP/1.1 connection to a writer, one request at a time.

    Written here rather than taken from an HTTP library so that the client's CPU per request stays a
    few tens of µs (it shares the machine's two cores with what is measured); it reads only what the
    host's JSON answers are made of (a status line, headers with ``content-length``, the body)."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.reader: asyncio.StreamReader | None = None
        self.writer: asyncio.StreamWriter | None = None

    async def post(self, path: str, body: bytes) -> tuple[int, bytes]:
        if self.writer is None or self.reader is None or self.reader.at_eof():
            # (Again when the server closed it: it closes a connection idle for 5 s, as between rounds.)
            await self.close()
            self.reader, self.writer = await asyncio.open_connection("127.0.0.1", self.port)
        assert self.reader is not None
        head = (
            f"POST {path} HTTP/1.1\r\nhost: 127.0.0.1:{self.port}\r\nauthorization: Bearer {TOKEN}\r\n"
            f"content-type: application/json\r\ncontent-length: {len(body)}\r\n\r\n"
        ).encode()
        self.writer.writelines((head, body))
        status_line = await self.reader.readline()
        if not status_line:
            raise ConnectionError(f"127.0.0.1:{self.port} closed the connection")
        status = int(status_line.split(b" ", 2)[1])
        length = None
        while (line := await self.reader.readline()) not in (b"\r\n", b""):
            name, _, value = line.partition(b":")
            if name.strip().lower() == b"content-length":
                length = int(value)
        if length is None:
            raise RuntimeError(f"an answer without content-length from 127.0.0.1:{self.port}")
        return status, await self.reader.readexactly(length)

    async def close(self) -> None:
        if self.writer is not None:
            self.writer.close()
            with contextlib.suppress(OSError):
                await self.writer.wait_closed()
            self.reader = self.writer = None


# -- CPU time of processes and of their PostgreSQL backends ---------------------------------------------------


def cpu_of(pid: int) -> float | None:
    """User + system CPU seconds of a process on this machine (``None`` once it is gone)."""
    try:
        times = psutil.Process(pid).cpu_times()
    except psutil.NoSuchProcess:
        return None
    return float(times.user + times.system)


class CpuMeter:
    """The CPU a round costs, by role (``"writer"``, ``"main"``, ``"baseline"``) and by kind (``python``,
    ``postgres``): the roles' processes are given, their backends are found by ``application_name``
    at the start and at the end of the round. A backend that appears during the round counts from
    zero; one that ends during it is lost (the pools keep theirs open: none did in the runs here)."""

    def __init__(self, conn: psycopg.Connection[Any], processes: dict[int, str], backends: Callable[[str], str | None]):
        self.conn = conn
        self.processes = processes
        self.backends = backends
        self._start: dict[int, tuple[str, float]] = {}
        self._wall = 0.0
        #: Wall-clock seconds between the last :meth:`start` and :meth:`stop`.
        self.seconds = 0.0

    def _sample(self) -> dict[int, tuple[str, float]]:
        roles = {pid: (role, "python") for pid, role in self.processes.items()}
        for pid, name in self.conn.execute(
            "SELECT pid, application_name FROM pg_stat_activity WHERE datname = current_database()"
        ).fetchall():
            role = self.backends(str(name))
            if role is not None:
                roles[int(pid)] = (role, "postgres")
        out = {}
        for pid, (role, kind) in roles.items():
            seconds = cpu_of(pid)
            if seconds is not None:
                out[pid] = (f"{role}/{kind}", seconds)
        return out

    def start(self) -> None:
        self._start = self._sample()
        self._wall = time.perf_counter()

    def stop(self) -> dict[str, float]:
        """CPU seconds since :meth:`start`, by ``role/kind``."""
        out: dict[str, float] = {}
        end = self._sample()
        self.seconds = time.perf_counter() - self._wall
        for pid, (key, seconds) in end.items():
            before = self._start.get(pid)
            out[key] = out.get(key, 0.0) + seconds - (before[1] if before and before[0] == key else 0.0)
        return out


@dataclass
class Side:
    """One side's sums over its rounds."""

    events: int = 0
    seconds: float = 0.0
    cpu: dict[str, float] = field(default_factory=dict)
    rounds: list[float] = field(default_factory=list)
    short: int = 0  # rounds in which a room ran out of batches before the deadline
    metered: float = 0.0  # seconds over which :attr:`cpu` was measured
    idle: dict[str, float] = field(default_factory=dict)  # CPU seconds a second, nothing written

    def add(self, events: int, seconds: float, cpu: dict[str, float], metered: float) -> float:
        self.events += events
        self.seconds += seconds
        self.metered += metered
        for key, value in cpu.items():
            self.cpu[key] = self.cpu.get(key, 0.0) + value
        self.rounds.append(events / seconds)
        return events / seconds

    @property
    def rate(self) -> float:
        return self.events / self.seconds if self.seconds else 0.0

    def us(self, key: str) -> float:
        """µs of CPU per event of ``key`` (``role/kind``)."""
        return self.cpu.get(key, 0.0) / self.events * 1e6 if self.events else math.nan

    def net(self, key: str) -> float:
        """:meth:`us` less what ``key`` spends in the same time with nothing written (its background
        work: positions persisted, leases renewed, replication pings), which at a low rate is most of it."""
        cpu = self.cpu.get(key, 0.0) - self.idle.get(key, 0.0) * self.metered
        return cpu / self.events * 1e6 if self.events else math.nan


# -- the baseline: N plain psycopg processes ---------------------------------------------------------------


def _baseline_process(url: str, index: int, pipe: Any) -> None:
    """A baseline writer: one connection (``application_name`` ``bench-baseline-<index>``), 4 rooms.

    Commands: ``("top_up", k)`` makes each room's batches up to ``k`` pending (rows parsed and hashed:
    untimed); ``("run", seconds)`` writes the rooms' batches in turn for ``seconds`` (then finishes the
    batch it is on) and answers ``(events, seconds, short)``, ``short`` when a room ran out first;
    ``("stop",)`` ends the process."""
    rooms = [RemoteRoom(f"@creator{index}x{i}:{SERVER}", room_id=f"!bench{index}x{i}:local") for i in range(4)]
    states: list[dict[str, Any]] = [{"n": 0, "prev": "$start"} for _ in rooms]
    pending: list[list[list[dict[str, Any]]]] = [[] for _ in rooms]
    with psycopg.connect(libpq_url(url), application_name=f"bench-baseline-{index}") as conn:
        for room in rooms:
            _baseline_room(conn, room.room_id)
        pipe.send("ready")
        while True:
            command = pipe.recv()
            if command[0] == "stop":
                break
            if command[0] == "top_up":
                for room, state, queue in zip(rooms, states, pending, strict=True):
                    queue += _baseline_rows(room.room_id, remote_batches(room, max(0, command[1] - len(queue))), state)
                pipe.send("ok")
            elif command[0] == "run":
                n, short = 0, False
                start = time.perf_counter()
                stop = start + command[1]
                while True:  # a batch of each room at least, as the writers' side
                    for queue in pending:
                        if not queue:
                            short = True
                            continue
                        rows = queue.pop(0)
                        baseline_write_batch(conn, rows)
                        n += len(rows)
                    if short or time.perf_counter() >= stop:
                        break
                pipe.send((n, time.perf_counter() - start, short))


class Baseline:
    """N baseline processes, driven together."""

    def __init__(self, url: str, count: int) -> None:
        # Forked, not spawned: a spawned process imports the benchmark's modules again (seconds of CPU
        # each on the shared machine); nothing here has a thread or a connection open yet.
        ctx = multiprocessing.get_context("fork")
        self.procs = []
        for index in range(count):
            ours, theirs = ctx.Pipe()
            proc = ctx.Process(target=_baseline_process, args=(url, index, theirs), daemon=True)
            proc.start()
            self.procs.append((proc, ours))
        for proc, pipe in self.procs:
            if not pipe.poll(START_TIMEOUT) or pipe.recv() != "ready":
                raise RuntimeError(f"baseline process {proc.pid} did not start")

    @property
    def pids(self) -> list[int]:
        return [int(proc.pid or 0) for proc, _ in self.procs]

    def ask(self, *command: Any) -> list[Any]:
        for _, pipe in self.procs:
            pipe.send(command)
        return [pipe.recv() for _, pipe in self.procs]

    def round(self, seconds: float) -> tuple[int, float, bool]:
        """Every process writes for ``seconds`` at once; ``(events, seconds of the slowest, short)``."""
        answers = self.ask("run", seconds)
        return sum(a[0] for a in answers), max(a[1] for a in answers), any(a[2] for a in answers)

    def stop(self) -> None:
        for proc, pipe in self.procs:
            if proc.is_alive():
                with contextlib.suppress(OSError):
                    pipe.send(("stop",))
        for proc, _ in self.procs:
            proc.join(timeout=30)
            if proc.is_alive():
                proc.kill()


# -- the writers: N ``factstream run`` processes --------------------------------------------------------------


def writer_names(count: int) -> list[str]:
    return [f"w{i + 1}" for i in range(count)]


def pick_rooms(writers: Sequence[str], per_writer: int) -> dict[str, list[RemoteRoom]]:
    """``per_writer`` new rooms for each writer, each owned by it under the sharding of ``writers``."""
    from factstream_events.shared.sharding import writer_for

    rooms: dict[str, list[RemoteRoom]] = {w: [] for w in writers}
    i = 0
    while any(len(r) < per_writer for r in rooms.values()):
        room = RemoteRoom(f"@creator{i}:{SERVER}")
        i += 1
        owner = writer_for(room.room_id, writers)
        if len(rooms[owner]) < per_writer:
            rooms[owner].append(room)
    return rooms


def body_of(batch: Sequence[bytes]) -> bytes:
    """The request body of a batch: the events' bytes as made, the room version beside them."""
    return b'{"events":[' + b",".join(batch) + b'],"room_version":"' + ROOM_VERSION.encode() + b'"}'


class WriterRoom:
    """One room, its writer's connection and its request bodies, made ahead."""

    def __init__(self, writer: str, port: int, room: RemoteRoom) -> None:
        self.writer = writer
        self.room = room
        self.http = HttpConnection(port)
        self.path = f"/rooms/{urllib.parse.quote(room.room_id, safe='')}/remote_events"
        self.pending: list[tuple[int, bytes]] = []

    def top_up(self, batches: int) -> None:
        for batch in remote_batches(self.room, max(0, batches - len(self.pending))):
            self.pending.append((len(batch), body_of(batch)))

    async def send(self, count: int, body: bytes) -> None:
        status, answer = await self.http.post(self.path, body)
        if status != 200:
            raise RuntimeError(f"{self.writer} answered {status} for room {self.room.room_id}: {answer[:500]!r}")
        stored = len(json.loads(answer)["stored"])
        if stored != count:
            raise RuntimeError(f"{self.writer} stored {stored} of {count} events of room {self.room.room_id}")


async def writers_round(rooms: Sequence[WriterRoom], seconds: float) -> tuple[int, float, bool]:
    """Every room sends its batches in order, all rooms at once, until ``seconds`` have passed;
    ``(events, seconds until the last answer, short)``."""
    loop = asyncio.get_running_loop()
    written = [0]
    short = [False]
    start = time.perf_counter()
    stop = loop.time() + seconds

    async def one(room: WriterRoom) -> None:
        while True:  # a batch at least: a round may start late on a loaded machine
            if not room.pending:
                short[0] = True
                return
            count, body = room.pending.pop(0)
            await room.send(count, body)
            written[0] += count
            if loop.time() >= stop:
                return

    await asyncio.gather(*(one(room) for room in rooms))
    return written[0], time.perf_counter() - start, short[0]


@contextlib.contextmanager
def writer_cluster(url: str, count: int) -> Iterator[tuple[ProcessCluster, dict[str, int]]]:
    """``main`` and ``w1`` .. ``wN`` started (each its own ``factstream run``) on ``url``, a migrated
    database; yields the cluster and each writer's HTTP port."""
    writers = writer_names(count)
    instances = ["main", *writers]
    ports = {name: free_port() for name in instances}
    with tempfile.TemporaryDirectory(prefix="factstream-events-writers-") as workdir:
        cluster = ProcessCluster(Path(workdir), url, dict(os.environ), instances=instances)
        cluster.configure(
            instance_map={name: {"http_port": port} for name, port in ports.items()},
            http={"tokens": {TOKEN: {"user": f"@bench:{SERVER}", "write": True}}},
            stream_writers={"events": writers, "backfill": writers},
            database={"connect_timeout": 120.0},  # a connection took more than 5 s on the loaded machine
        )
        cluster.migrated = True  # by the caller, in this process
        try:
            for name in instances:
                cluster.start(name, wait=False)
            for proc in cluster.processes.values():
                proc.wait_started(START_TIMEOUT)
            yield cluster, {w: ports[w] for w in writers}
        finally:
            cluster.stop_all()


# -- one N ----------------------------------------------------------------------------------------------------


@dataclass
class Result:
    count: int
    writers: Side
    baseline: Side
    load: tuple[float, float, float]


def _role(name: str) -> str | None:
    if name.startswith("factstream/w"):
        return "writer"
    if name == "factstream/main":
        return "main"
    if name.startswith("bench-baseline-"):
        return "baseline"
    return None


def _analyze(url: str) -> None:
    """What autovacuum would do after the warm-up (it is off on some servers, this one's included)."""
    with psycopg.connect(libpq_url(url), autocommit=True) as conn:
        for table in _TABLES:
            conn.execute(f"ANALYZE {table}")


def copy_database(template: str) -> str:
    """A new database made from ``template`` (``CREATE DATABASE ... TEMPLATE``: a file copy, where
    migrating takes a minute on the loaded machine); returns its URL."""
    from sqlalchemy.engine import make_url

    parsed = make_url(template)
    name = f"fs_bench_writers_{os.urandom(6).hex()}"
    admin = parsed.set(database="postgres").render_as_string(hide_password=False)
    with psycopg.connect(libpq_url(admin), autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}" TEMPLATE "{parsed.database}"')
    return parsed.set(database=name).render_as_string(hide_password=False)


def _migrate(url: str) -> None:
    from factstream.migrate import Migrator
    from factstream.plugin.manager import load_plugins

    migrator = Migrator(url, load_plugins())
    try:
        migrator.upgrade()
    finally:
        migrator.close()


async def _warm_up(rooms: Sequence[WriterRoom]) -> float:
    """Each room's first events, then :data:`WARM_UP_BATCHES` batches of each room; returns the rate of
    the batches (events/s), which sizes the first round's batches."""
    await asyncio.gather(*(room.send(5, body_of(room.room.start())) for room in rooms))
    for room in rooms:
        room.top_up(WARM_UP_BATCHES)
    written, seconds, _ = await writers_round(rooms, 3600)
    return written / seconds


async def measure(url: str, count: int, seconds: float, rounds: int, emit: Emit) -> Result:
    """N = ``count`` writers against N baseline processes on ``url`` (a migrated, empty database)."""
    prepare_baseline(url)
    result = Result(count, Side(), Side(), os.getloadavg())
    with writer_cluster(url, count) as (cluster, ports):
        rooms = [
            WriterRoom(writer, ports[writer], room)
            for writer, owned in pick_rooms(list(ports), ROOMS_PER_WRITER).items()
            for room in owned
        ]
        baseline = Baseline(url, count)
        try:
            writers_rate = await _warm_up(rooms)
            baseline.ask("top_up", WARM_UP_BATCHES)
            n, dt, _ = baseline.round(3600)
            baseline_rate = n / dt
            await asyncio.to_thread(_analyze, url)
            processes = {int(p.popen.pid): "writer" for name, p in cluster.processes.items() if name != "main"}
            processes[int(cluster.processes["main"].popen.pid)] = "main"  # type: ignore[union-attr]
            processes.update({pid: "baseline" for pid in baseline.pids})
            with psycopg.connect(libpq_url(url), autocommit=True, application_name="bench-driver") as conn:
                meter = CpuMeter(conn, processes, _role)
                meter.start()
                await asyncio.sleep(IDLE_SECONDS)
                idle = {key: cpu / meter.seconds for key, cpu in meter.stop().items()}
                result.writers.idle = result.baseline.idle = idle
                phase = seconds / rounds
                for r in range(rounds):
                    # Made before the clock starts: 1.5 times what the best round so far could use.
                    per_room = math.ceil(1.5 * writers_rate * phase / BATCH / len(rooms)) + 2
                    for room in rooms:
                        room.top_up(per_room)
                    baseline.ask("top_up", math.ceil(1.5 * baseline_rate * phase / BATCH / (4 * count)) + 2)

                    meter.start()
                    n, dt, short = baseline.round(phase)
                    cpu = meter.stop()
                    baseline_rate = max(baseline_rate, result.baseline.add(n, dt, cpu, meter.seconds))
                    result.baseline.short += short

                    meter.start()
                    client = time.process_time()
                    n, dt, short = await writers_round(rooms, phase)
                    cpu = meter.stop()
                    cpu["client/python"] = time.process_time() - client
                    writers_rate = max(writers_rate, result.writers.add(n, dt, cpu, meter.seconds))
                    result.writers.short += short
                    emit(
                        f"  .. N={count} round {r + 1} of {rounds}: writers {result.writers.rounds[-1]:,.0f} events/s,"
                        f" baseline {result.baseline.rounds[-1]:,.0f} events/s"
                    )
        finally:
            baseline.stop()
            for room in rooms:
                await room.http.close()
    return result


# -- the report ------------------------------------------------------------------------------------------------


def lines_of(results: Sequence[Result]) -> list[str]:
    """The lines of the last result (its scaling from the first, when that is N = 1)."""
    out: list[str] = []
    first = results[0] if results and results[0].count == 1 else None
    for res in results[-1:]:
        w, b = res.writers, res.baseline
        ratio = w.rate / b.rate
        per_round = [x / y for x, y in zip(w.rounds, b.rounds, strict=True)]
        label = f"{res.count} writer(s), {ROOMS_PER_WRITER * res.count} rooms"
        out.append(
            f"{label:22s} writers {w.rate:7,.0f} events/s, baseline {b.rate:7,.0f} events/s:"
            f" {ratio:4.2f}x (target >= 0.8x: {verdict(ratio >= 0.8)}; rounds"
            f" {min(per_round):.2f}x-{max(per_round):.2f}x; load average {res.load[0]:.1f} at the start)"
        )
        if first is not None and res is not first:
            out.append(
                f"{'':22s} scaling from 1: writers {w.rate / first.writers.rate:4.2f}x,"
                f" baseline {b.rate / first.baseline.rate:4.2f}x"
            )
        keys = ("writer/python", "writer/postgres", "main/python", "main/postgres", "client/python")
        total = sum(w.net(k) for k in keys)
        cores = os.cpu_count() or 1
        out.append(
            f"{'':22s} CPU per event, µs Python / µs PostgreSQL: writers {w.us('writer/python'):.0f} /"
            f" {w.us('writer/postgres'):.0f} ({w.net('writer/python'):.0f} / {w.net('writer/postgres'):.0f} net of"
            f" idle); baseline {b.us('baseline/python'):.0f} / {b.us('baseline/postgres'):.0f}; beside the writers:"
            f" main {w.net('main/python'):.0f} / {w.net('main/postgres'):.0f} net, the HTTP client"
            f" {w.us('client/python'):.0f}"
        )
        out.append(
            f"{'':22s} the writers' side in all {total:.0f} µs an event net of idle ({cores} cores: at most"
            f" {cores * 1e6 / total:,.0f} events/s here); idle, ms CPU a second: writers "
            f"{w.idle.get('writer/python', 0) * 1e3:.0f} / {w.idle.get('writer/postgres', 0) * 1e3:.0f},"
            f" main {w.idle.get('main/python', 0) * 1e3:.0f} / {w.idle.get('main/postgres', 0) * 1e3:.0f}"
        )
        if w.short or b.short:
            out.append(
                f"{'':22s} NOTE: rooms ran out of batches before the deadline in {w.short} writer round(s),"
                f" {b.short} baseline round(s)"
            )
    return out


def run(
    server: str,
    seconds: float = 3.0,
    *,
    scale: float = 1.0,
    counts: Sequence[int] = COUNTS,
    rounds: int = 4,
    emit: Emit = print,
) -> list[Result]:
    """For each N of ``counts``, on a scratch database of ``server`` (created, migrated, dropped): each
    side writes ``seconds x scale`` seconds in ``rounds`` rounds. Emits progress lines (``..``) as it
    goes and each N's lines once it is measured; returns the results."""
    results = []
    template = create_database(server, prefix="fs_bench_writers_template")
    try:
        started = time.monotonic()
        _migrate(template)
        emit(f"  .. a database migrated in {time.monotonic() - started:.0f} s (each N gets a fresh copy of it)")
        for count in counts:
            url = copy_database(template)
            try:
                results.append(asyncio.run(measure(url, count, seconds * scale, rounds, emit)))
            finally:
                drop_database(url)
            for line in lines_of(results):
                emit(line)
    finally:
        drop_database(template)
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("server", help="a PostgreSQL server URL (a scratch database is made there for each N)")
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--scale", type=float, default=1.0)
    parser.add_argument("--writers", type=int, action="append", help="writer counts (default 1, 2, 4)")
    args = parser.parse_args()
    # A SIGTERM (a ``timeout``) stops the writer processes and drops the scratch databases on the way out.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    run(
        args.server,
        args.seconds,
        scale=args.scale,
        counts=args.writers or COUNTS,
        emit=lambda line: print(line, flush=True),
    )


if __name__ == "__main__":
    main()
