"""Fixtures for the bundled account_data and to_device plugins: a migrated database, factstream.testing's
``host_cluster`` on it (main and worker1 over TCP, one database; both streams written by main unless a
host says otherwise: ``stream_writers=writing("main", "worker1")``), factstream.testing's ``row_recorder``
installed, and clients of the hosts' HTTP API (``tests/bundled/account_data_to_device/support.py`` holds
the tokens they use)."""

from __future__ import annotations

from collections.abc import Callable

import httpx
import pytest

from factstream.host.app import Host
from factstream.plugin.manager import load_plugins
from factstream.testing import DatabaseWith, HostCluster, RowRecorder
from tests.export.conftest import spark  # noqa: F401  (the session's local Spark, for the export job test)


def writing(*writers: str) -> dict[str, list[str]]:
    """``stream_writers`` with ``writers`` writing both bundled streams."""
    return {"account_data": list(writers), "to_device": list(writers)}


@pytest.fixture(autouse=True)
def _bundled_plugins_installed() -> None:
    names = load_plugins().registry.streams.names()
    if not {"account_data", "to_device"} <= set(names):
        pytest.skip("the bundled account_data and to_device plugins are not installed (uv sync --all-packages)")


@pytest.fixture
def bundled_db(database_with: DatabaseWith, row_recorder: RowRecorder) -> str:
    """A database migrated for every installed plugin, factstream.testing's ``row_recorder`` installed."""
    return database_with()


@pytest.fixture
def host_cluster(bundled_db: str, host_cluster: HostCluster) -> HostCluster:
    """Hosts on ``bundled_db`` (main serves TCP replication), both streams written by main."""
    return host_cluster.configure(database=bundled_db, stream_writers=writing("main"))


def positions(host: Host, stream: str) -> dict[str, int]:
    """The host's view of every configured writer's position (what a new sync token would hold)."""
    gen = host.id_generator(stream)
    return {w: gen.get_current_token_for_writer(w) for w in gen.writers}


@pytest.fixture
def client_for(host_cluster: HostCluster) -> Callable[[Host, str], httpx.AsyncClient]:
    """``client_for(host, user)``: ``host_cluster.client`` of the host with ``user``'s bearer token
    (``support.token_of``; the host must accept ``support.TOKENS``)."""
    from tests.bundled.account_data_to_device.support import token_of

    return lambda host, user: host_cluster.client(host, token_of(user))
