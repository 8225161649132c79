"""Fixtures for the cache tests: the demo store plugin (tests/plugins/cachedemo) with the bundled
caches plugin and the notes test plugin, a migrated database, and in-process host factories."""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from factstream.config import load_config
from factstream.host.app import Host
from factstream.migrate import Migrator
from factstream.plugin.manager import load_plugins

ROOT = Path(__file__).resolve().parents[2]
CACHEDEMO = ROOT / "tests" / "plugins" / "cachedemo"
NOTES = ROOT / "tests" / "plugins" / "notes"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def cache_db(plugin_installer, fresh_database, monkeypatch) -> str:
    """A database migrated for caches, cachedemo and notes (notes rows invalidate a demo cache)."""
    monkeypatch.setenv("FACTSTREAM_CACHEDEMO_NOTES", "1")
    plugin_installer.from_project(CACHEDEMO)
    plugin_installer.from_project(NOTES)
    migrator = Migrator(fresh_database, load_plugins())
    migrator.upgrade()
    migrator.close()
    return fresh_database


@pytest.fixture
async def make_hosts(cache_db, tmp_path) -> AsyncIterator[Callable[..., Any]]:
    """``await make_hosts(name)``: a started Host (main serves TCP replication; worker1 connects)."""
    started: list[Host] = []
    port = free_port()

    async def start(name: str, **caches: Any) -> Host:
        settings = load_config(
            environ={},
            deployment="cachetest",
            instance_name=name,
            state_dir=str(tmp_path / "state"),
            database={"url": cache_db},
            instance_map={"main": {"host": "127.0.0.1", "replication_port": port}, "worker1": {"host": "127.0.0.1"}},
            stream_writers={"notes": ["main"]},
            caches=caches,
        )
        host = Host(settings, load_plugins())
        await host.start()
        started.append(host)
        return host

    yield start
    for host in reversed(started):
        if host.db is not None:
            await host.stop()
