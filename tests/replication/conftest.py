"""Fixtures for replication tests: a migrated database with the notes plugin and factstream.testing's
``row_recorder`` installed, and the ``host_cluster`` of factstream.testing on it (``notes`` written by
main unless a host says otherwise)."""

from __future__ import annotations

from pathlib import Path

import pytest

from factstream.testing import DatabaseWith, HostCluster, RowRecorder


@pytest.fixture
def notes_db(database_with: DatabaseWith, notes_project: Path, row_recorder: RowRecorder) -> str:
    """A database migrated for the notes plugin (and every installed plugin), ``row_recorder`` installed."""
    return database_with(notes_project)


@pytest.fixture
def host_cluster(notes_db: str, host_cluster: HostCluster) -> HostCluster:
    """Hosts on ``notes_db`` (deployment ``test``; main, worker1, worker2), ``notes`` written by main."""
    return host_cluster.configure(database=notes_db, stream_writers={"notes": ["main"]})


# The process tests' fixture (a cluster of `factstream run` processes with the probe plugin), for every
# process test of this folder.
from tests.replication.test_processes import cluster  # noqa: E402, F401
