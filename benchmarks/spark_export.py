"""Spark export throughput against a one-process COPY -> Arrow -> Parquet baseline, in the same run.

Run: ``uv run python benchmarks/spark_export.py [--facts N] [--rounds R]`` (or through ``benchmarks/run.py``).

The stream is simple: one backing table ``bench_export (stream_id, instance_name, author, body)``
filled with N facts (default 1,000,000) by ``generate_series``.

* Baseline: what one process minimally does to get those rows into Parquet: psycopg
  ``COPY (SELECT ...) TO STDOUT (FORMAT csv)`` into memory, ``pyarrow.csv.read_csv`` (multithreaded),
  ``pyarrow.parquet.write_table`` to one file.
* Measured: ``ExportRunner.run`` of an export job over the stream on ``local[2]`` with a warm
  session (one small export ran first): watermark, checkpoint, the factstream data source (COPY into
  Arrow in each task), Spark's Parquet writer, staging and commit.

Rounds alternate baseline and export; the best round of each is reported. Session start-up (a cold
``SparkSession`` on ``local[2]``) is reported separately, and so is Spark's own floor: copying the
baseline's Parquet file to Parquet in the same session (no factstream code involved).
"""

from __future__ import annotations

import argparse
import io
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import msgspec
import psycopg
from scratch import bench_server, scratch_database

from factstream import ExportJobSpec, StreamSpec, StreamTable, hookimpl
from factstream.db.engine import libpq_url


class BenchRow(msgspec.Struct, frozen=True):
    author: str
    body: str


class _BenchPlugin:
    @hookimpl
    def register_streams(self, register: Any) -> None:
        register(
            StreamSpec(
                name="bench_export",
                row_type=BenchRow,
                tables=(StreamTable("bench_export", "instance_name", "stream_id"),),
                writers="any",
            )
        )

    @hookimpl
    def register_export_jobs(self, register: Any) -> None:
        register(ExportJobSpec(name="bench_export_all", stream="bench_export"))


def _fill(url: str, facts: int) -> None:
    with psycopg.connect(libpq_url(url), autocommit=True) as conn:
        conn.execute("DROP TABLE IF EXISTS bench_export")
        conn.execute("DROP SEQUENCE IF EXISTS bench_export_seq")
        conn.execute(
            "CREATE TABLE bench_export (stream_id bigint PRIMARY KEY, instance_name text NOT NULL,"
            " author text NOT NULL, body text NOT NULL)"
        )
        conn.execute(
            "INSERT INTO bench_export SELECT g, 'main', '@user' || (g %% 1000) || ':example.org',"
            " 'note number ' || g || ' with a little text in it' FROM generate_series(2, %s) AS g",
            (facts + 1,),
        )
        conn.execute("CREATE SEQUENCE bench_export_seq")
        conn.execute("SELECT setval('bench_export_seq', %s)", (facts + 1,))
        conn.execute("DELETE FROM stream_positions WHERE stream_name = 'bench_export'")
        conn.execute("VACUUM ANALYZE bench_export")


def baseline(url: str, upto: int, target: Path) -> int:
    """COPY into memory, Arrow's CSV reader, one Parquet file; returns the row count."""
    import pyarrow as pa
    from pyarrow import csv
    from pyarrow import parquet as pq

    buf = io.BytesIO()
    sql = (
        "COPY (SELECT stream_id, instance_name, author, body FROM bench_export"
        f" WHERE stream_id > 0 AND stream_id <= {int(upto)}) TO STDOUT (FORMAT csv)"
    )
    with psycopg.connect(libpq_url(url)) as conn, conn.cursor() as cur, cur.copy(sql) as copy:
        for chunk in copy:
            buf.write(chunk)
    buf.seek(0)
    schema = {"stream_id": pa.int64(), "instance_name": pa.string(), "author": pa.string(), "body": pa.string()}
    table = csv.read_csv(
        buf,
        read_options=csv.ReadOptions(column_names=list(schema)),
        convert_options=csv.ConvertOptions(column_types=schema),
    )
    pq.write_table(table, target, compression="snappy")
    return int(table.num_rows)


def run(url: str, facts: int = 1_000_000, rounds: int = 3) -> list[str]:
    from factstream.export import direct
    from factstream.export.runner import ExportRunner
    from factstream.export.session import build_session
    from factstream.plugin.manager import load_plugins

    _fill(url, facts)
    plugins = load_plugins(extra=[("bench_export", _BenchPlugin())])
    job = plugins.registry.export_jobs.get("bench_export_all")
    work = Path(tempfile.mkdtemp(prefix="factstream-bench-export-"))
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)

    started = time.perf_counter()
    spark = build_session("local[2]", app_name="factstream export benchmark")
    startup = time.perf_counter() - started
    spark.sparkContext.setLogLevel("ERROR")
    lines = [f"Spark session start-up (local[2], cold): {startup:.1f} s"]
    try:
        runner = ExportRunner(spark, plugins, url, work.as_uri())
        # Warm-up: small exports through both paths (Python workers, imports, Parquet writers): a
        # DataFrame read by the data source, and the workers' direct write that this job takes.
        warm = spark.read.format("factstream").option("stream", "bench_export").option("upto", 10_001).load()
        warm.write.parquet(str(work / "warm"))
        direct.write_range(spark, url, runner.plan(job), str(work / "warm-direct"), 0, 10_001, 2)

        best_base = best_ours = 0.0
        for i in range(rounds):
            t = time.perf_counter()
            n = baseline(url, facts + 1, work / f"baseline-{i}.parquet")
            base_rate = n / (time.perf_counter() - t)
            best_base = max(best_base, base_rate)

            with psycopg.connect(libpq_url(url), autocommit=True) as conn:
                conn.execute("DELETE FROM export_checkpoints WHERE job = %s", (job.name,))
            out = work / f"out-{i}"
            out.mkdir()
            runner.output_root = out.as_uri()
            t = time.perf_counter()
            result = runner.run(job)
            ours_rate = result.rows / (time.perf_counter() - t)
            best_ours = max(best_ours, ours_rate)
            assert result.rows == n == facts, (result.rows, n, facts)
            lines.append(f"round {i + 1}: baseline {base_rate:,.0f} rows/s, export {ours_rate:,.0f} rows/s")
        # What Spark alone costs: copying the baseline's Parquet file to Parquet in the same session.
        t = time.perf_counter()
        spark.read.parquet(str(work / "baseline-0.parquet")).write.parquet(str(work / "spark-copy"))
        lines.append(f"Spark Parquet -> Parquet copy of the same rows: {facts / (time.perf_counter() - t):,.0f} rows/s")
        lines.append(
            f"export of {facts:,} facts to Parquet: {best_ours:,.0f} rows/s vs baseline {best_base:,.0f} rows/s "
            f"= {best_ours / best_base:.2f}x (target >= 0.8x)"
        )
    finally:
        spark.stop()
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--facts", type=int, default=1_000_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    with scratch_database(bench_server()) as url:
        for line in run(url, args.facts, args.rounds):
            print(line, flush=True)


if __name__ == "__main__":
    main()
