"""Fault injection with real processes: ``factstream run --instance main|worker1`` over TCP and Redis.

The acceptance criterion of replication: a worker receives every fact that the main instance's
writers append, in order, with no duplicates, while connected, after a disconnect of 500+ facts, after
the main process restarts, after Redis restarts, and when it is too slow and is disconnected for
congestion (it reconnects and catches up).

Each test starts real processes with the ``notes`` and ``probe`` test plugins installed
(tests/plugin_projects/probe): the probe in main writes notes when the test appends a command to a control
file (and acknowledges it), and the probe in worker1 records every row it receives, one JSON line
each. The faults come from outside: a TCP proxy between worker1 and main (or Redis) that drops its
connections and refuses new ones, ``CLIENT KILL TYPE pubsub``, SIGTERM, a Redis restart, a reader made
slow at run time.

"In order" means: per writer, the recorded tokens strictly increase. "Exactly once" means: the
recorded tokens, as a multiset, equal the set of ``stream_id`` in the ``notes`` table.

The process logs (``-v``: INFO) are printed at teardown, so a failing test shows them.
"""

from __future__ import annotations

import collections
import json
import signal
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import psycopg
import pytest

from factstream.db.engine import libpq_url
from factstream.testing import (
    FactstreamProcess,
    PluginInstaller,
    ProcessCluster,
    TcpProxy,
    read_json_lines,
    wait_until,
)

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
PLUGINS = ROOT / "tests" / "plugin_projects"
CATCH_UP_TIMEOUT = 60.0


# -- the cluster -------------------------------------------------------------------------------------------


class Cluster(ProcessCluster):
    """A ``process_cluster`` with the probe's files: main writes notes on command, worker1 records rows."""

    def __init__(self, workdir: Path, database_url: str, env: dict[str, str]) -> None:
        env = {k: v for k, v in env.items() if not k.startswith("FACTSTREAM_PROBE_")}
        super().__init__(workdir, database_url, env, deployment=f"probe-{uuid.uuid4().hex[:8]}")
        self.configure(stream_writers={"notes": ["main"]})
        self.control = workdir / "control.jsonl"
        self.ack_path = workdir / "control.jsonl.ack"
        self.record = workdir / "worker1.record.jsonl"
        self.slow_file = workdir / "worker1.slow"
        self._commands = 0

    # processes (the probe dumps its asyncio tasks to <name>.tasks on SIGUSR1: see FactstreamProcess.stop)

    def main(self, config: Path) -> FactstreamProcess:
        return self._process("main", config, {"FACTSTREAM_PROBE_CONTROL": str(self.control)})

    def worker(self, config: Path, *, slow: bool = False) -> FactstreamProcess:
        env = {"FACTSTREAM_PROBE_RECORD": str(self.record)}
        if slow:
            env["FACTSTREAM_PROBE_SLOW_FILE"] = str(self.slow_file)
        return self._process("worker1", config, env)

    def _process(self, instance: str, config: Path, env: dict[str, str]) -> FactstreamProcess:
        dump = self.workdir / f"{instance}.tasks"
        env = {**env, "FACTSTREAM_PROBE_DUMP": str(dump)}
        return self.start(instance, config, env=env, hang_dump=dump, wait=False)

    # writing, through the probe in main

    def write(self, count: int, *, rate: float = 0, batch: int = 1, author_bytes: int = 0) -> str:
        """Ask main's probe to write ``count`` notes; returns the command id (see :meth:`wait_ack`)."""
        self._commands += 1
        cid = f"c{self._commands}"
        command = {"id": cid, "count": count, "rate": rate, "batch": batch, "author_bytes": author_bytes}
        with open(self.control, "a", encoding="utf-8") as f:
            f.write(json.dumps(command) + "\n")
        return cid

    def ack(self, cid: str) -> dict[str, Any] | None:
        """The final acknowledgement of write ``cid`` (not the ``started`` one), if any."""
        acks = [a for a in read_json_lines(self.ack_path) if a.get("id") == cid and a.get("status") != "started"]
        return acks[-1] if acks else None

    def wait_ack(self, cid: str, timeout: float = 60.0, status: str | None = "done") -> dict[str, Any]:
        ack = wait_until(lambda: self.ack(cid), timeout, f"main to acknowledge write {cid}", detail=self.logs)
        if status is not None:
            assert ack["status"] == status, f"write {cid}: {ack}{self.logs()}"
        return ack

    def write_and_wait(self, count: int, **kwargs: Any) -> dict[str, Any]:
        return self.wait_ack(self.write(count, **kwargs))

    # checking

    def notes_in_database(self) -> list[tuple[int, str, str]]:
        with psycopg.connect(libpq_url(self.database_url), autocommit=True) as conn:
            rows = conn.execute("SELECT stream_id, instance_name, author FROM notes ORDER BY stream_id").fetchall()
        return [(int(r[0]), str(r[1]), str(r[2])) for r in rows]

    def count_in_database(self) -> int:
        with psycopg.connect(libpq_url(self.database_url), autocommit=True) as conn:
            row = conn.execute("SELECT count(*) FROM notes").fetchone()
        return int(row[0]) if row else 0

    def recorded(self) -> list[dict[str, Any]]:
        return [r for r in read_json_lines(self.record) if r.get("stream") == "notes"]

    def wait_until_worker_has_everything(self, timeout: float = CATCH_UP_TIMEOUT, settle: float = 1.0) -> None:
        """Wait until worker1 recorded every note in the table, let late duplicates arrive, then check."""

        def complete() -> bool:
            expected = {t for t, _, _ in self.notes_in_database()}
            return expected <= {r["token"] for r in self.recorded()}

        wait_until(complete, timeout, "worker1 to record every note", detail=lambda: "\n" + self.diagnosis())
        time.sleep(settle)
        self.check_exactly_once_in_order()

    def check_exactly_once_in_order(self) -> None:
        problems = self.problems()
        assert not problems, "\n".join(problems) + "\n" + self.diagnosis()

    def problems(self) -> list[str]:
        notes = self.notes_in_database()
        records = self.recorded()
        problems = []
        expected = collections.Counter(t for t, _, _ in notes)
        got = collections.Counter(r["token"] for r in records)
        missing = sorted(expected - got)
        extra = sorted(got - expected)
        duplicates = sorted(t for t, n in got.items() if n > 1)
        if missing:
            problems.append(f"{len(missing)} note(s) never recorded: {_ranges(missing)}")
        if duplicates:
            problems.append(f"{len(duplicates)} token(s) recorded more than once: {_ranges(duplicates)}")
        if set(extra) - set(duplicates):
            problems.append(f"recorded tokens that are not in the table: {_ranges(sorted(set(extra)))}")
        last: dict[str, int] = {}
        disorder = []
        for i, r in enumerate(records):
            if r["token"] <= last.get(r["instance"], 0):
                disorder.append(f"line {i + 1}: {r['instance']} {r['token']} after {last[r['instance']]}")
            last[r["instance"]] = max(last.get(r["instance"], 0), r["token"])
        if disorder:
            problems.append(f"{len(disorder)} token(s) out of order, first: {disorder[:5]}")
        by_token = {t: (instance, author) for t, instance, author in notes}
        wrong = [r for r in records if r["token"] in by_token and by_token[r["token"]] != (r["instance"], r["author"])]
        if wrong:
            problems.append(f"{len(wrong)} row(s) recorded with the wrong writer or author, first: {wrong[:3]}")
        return problems

    def diagnosis(self) -> str:
        notes = self.notes_in_database()
        records = self.recorded()
        return (
            f"table: {len(notes)} notes (tokens {_ranges([t for t, _, _ in notes])}); "
            f"worker1 recorded {len(records)} rows (tokens {_ranges(sorted(r['token'] for r in records))})"
            + self.logs()
        )


def _ranges(tokens: list[int], limit: int = 12) -> str:
    """``[1-5, 7, 9-12]``: compact for messages."""
    if not tokens:
        return "[]"
    parts = []
    start = prev = tokens[0]
    for t in [*tokens[1:], None]:
        if t is not None and t == prev + 1:
            prev = t
            continue
        parts.append(f"{start}-{prev}" if prev != start else str(start))
        if t is not None:
            start = prev = t
    more = f", ... ({len(parts) - limit} more ranges)" if len(parts) > limit else ""
    return "[" + ", ".join(parts[:limit]) + more + "]"


ProbeCluster = TypeVar("ProbeCluster", bound=Cluster)


def probe_cluster(
    cls: type[ProbeCluster], plugin_installer: PluginInstaller, fresh_database: str, tmp_path: Path
) -> Iterator[ProbeCluster]:
    """The fixture of the probe's process tests (here, and with a subclass in tests/host/test_health.py):
    a ``cls`` on ``fresh_database`` with the notes and probe plugins installed and the database migrated,
    closed after the test (``ProcessCluster.close``: the processes stopped, their logs' tails printed)."""
    plugin_installer.from_project(PLUGINS / "notes")
    plugin_installer.from_project(PLUGINS / "probe")
    with cls(tmp_path, fresh_database, plugin_installer.env()) as c:
        c.migrate(c.config("main"))
        yield c


@pytest.fixture
def cluster(plugin_installer, fresh_database, tmp_path) -> Iterator[Cluster]:
    yield from probe_cluster(Cluster, plugin_installer, fresh_database, tmp_path)


def start_pair(
    cluster: Cluster, main_config: Path, worker_config: Path, **worker_kwargs: Any
) -> tuple[FactstreamProcess, FactstreamProcess]:
    """Start main and worker1 and prove that worker1 follows the notes stream (one warm-up note)."""
    main = cluster.main(main_config)
    main.wait_started()
    worker = cluster.worker(worker_config, **worker_kwargs)
    worker.wait_started()
    cluster.write_and_wait(1)
    cluster.wait_until_worker_has_everything(timeout=30, settle=0)
    return main, worker


TRANSPORTS = ["tcp", "redis"]


# -- 1. connected ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("transport", TRANSPORTS)
def test_connected_worker_receives_every_fact_in_order(cluster, transport, request):
    redis_url = request.getfixturevalue("redis_url") if transport == "redis" else None
    config = cluster.config("main", redis_url=redis_url)
    start_pair(cluster, config, config)

    cluster.write_and_wait(300)

    cluster.wait_until_worker_has_everything()
    assert len(cluster.recorded()) == 301


# -- 2. a disconnect of 500+ facts -------------------------------------------------------------------------


def test_worker_catches_up_after_a_tcp_disconnect_of_600_facts(cluster):
    proxy = TcpProxy(cluster.main_port)
    proxy.start()
    cluster.cleanups.append(proxy.close)
    main_config = cluster.config("main")
    worker_config = cluster.config("worker1", replication_port=proxy.port)
    start_pair(cluster, main_config, worker_config)
    cluster.write_and_wait(100)
    cluster.wait_until_worker_has_everything(settle=0)

    proxy.refuse()
    assert proxy.drop() == 1, "worker1 should have had one connection to main through the proxy"
    before = len(cluster.recorded())
    cluster.write_and_wait(600)
    cluster.write_and_wait(1_900, batch=100)  # 2,500 in all: more than one catch-up page
    time.sleep(0.5)
    assert len(cluster.recorded()) == before, "worker1 received facts while it was cut off"

    proxy.accept()
    cluster.wait_until_worker_has_everything(settle=0)
    cluster.write_and_wait(100)
    cluster.wait_until_worker_has_everything()
    assert proxy.accepted >= 2


def test_worker_catches_up_after_its_redis_subscription_is_cut_for_600_facts(redis_server, cluster):
    proxy = TcpProxy(redis_server.port)
    proxy.start()
    cluster.cleanups.append(proxy.close)
    main_config = cluster.config("main", redis_url=redis_server.url)
    worker_config = cluster.config("worker1", redis_url=f"redis://127.0.0.1:{proxy.port}/0")
    start_pair(cluster, main_config, worker_config)
    cluster.write_and_wait(100)
    cluster.wait_until_worker_has_everything(settle=0)

    proxy.refuse()  # worker1 cannot subscribe again until we say so
    killed = redis_server.client().execute_command("CLIENT", "KILL", "TYPE", "pubsub")
    assert killed >= 2, f"expected to cut the subscriptions of main and worker1, cut {killed}"
    before = len(cluster.recorded())
    cluster.write_and_wait(600)
    cluster.write_and_wait(1_900, batch=100)
    time.sleep(0.5)
    assert len(cluster.recorded()) == before, "worker1 received facts while its subscription was cut"

    proxy.accept()
    cluster.wait_until_worker_has_everything(settle=0)
    cluster.write_and_wait(100)
    cluster.wait_until_worker_has_everything()


# -- 3. main restarts --------------------------------------------------------------------------------------


@pytest.mark.parametrize("stop_signal", [signal.SIGTERM, signal.SIGKILL], ids=["sigterm", "sigkill"])
@pytest.mark.parametrize("transport", TRANSPORTS)
def test_worker_follows_main_across_a_restart(cluster, transport, stop_signal, request):
    redis_url = request.getfixturevalue("redis_url") if transport == "redis" else None
    config = cluster.config("main", redis_url=redis_url)
    main, _worker = start_pair(cluster, config, config)
    cluster.write_and_wait(100)

    # Stop main while it writes as fast as it can: facts are committed, in flight, maybe not yet sent.
    interrupted = cluster.write(1_000_000)
    wait_until(lambda: cluster.count_in_database() >= 701, 20, "main to write 600 facts")
    code = main.stop(stop_signal)
    if stop_signal == signal.SIGTERM:
        assert code == 0, f"main exited with {code} after SIGTERM:\n{main.tail()}"
        ack = cluster.wait_ack(interrupted, timeout=5, status="cancelled")
        assert ack["written"] >= 600, ack
    time.sleep(1.0)  # worker1 is without main for a while

    main.start()
    main.wait_started()
    cluster.write_and_wait(300)
    cluster.write_and_wait(300, batch=50)

    cluster.wait_until_worker_has_everything()
    instances = {r["instance"] for r in cluster.recorded()}
    assert instances == {"main"}


# -- 4. Redis restarts -------------------------------------------------------------------------------------


def test_worker_catches_up_after_redis_restarts(redis_server, cluster):
    config = cluster.config("main", redis_url=redis_server.url)
    start_pair(cluster, config, config)
    cluster.write_and_wait(100)
    cluster.wait_until_worker_has_everything(settle=0)

    during = cluster.write(900, rate=450)  # two seconds of writing, across the restart
    wait_until(lambda: cluster.count_in_database() >= 250, 20, "main to be writing")
    redis_server.stop()
    time.sleep(1.0)
    redis_server.start()
    cluster.wait_ack(during)
    cluster.write_and_wait(300)

    cluster.wait_until_worker_has_everything()


# -- 5. congestion -----------------------------------------------------------------------------------------

CONGESTION_FACTS = 40_000
CONGESTION_BATCH = 1_000
#: Rows of about 1 KB on the wire. With ~40-byte rows, the socket buffers between the processes
#: (several MB on loopback) hold tens of thousands of lines besides the reader's 10,000-command backlog
#: and the sender's 10,000-command queue: 40,000 small facts never overflow the queue, and after 25 s
#: of paused reading worker1 drops the link itself with "ping timeout" instead. Making the queue and
#: backlog sizes configurable would let this test use small rows.
CONGESTION_AUTHOR_BYTES = 1_000
SLOW_MS = "50"  # 20 facts a second: far slower than main writes


def congest(cluster: Cluster, disconnected: Callable[[], bool], what: str) -> None:
    """Make worker1 slow, write CONGESTION_FACTS facts until ``disconnected()``, make it fast again."""
    cluster.slow_file.write_text(SLOW_MS)
    time.sleep(0.3)  # the probe re-reads the file every 0.1 s
    cid = cluster.write(CONGESTION_FACTS, batch=CONGESTION_BATCH, author_bytes=CONGESTION_AUTHOR_BYTES)

    def progress() -> str:
        return f" (written: {cluster.count_in_database()}, recorded: {len(cluster.recorded())})\n{cluster.logs()}"

    wait_until(disconnected, 60, what, detail=progress)
    cluster.slow_file.write_text("0")
    cluster.wait_ack(cid)


def test_slow_worker_is_disconnected_for_congestion_over_tcp_then_catches_up(cluster):
    cluster.slow_file.write_text("0")
    config = cluster.config("main")
    main, worker = start_pair(cluster, config, config, slow=True)

    congest(cluster, lambda: "cannot keep up" in main.log(), "main to disconnect the congested worker1")

    cluster.wait_until_worker_has_everything(timeout=120)
    assert "Failed to keep up" in worker.log() or "replication link down" in worker.log(), worker.tail()


def test_slow_worker_is_disconnected_for_congestion_by_redis_then_catches_up(redis_server, cluster):
    # Redis disconnects a subscriber whose output buffer exceeds the limit (default: 32 MB hard).
    redis_server.client().config_set("client-output-buffer-limit", "pubsub 2mb 1mb 1")
    cluster.slow_file.write_text("0")
    config = cluster.config("main", redis_url=redis_server.url)
    _main, worker = start_pair(cluster, config, config, slow=True)

    congest(cluster, lambda: "output buffer limits" in redis_server.log(), "Redis to disconnect worker1")

    cluster.wait_until_worker_has_everything(timeout=120)
    assert "replication link down" in worker.log(), worker.tail()
