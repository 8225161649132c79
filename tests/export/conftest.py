"""Fixtures for the export tests: one shared local Spark session, a database with the test plugin's
tables, and writers that append facts through real ID generators."""

from __future__ import annotations

import asyncio
import os
import sys
import threading
from collections.abc import Coroutine, Iterator
from pathlib import Path
from typing import Any, TypeVar

import psycopg
import pytest

from factstream.db.engine import libpq_url
from factstream.plugin.manager import PluginHost, load_plugins
from tests.export import exportplugin

ROOT = Path(__file__).resolve().parents[2]
T = TypeVar("T")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "tests/export/" in str(item.fspath).replace(os.sep, "/"):
            item.add_marker(pytest.mark.spark)


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    """One local[2] Spark session for the whole test run (UI off, 2 shuffle partitions).

    Python workers import ``tests.export.exportplugin`` (its update function), so the repository root
    is put on their ``PYTHONPATH``.
    """
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["PYSPARK_DRIVER_PYTHON"] = sys.executable
    paths = [str(ROOT), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    os.environ["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))
    from factstream.export.session import build_session

    session = build_session(
        "local[2]",
        app_name="factstream tests",
        conf={"spark.sql.shuffle.partitions": "2", "spark.default.parallelism": "2", "spark.ui.enabled": "false"},
    )
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()


@pytest.fixture
def export_plugins() -> PluginHost:
    """The core plus the export test plugin."""
    return load_plugins(extra=[("exporttest", exportplugin)])


@pytest.fixture
def export_db(migrated_database: str) -> str:
    """A migrated database with the export test plugin's tables and sequences."""
    with psycopg.connect(libpq_url(migrated_database), autocommit=True) as conn:
        for sql in exportplugin.TABLES_SQL:
            conn.execute(sql)
    return migrated_database


class LoopThread:
    """An event loop on a background thread, so sync tests can hold async writers open across Spark calls."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.thread.start()

    def run(self, coro: Coroutine[Any, Any, T], timeout: float = 60) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(timeout)

    def close(self) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(timeout=5)


@pytest.fixture
def loop_thread() -> Iterator[LoopThread]:
    lt = LoopThread()
    yield lt
    lt.close()
