"""Fixtures for replication tests: a migrated database with the notes plugin and a row recorder, and
the ``host_cluster`` of factstream.testing on it (``notes`` written by main unless a host says otherwise)."""

from __future__ import annotations

from pathlib import Path

import pytest

from factstream.testing import DatabaseWith, HostCluster

RECORDER = """
    import factstream
    from factstream import RowsHandlerSpec

    received = {}

    def recorder(stream):
        def record(host, instance, token, rows, local):
            received.setdefault(host.instance_name, []).extend((stream, instance, token, r) for r in rows)

        return record

    @factstream.hookimpl
    def register_rows_handlers(register, streams):
        for spec in streams:
            register(RowsHandlerSpec(stream=spec, handler=recorder(spec.name)))
"""


@pytest.fixture
def notes_db(database_with: DatabaseWith, notes_project: Path) -> str:
    """A database migrated for the notes plugin and the row recorder (and every installed plugin)."""
    return database_with(notes_project, sources={"recorder": RECORDER})


@pytest.fixture
def host_cluster(notes_db: str, host_cluster: HostCluster) -> HostCluster:
    """Hosts on ``notes_db`` (deployment ``test``; main, worker1, worker2), ``notes`` written by main."""
    return host_cluster.configure(database=notes_db, stream_writers={"notes": ["main"]})


# The process tests' fixture (a cluster of `factstream run` processes with the probe plugin), for every
# process test of this folder.
from tests.replication.test_processes import cluster  # noqa: E402, F401
