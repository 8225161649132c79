"""Run every benchmark: ``uv run python benchmarks/run.py [--seconds S]``.

A scratch database is created (and dropped) on the server ``$FACTSTREAM_BENCH_DATABASE_URL``, else
``$FACTSTREAM_TEST_DATABASE_URL``, else an embedded PostgreSQL under a temporary directory. Each
benchmark measures its baseline in the same run and prints ratios against it.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import idgen_append


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=3.0, help="duration of each measurement (default 3)")
    args = parser.parse_args()
    server = os.environ.get("FACTSTREAM_BENCH_DATABASE_URL") or os.environ.get("FACTSTREAM_TEST_DATABASE_URL")
    if not server:
        from factstream.db.embedded import start_embedded

        server = start_embedded(Path(tempfile.mkdtemp(prefix="factstream-bench-")))
    from factstream.migrate import Migrator
    from factstream.plugins import load_plugins
    from factstream.testing import create_database, drop_database

    url = create_database(server, prefix="fs_bench")  # a scratch database on that server
    try:
        migrator = Migrator(url, load_plugins())
        migrator.upgrade()
        migrator.close()
        print(f"idgen append ({args.seconds:g} s each):", flush=True)
        for line in idgen_append.run(url, args.seconds):
            print("  " + line, flush=True)
    finally:
        drop_database(url)


if __name__ == "__main__":
    main()
