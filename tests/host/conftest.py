"""Fixtures for the HTTP API tests: a database with the ``inbox`` test plugin, hosts and clients.

``inbox_cluster`` is factstream.testing's ``host_cluster`` on that database, with the plugins this
test installed and no others, ``inbox`` written by main and the test tokens:
``await inbox_cluster("main", http={...})`` starts an in-process :class:`~factstream.host.app.Host`
(TCP replication between the hosts of one test). ``client(host, token=...)`` is an
``httpx.AsyncClient`` calling the host's ASGI app directly (no socket), so a test can hold a thousand
long polls open cheaply. ``full_host`` is one started host with every installed plugin (the bundled
ones too) and ``full_client(token=...)`` a client of it; ``stored(host)`` sums up what the database
holds.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
import pytest

from factstream.host.app import Host
from factstream.plugin.manager import load_plugins
from factstream.testing import DatabaseWith, HostCluster, free_port

INBOX_PROJECT = Path(__file__).resolve().parents[1] / "plugin_projects" / "inbox"

#: Bearer tokens every test host accepts.
TOKENS = {
    "alice-token": {"user": "@alice:hs", "write": False},
    "bob-token": {"user": "@bob:hs", "write": False},
    "writer-token": {"user": "@service:hs", "write": True},
}


@pytest.fixture
def inbox_db(database_with: DatabaseWith) -> str:
    """A database migrated for the core and the inbox plugin only (bundled plugins installed in the
    environment would add their own streams and sync keys to every test's token)."""
    return database_with(INBOX_PROJECT, only_installed=True)


@pytest.fixture
def inbox_cluster(inbox_db, plugin_installer, host_cluster: HostCluster) -> HostCluster:
    """``await inbox_cluster("main", stream_writers={"inbox": [...]}, http={...})`` -> a started Host."""
    return host_cluster.configure(
        database=inbox_db,
        plugin_host=lambda: plugin_installer.plugin_host(only_installed=True),
        stream_writers={"inbox": ["main"]},
        http={"tokens": TOKENS},
    )


@pytest.fixture
def client(host_cluster: HostCluster) -> Callable[..., httpx.AsyncClient]:
    """``client(host, token="alice-token", timeout=30.0)`` -> ``host_cluster.client`` of the host, with a
    timeout that outlasts the tests' long polls."""

    def make(host: Host, token: str | None = None, timeout: float = 30.0) -> httpx.AsyncClient:
        return host_cluster.client(host, token or None, timeout=timeout)

    return make


async def post_messages(host: Host, client: Callable[..., httpx.AsyncClient], *messages: tuple[str, str]) -> list[int]:
    """Append ``(user, body)`` messages through the plugin's write route; returns their stream IDs."""
    response = await client(host, "writer-token").post(
        "/inbox/messages", json=[{"user_id": u, "body": b} for u, b in messages]
    )
    assert response.status_code == 200, response.text
    return list(response.json()["stream_ids"])


# -- a host with every installed plugin (tests/host/test_http_input.py, test_http_fuzz.py) --------------

#: The users of the test tokens.
WRITER_USER = "@service:hs"
ALICE_USER = "@alice:hs"


@pytest.fixture
async def full_host(plugin_installer, host_cluster: HostCluster) -> Host:
    """A started host with every installed plugin, the ``inbox`` test plugin among them.

    Long polls are capped at 0.2 s so that fuzzed ``timeout`` values cannot stall a test.
    """
    plugin_installer.from_project(INBOX_PROJECT)
    if not {"account_data", "to_device"} <= set(load_plugins().registry.streams.names()):
        pytest.skip("the bundled account_data and to_device plugins are not installed (uv sync --all-packages)")
    host_cluster.configure(instances=("main",))
    return await host_cluster(
        "main",
        stream_writers={"inbox": ["main"], "account_data": ["main"], "to_device": ["main"]},
        http={
            "tokens": TOKENS,
            "port": free_port(),
            "sync_timeout_max_seconds": 0.2,
            "catch_up_timeout_seconds": 0.2,
        },
    )


@pytest.fixture
def full_client(full_host: Host, host_cluster: HostCluster) -> Callable[..., httpx.AsyncClient]:
    """``full_client(token=None)`` -> ``host_cluster.client`` of ``full_host``."""
    return lambda token=None: host_cluster.client(full_host, token or None)


async def stored(host: Host) -> dict[str, tuple[int, Any]]:
    """Row count and highest stream ID of every stream's backing tables, and row counts of every
    other table of the database (a device registered, a transaction remembered ...)."""
    db = host.database()
    out: dict[str, tuple[int, Any]] = {}
    for reg in host.plugins.registry.streams:
        for table in reg.spec.tables:
            rows = await db.fetchall(f"SELECT count(*), max({table.id_column}) FROM {table.table}")
            out[table.table] = (rows[0][0], rows[0][1])
    names = await db.fetchall("SELECT tablename FROM pg_tables WHERE schemaname = current_schema()")
    for (name,) in names:
        if name not in out:
            rows = await db.fetchall(f'SELECT count(*) FROM "{name}"')
            out[name] = (rows[0][0], None)
    return out
