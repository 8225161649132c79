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
import sys
import tempfile
import time
from pathlib import Path

import psycopg
from scratch import bench_server, scratch_database

from factstream.db.engine import libpq_url
from factstream.testing import SparkStandalone

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
    from factstream_events.shared.sharding import writer_for

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
            standalone = SparkStandalone(work, cores=os.cpu_count() or 2, memory="2g", start_seconds=180)
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
    with scratch_database(bench_server()) as url:
        for line in run(url, args.events, args.rounds, cluster=not args.no_cluster):
            print(line, flush=True)


if __name__ == "__main__":
    main()
