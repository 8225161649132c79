"""Fixtures for replication tests: a migrated database with the notes plugin, and host factories."""

from __future__ import annotations

import socket
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import pytest

from factstream.config import load_config
from factstream.host.app import Host
from factstream.migrate import Migrator
from factstream.plugin.manager import load_plugins

# The process tests' fixtures (a cluster of `factstream run` processes, a dedicated redis-server), for
# every process test of this folder.
from tests.replication.test_processes import cluster, redis_server  # noqa: F401

RECORDER = """
    import factstream

    received = {}

    @factstream.hookimpl
    def on_rows(host, stream, instance, token, rows):
        received.setdefault(host.instance_name, []).extend((stream, instance, token, r) for r in rows)
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def notes_db(plugin_installer, notes_project, fresh_database) -> str:
    plugin_installer.from_project(notes_project)
    plugin_installer.from_source("recorder", RECORDER)
    migrator = Migrator(fresh_database, load_plugins())
    migrator.upgrade()
    migrator.close()
    return fresh_database


HostFactory = Callable[..., Awaitable[Host]]


@pytest.fixture
async def make_hosts(notes_db, tmp_path) -> AsyncIterator[Callable[..., Any]]:
    """``make_hosts(redis_url=None, writers=("main",))`` -> settings factory; ``start(name)`` -> Host."""
    started: list[Host] = []
    port = free_port()

    def settings(
        name: str,
        *,
        redis_url: str | None = None,
        writers: tuple[str, ...] = ("main",),
        deployment: str = "test",
        replication: dict[str, Any] | None = None,
    ):
        overrides: dict[str, Any] = {
            "deployment": deployment,
            "instance_name": name,
            "state_dir": str(tmp_path / "state"),
            "database": {"url": notes_db},
            "instance_map": {
                "main": {"host": "127.0.0.1", "replication_port": port},
                "worker1": {"host": "127.0.0.1"},
                "worker2": {"host": "127.0.0.1"},
            },
            "stream_writers": {"notes": list(writers)},
        }
        if redis_url:
            overrides["redis"] = {"url": redis_url}
        if replication:
            overrides["replication"] = replication
        return load_config(environ={}, **overrides)

    async def start(name: str, **kwargs: Any) -> Host:
        host = Host(settings(name, **kwargs), load_plugins())
        await host.start()
        started.append(host)
        return host

    yield start
    for host in reversed(started):
        if host.db is not None:
            await host.stop()
