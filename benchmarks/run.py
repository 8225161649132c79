"""Run every benchmark: ``uv run python benchmarks/run.py [--seconds S]``.

A scratch database is created (and dropped) on the server ``$FACTSTREAM_BENCH_DATABASE_URL``, else
``$FACTSTREAM_TEST_DATABASE_URL``, else an embedded PostgreSQL under a temporary directory. Each
benchmark measures its baseline in the same run and prints ratios against it.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import caches_invalidation
import codec
import ephemeral
import events_export
import events_replication
import events_storage
import events_writers
import http_latency
import idgen_append
import replication_e2e
import spark_export
import sync_rooms
import sync_wakeup
from scratch import bench_server, scratch_database

#: What runs without ``--only``; ``events-replication`` runs as part of ``events``.
DEFAULT = [
    "idgen", "codec", "replication", "caches", "export", "events-export", "sync", "events", "http", "sync-rooms",
    "events-writers", "ephemeral",
]  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=3.0, help="duration of each measurement (default 3)")
    parser.add_argument(
        "--only",
        choices=[*DEFAULT, "events-replication"],
        action="append",
        help="run only these (repeatable; events includes events-replication)",
    )
    parser.add_argument("--export-facts", type=int, default=1_000_000, help="facts in the Spark export benchmark")
    parser.add_argument("--export-events", type=int, default=1_000_000, help="events in the events export benchmark")
    parser.add_argument("--catch-up-facts", type=int, default=1_000_000, help="facts behind for the catch-up test")
    parser.add_argument("--sync-polls", type=int, default=10_000, help="idle long polls in the sync benchmark")
    parser.add_argument(
        "--events-scale",
        type=float,
        default=1.0,
        help="scale of the events benchmark's sizes, and of events-writers' measured time",
    )
    parser.add_argument(
        "--metrics-ab",
        action="store_true",
        help="for replication and sync: alternate metrics.enabled off and on in one run and print on/off ratios",
    )
    args = parser.parse_args()
    server = bench_server()
    with scratch_database(server) as url:  # a scratch database on that server
        only = set(args.only or DEFAULT)
        if "idgen" in only:
            print(f"idgen append ({args.seconds:g} s each):", flush=True)
            for line in idgen_append.run(url, args.seconds):
                print("  " + line, flush=True)
        if "codec" in only:
            print("replication codec:", flush=True)
            for line in codec.run(args.seconds):
                print("  " + line, flush=True)
        if "replication" in only:
            redis_url = os.environ.get("FACTSTREAM_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
            print("replication end to end (hosts in one process):", flush=True)
            if args.metrics_ab:
                lines = replication_e2e.metrics_ab(url, redis_url, args.seconds)
            else:
                lines = replication_e2e.run(url, redis_url, args.seconds, args.catch_up_facts)
            for line in lines:
                print("  " + line, flush=True)
        if "caches" in only:
            print("cache invalidation end to end (write, replicate over TCP, apply):", flush=True)
            for line in caches_invalidation.run(url, args.seconds):
                print("  " + line, flush=True)
        if "export" in only:
            print("Spark export to Parquet (local[2], warm session):", flush=True)
            for line in spark_export.run(url, args.export_facts):
                print("  " + line, flush=True)
        if "events-export" in only:
            print(
                "events plugin: the events export job, 1 event a row (local[*], then a standalone cluster):", flush=True
            )
            for line in events_export.run(url, args.export_events):
                print("  " + line, flush=True)
        if "sync" in only:
            print(f"/sync wake-ups with {args.sync_polls:,} idle long polls (one host, local writes):", flush=True)
            lines = (
                sync_wakeup.metrics_ab(url, args.sync_polls)
                if args.metrics_ab
                else sync_wakeup.run(url, args.sync_polls)
            )
            for line in lines:
                print("  " + line, flush=True)
        if "events" in only:
            print(
                f"events plugin: room event storage ({args.seconds:g} s a rate, scale {args.events_scale:g}):",
                flush=True,
            )
            events_storage.run(
                url, args.seconds, scale=args.events_scale, emit=lambda line: print("  " + line, flush=True)
            )
        if "events" in only or "events-replication" in only:
            redis_url = os.environ.get("FACTSTREAM_TEST_REDIS_URL", "redis://127.0.0.1:6379/0")
            print(
                f"events stream replication to two reader processes ({2 * args.seconds:g} s of writes a workload):",
                flush=True,
            )
            events_replication.run(url, redis_url, args.seconds, emit=lambda line: print("  " + line, flush=True))
        if "events-writers" in only:
            print(
                f"several event writers (issue 35): remote batches of 100, 1, 2 and 4 writer processes against as"
                f" many psycopg processes ({args.seconds * args.events_scale:g} s a side and count):",
                flush=True,
            )
            events_writers.run(
                server, args.seconds, scale=args.events_scale, emit=lambda line: print("  " + line, flush=True)
            )
        if "ephemeral" in only:
            print("ephemeral streams (issue 46): typing and receipts to two readers, typing's wake-up:", flush=True)
            ephemeral.run(url, polls=args.sync_polls, emit=lambda line: print("  " + line, flush=True))
        if "http" in only:
            print(
                f"HTTP latency, kept-alive connections, a request at a time ({args.seconds:g} s a route):", flush=True
            )
            for line in http_latency.run(url, args.seconds):
                print("  " + line, flush=True)
        if "sync-rooms" in only:
            print(f"rooms in /sync (issue 32), {args.sync_polls:,} idle long polls:", flush=True)
            sync_rooms.run(url, polls=args.sync_polls, emit=lambda line: print("  " + line, flush=True))


if __name__ == "__main__":
    main()
