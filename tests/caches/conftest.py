"""Fixtures for the cache tests: the demo store plugin (tests/plugin_projects/cachedemo) with the bundled
caches plugin and the notes test plugin, a migrated database, and factstream.testing's
``host_cluster`` on it (``await host_cluster("main", caches={...})``; ``notes`` written by main)."""

from __future__ import annotations

from pathlib import Path

import pytest

from factstream.testing import DatabaseWith, HostCluster

ROOT = Path(__file__).resolve().parents[2]
CACHEDEMO = ROOT / "tests" / "plugin_projects" / "cachedemo"
NOTES = ROOT / "tests" / "plugin_projects" / "notes"


@pytest.fixture
def cache_db(database_with: DatabaseWith, monkeypatch: pytest.MonkeyPatch) -> str:
    """A database migrated for caches, cachedemo and notes (notes rows invalidate a demo cache)."""
    monkeypatch.setenv("FACTSTREAM_CACHEDEMO_NOTES", "1")
    return database_with(CACHEDEMO, NOTES)


@pytest.fixture
def host_cluster(cache_db: str, host_cluster: HostCluster) -> HostCluster:
    """Hosts on ``cache_db`` (main serves TCP replication; worker1 connects), ``notes`` written by main."""
    return host_cluster.configure(database=cache_db, stream_writers={"notes": ["main"]})
