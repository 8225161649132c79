"""The events plugin's ``events`` export job against a one-process COPY -> Arrow -> Parquet baseline.

Run: ``uv run python benchmarks/events_export.py [--events N] [--rounds R] [--no-cluster]`` (or
``benchmarks/run.py --only events-export``).

The scratch database's events tables are filled by SQL (``generate_series``) as two writers leave
them: N events (default 1,000,000) in 1,000 rooms of room version 10, each room's events written by
its ``writer_for`` owner among ``w1`` and ``w2`` (``instance_name``), stream orderings 2 to N + 1,
topological orderings per room, timestamps a second apart, one event in 10,000 redacted, and each
event's JSON (about 330 bytes) in ``event_json``.

* Baseline: psycopg ``COPY`` of the job's own ``SELECT`` (the same columns and joins) into memory,
  ``pyarrow.csv.read_csv``, ``pyarrow.parquet.write_table`` to one file: what one process minimally
  does to get those rows into Parquet (it does not prune the redacted events; the job does).
* Measured: ``ExportRunner.run`` of the ``events`` job with a warm session, on ``local[*]`` and on a
  standalone cluster (a master and a worker with every core, started with pyspark's ``spark-class``;
  the driver is this process): watermark, checkpoint, the workers' COPY into Arrow, pruning, Parquet,
  staging and commit.

Rounds alternate baseline and export; the best round of each is reported, as ratios.
"""

from __future__ import annotations

import argparse
import io
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import psycopg

from factstream.db.engine import libpq_url

ROOMS = 1000
WRITERS = ("w1", "w2")

_ROOMS_SQL = """
INSERT INTO rooms (room_id, room_version, creator, is_local, created_ts, writes)
SELECT '!room' || r || ':example.org', '10', '@u0:example.org', FALSE, 1700000000000, 1
FROM generate_series(0, {rooms} - 1) AS r
"""
_EVENTS_SQL = """
INSERT INTO events (event_id, room_id, stream_ordering, instance_name, topological_ordering, type, state_key,
    sender, origin_server_ts, received_ts, outlier, backfilled, visibility, redacted_by)
SELECT '$ev' || g, w.room_id, g, w.instance_name, g / {rooms} + 1, 'm.room.message', NULL,
    '@u' || (g % 997) || ':example.org', 1700000000000 + g * 1000, 1700000000000 + g * 1000 + 40, FALSE, FALSE,
    'shared', CASE WHEN g % 10000 = 7 THEN '$redaction' || g END
FROM generate_series(2, {events} + 1) AS g JOIN room_writer w ON w.room = g % {rooms}
"""
_JSON_SQL = """
INSERT INTO event_json (event_id, room_id, json)
SELECT e.event_id, e.room_id, convert_to(json_build_object(
    'auth_events', json_build_array('$create', '$power', '$member'), 'content',
    json_build_object('body', 'message ' || e.stream_ordering || ' with some words in it', 'msgtype', 'm.text'),
    'depth', e.topological_ordering, 'hashes', json_build_object('sha256', md5(e.event_id)),
    'origin_server_ts', e.origin_server_ts, 'prev_events', json_build_array('$ev' || (e.stream_ordering - 1)),
    'room_id', e.room_id, 'sender', e.sender, 'type', e.type)::text, 'UTF8')
FROM events e
"""


def fill(url: str, events: int) -> None:
    """``events`` events in :data:`ROOMS` rooms, each room's by its owner among :data:`WRITERS`."""
    from factstream_events.sharding import writer_for

    owners = [(r, f"!room{r}:example.org", writer_for(f"!room{r}:example.org", WRITERS)) for r in range(ROOMS)]
    with psycopg.connect(libpq_url(url), autocommit=True) as conn:
        conn.execute("TRUNCATE event_json, events, rooms, export_checkpoints")
        with conn.transaction():
            conn.execute(_ROOMS_SQL.format(rooms=ROOMS))
            conn.execute("CREATE TEMP TABLE room_writer (room int PRIMARY KEY, room_id text, instance_name text)")
            with conn.cursor() as cur:
                cur.executemany("INSERT INTO room_writer VALUES (%s, %s, %s)", owners)
            conn.execute(_EVENTS_SQL.format(rooms=ROOMS, events=int(events)))
            conn.execute(_JSON_SQL)
            conn.execute("DROP TABLE room_writer")
        conn.execute("SELECT setval('events_stream_seq', %s)", (events + 1,))
        conn.execute("DELETE FROM stream_positions WHERE stream_name = 'events'")
        conn.execute("VACUUM ANALYZE events")
        conn.execute("VACUUM ANALYZE event_json")


def baseline(url: str, sql: str, columns: tuple[tuple[str, str], ...], upto: int, target: Path) -> int:
    """COPY of the job's SELECT into memory, Arrow's CSV reader, one Parquet file; returns the rows."""
    import pyarrow as pa
    from pyarrow import csv
    from pyarrow import parquet as pq

    arrow = {"string": pa.string(), "long": pa.int64(), "boolean": pa.bool_()}
    schema = {name: arrow[kind] for name, kind in columns}
    buf = io.BytesIO()
    query = sql % {"lo": 0, "hi": int(upto)}
    copy_sql = f"COPY ({query}) TO STDOUT (FORMAT csv)"
    with psycopg.connect(libpq_url(url)) as conn, conn.cursor() as cur, cur.copy(copy_sql) as copy:
        for chunk in copy:
            buf.write(chunk)
    buf.seek(0)
    table = csv.read_csv(
        buf,
        read_options=csv.ReadOptions(column_names=list(schema)),
        parse_options=csv.ParseOptions(newlines_in_values=True),
        convert_options=csv.ConvertOptions(
            column_types=schema, strings_can_be_null=True, true_values=["t"], false_values=["f"]
        ),
    )
    pq.write_table(table, target, compression="snappy")
    return int(table.num_rows)


class Standalone:
    """A Spark master and one worker with every core, started by pyspark's ``spark-class``."""

    def __init__(self, work: Path) -> None:
        import pyspark

        self.spark_class = str(Path(pyspark.__file__).parent / "bin" / "spark-class")
        self.work = work
        self.port, self.ui = _free_port(), _free_port()
        self.url = f"spark://127.0.0.1:{self.port}"
        self.env = {**os.environ, "SPARK_LOCAL_IP": "127.0.0.1", "SPARK_WORKER_DIR": str(work / "worker")}
        self.procs: list[subprocess.Popen[bytes]] = []

    def start(self) -> None:
        self._start("master", "org.apache.spark.deploy.master.Master", "--host", "127.0.0.1", "--port", str(self.port),
                    "--webui-port", str(self.ui))  # fmt: skip
        _wait(lambda: _listening(self.port), "the master")
        cores = str(os.cpu_count() or 2)
        self._start("worker", "org.apache.spark.deploy.worker.Worker", self.url, "--host", "127.0.0.1", "--cores",
                    cores, "--memory", "2g")  # fmt: skip
        _wait(self._worker_alive, "the worker to register")

    def _start(self, name: str, *args: str) -> None:
        log = (self.work / f"{name}.log").open("wb")
        self.procs.append(
            subprocess.Popen(
                [self.spark_class, *args], env=self.env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )
        )

    def _worker_alive(self) -> bool:
        import json
        import urllib.request

        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.ui}/json/", timeout=2) as r:
                return any(w.get("state") == "ALIVE" for w in json.load(r).get("workers", []))
        except OSError:
            return False

    def stop(self) -> None:
        for p in reversed(self.procs):
            try:
                os.killpg(p.pid, signal.SIGTERM)
                p.wait(timeout=30)
            except ProcessLookupError:
                pass
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _listening(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False


def _wait(check: Callable[[], bool], what: str, seconds: float = 180) -> None:
    deadline = time.monotonic() + seconds
    while not check():
        if time.monotonic() > deadline:
            raise RuntimeError(f"timed out waiting for {what}")
        time.sleep(0.5)


def _measure(url: str, master: str, events: int, rounds: int, work: Path, conf: dict[str, str]) -> list[str]:
    from factstream.export import direct
    from factstream.export.runner import ExportRunner
    from factstream.export.session import build_session
    from factstream.plugin.manager import load_plugins

    plugins = load_plugins()
    job = plugins.registry.export_jobs.get("events")
    assert job.source is not None
    started = time.perf_counter()
    spark = build_session(master, app_name="factstream events export benchmark", conf=conf)
    spark.sparkContext.setLogLevel("ERROR")
    lines = [f"{master}: Spark session start-up {time.perf_counter() - started:.1f} s"]
    label = "standalone" if master.startswith("spark://") else master
    safe = "standalone" if master.startswith("spark://") else "local"  # for file names
    try:
        runner = ExportRunner(spark, plugins, url, work.as_uri())
        tasks = spark.sparkContext.defaultParallelism
        direct.write_range(spark, url, runner.plan(job), str(work / f"warm-{safe}"), 0, 20_001, tasks)
        best_base = best_ours = 0.0
        for i in range(rounds):
            t = time.perf_counter()
            n = baseline(url, job.source.sql, job.source.columns, events + 1, work / f"baseline-{safe}-{i}.parquet")
            base_rate = n / (time.perf_counter() - t)
            best_base = max(best_base, base_rate)
            with psycopg.connect(libpq_url(url), autocommit=True) as conn:
                conn.execute("DELETE FROM export_checkpoints WHERE job = %s", (job.name,))
            out = work / f"out-{safe}-{i}"
            out.mkdir()
            runner.output_root = out.as_uri()
            t = time.perf_counter()
            result = runner.run(job)
            ours_rate = result.rows / (time.perf_counter() - t)
            best_ours = max(best_ours, ours_rate)
            assert result.rows == n == events, (result.rows, n, events)
            lines.append(f"{label} round {i + 1}: baseline {base_rate:,.0f} rows/s, export {ours_rate:,.0f} rows/s")
        lines.append(
            f"events job, {events:,} events, {label} ({tasks} tasks): {best_ours:,.0f} rows/s vs baseline "
            f"{best_base:,.0f} rows/s = {best_ours / best_base:.2f}x (target >= 0.8x)"
        )
    finally:
        spark.stop()
    return lines


def run(url: str, events: int = 1_000_000, rounds: int = 2, *, cluster: bool = True) -> list[str]:
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    t = time.perf_counter()
    fill(url, events)
    lines = [f"filled {events:,} events by SQL in {time.perf_counter() - t:.1f} s"]
    work = Path(tempfile.mkdtemp(prefix="factstream-bench-events-export-"))
    try:
        lines += _measure(url, "local[*]", events, rounds, work, {})
        if cluster:
            standalone = Standalone(work)
            try:
                standalone.start()
                conf = {"spark.driver.host": "127.0.0.1", "spark.driver.bindAddress": "127.0.0.1"}
                lines += _measure(url, standalone.url, events, rounds, work, conf)
            finally:
                standalone.stop()
    finally:
        # the scratch database is shared with the other benchmarks of run.py: leave no events behind
        with psycopg.connect(libpq_url(url), autocommit=True) as conn:
            conn.execute("TRUNCATE event_json, events, rooms, export_checkpoints")
        shutil.rmtree(work, ignore_errors=True)
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--events", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--no-cluster", action="store_true", help="only local[*]")
    args = parser.parse_args()
    server = os.environ.get("FACTSTREAM_BENCH_DATABASE_URL") or os.environ.get("FACTSTREAM_TEST_DATABASE_URL")
    if not server:
        from factstream.db.embedded import start_embedded

        server = start_embedded(Path(tempfile.mkdtemp(prefix="factstream-bench-")))
    from factstream.migrate import Migrator
    from factstream.plugin.manager import load_plugins
    from factstream.testing import create_database, drop_database

    url = create_database(server, prefix="fs_bench")
    try:
        migrator = Migrator(url, load_plugins())
        migrator.upgrade()
        migrator.close()
        for line in run(url, args.events, args.rounds, cluster=not args.no_cluster):
            print(line, flush=True)
    finally:
        drop_database(url)


if __name__ == "__main__":
    main()
