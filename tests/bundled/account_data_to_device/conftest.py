"""Fixtures for the bundled account_data and to_device plugins: a migrated database, factstream.testing's
``host_cluster`` on it (main and worker1 over TCP, one database; both streams written by main unless a
host says otherwise: ``stream_writers=writing("main", "worker1")``), a rows handler observing every stream, and
clients of the hosts' HTTP API (``tests/bundled/account_data_to_device/support.py`` holds the tokens they use)."""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator, Callable
from typing import Any

import httpx
import pytest

from factstream.host.app import Host
from factstream.plugin.manager import load_plugins
from factstream.testing import DatabaseWith, HostCluster
from tests.export.conftest import spark  # noqa: F401  (the session's local Spark, for the export job test)

#: A plugin that records, per instance, every replicated row (``(stream, instance, token, row)``).
OBSERVER = """
import factstream
from factstream import RowsHandlerSpec

seen = {}

def observer(stream):
    def observe(host, instance, token, rows, local):
        seen.setdefault(host.instance_name, []).extend((stream, instance, token, row) for row in rows)

    return observe

@factstream.hookimpl
def register_rows_handlers(register, streams):
    for spec in streams:
        register(RowsHandlerSpec(stream=spec, handler=observer(spec.name)))
"""


def writing(*writers: str) -> dict[str, list[str]]:
    """``stream_writers`` with ``writers`` writing both bundled streams."""
    return {"account_data": list(writers), "to_device": list(writers)}


@pytest.fixture(autouse=True)
def _bundled_plugins_installed() -> None:
    names = load_plugins().registry.streams.names()
    if not {"account_data", "to_device"} <= set(names):
        pytest.skip("the bundled account_data and to_device plugins are not installed (uv sync --all-packages)")


@pytest.fixture
def bundled_db(database_with: DatabaseWith) -> str:
    """A database migrated for every installed plugin, with the row observer installed."""
    return database_with(sources={"fs_observer": OBSERVER})


@pytest.fixture
def host_cluster(bundled_db: str, host_cluster: HostCluster) -> HostCluster:
    """Hosts on ``bundled_db`` (main serves TCP replication), both streams written by main."""
    return host_cluster.configure(database=bundled_db, stream_writers=writing("main"))


def seen_rows(instance: str, stream: str) -> list[tuple[str, int, Any]]:
    """``(writer, token, row)`` of ``stream`` that ``instance`` received, in arrival order."""
    observer = sys.modules["factstream_fs_observer"]
    return [(i, t, r) for s, i, t, r in list(observer.seen.get(instance, [])) if s == stream]


def positions(host: Host, stream: str) -> dict[str, int]:
    """The host's view of every configured writer's position (what a new sync token would hold)."""
    gen = host.id_generator(stream)
    return {w: gen.get_current_token_for_writer(w) for w in gen.writers}


@pytest.fixture
async def client_for(host_cluster: HostCluster) -> AsyncIterator[Callable[[Host, str], httpx.AsyncClient]]:
    """``client_for(host, user)``: a client of the host's HTTP API (its ASGI app, no socket) with
    ``user``'s bearer token (``support.token_of``; the host must accept ``support.TOKENS``)."""
    from tests.bundled.account_data_to_device.support import token_of

    clients: list[httpx.AsyncClient] = []

    def make(host: Host, user: str) -> httpx.AsyncClient:
        client = httpx.AsyncClient(
            transport=httpx.ASGITransport(app=host.app),
            base_url="http://test",
            headers={"Authorization": f"Bearer {token_of(user)}"},
        )
        clients.append(client)
        return client

    yield make
    for client in clients:
        await client.aclose()
