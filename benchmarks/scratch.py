"""The database server of a benchmark run and a scratch database on it, migrated for every plugin.

The server is ``$FACTSTREAM_BENCH_DATABASE_URL``, else ``$FACTSTREAM_TEST_DATABASE_URL``, else an embedded
PostgreSQL started in a new temporary directory (docs/benchmarks.md, "Running them").
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path


def bench_server() -> str:
    """The server URL the benchmarks make their databases on."""
    server = os.environ.get("FACTSTREAM_BENCH_DATABASE_URL") or os.environ.get("FACTSTREAM_TEST_DATABASE_URL")
    if server:
        return server
    from factstream.db.embedded import start_embedded

    return start_embedded(Path(tempfile.mkdtemp(prefix="factstream-bench-")))


@contextlib.contextmanager
def scratch_database(server: str) -> Iterator[str]:
    """A database ``fs_bench_<random>`` on ``server``, every loaded plugin's branch upgraded; dropped
    on the way out, also when the benchmark fails."""
    from factstream.migrate import Migrator
    from factstream.plugin.manager import load_plugins
    from factstream.testing import create_database, drop_database

    url = create_database(server, prefix="fs_bench")
    try:
        migrator = Migrator(url, load_plugins())
        migrator.upgrade()
        migrator.close()
        yield url
    finally:
        drop_database(url)
