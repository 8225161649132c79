"""Fixtures for the bundled account_data and to_device plugins: a migrated database, in-process hosts
(main and worker1 over TCP, one database), an ``on_rows`` observer, a stand-in HTTP app serving the
plugins' routes, and a direct call of a stream's ``sync_rows`` as ``/sync`` would make it."""

from __future__ import annotations

import asyncio
import socket
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import httpx
import pytest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.routing import Route

from factstream import SyncRequest
from factstream.config import load_config
from factstream.host.app import Host
from factstream.migrate import Migrator
from factstream.plugin.manager import load_plugins
from tests.export.conftest import spark  # noqa: F401  (the session's local Spark, for the export job test)

ROOT = Path(__file__).resolve().parents[2]

#: A plugin that records, per instance, every replicated row (``(stream, instance, token, row)``).
OBSERVER = """
import factstream

seen = {}

@factstream.hookimpl
def on_rows(host, stream, instance, token, rows):
    seen.setdefault(host.instance_name, []).extend((stream, instance, token, row) for row in rows)
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(autouse=True)
def _bundled_plugins_installed() -> None:
    names = load_plugins().registry.streams.names()
    if not {"account_data", "to_device"} <= set(names):
        pytest.skip("the bundled account_data and to_device plugins are not installed (uv sync --all-packages)")


@pytest.fixture
def bundled_db(plugin_installer, fresh_database) -> str:
    """A database migrated for every installed plugin, with the row observer installed."""
    plugin_installer.from_source("fs_observer", OBSERVER)
    migrator = Migrator(fresh_database, load_plugins())
    migrator.upgrade()
    migrator.close()
    return fresh_database


def seen_rows(instance: str, stream: str) -> list[tuple[str, int, Any]]:
    """``(writer, token, row)`` of ``stream`` that ``instance`` received, in arrival order."""
    observer = sys.modules["factstream_fs_observer"]
    return [(i, t, r) for s, i, t, r in list(observer.seen.get(instance, [])) if s == stream]


@pytest.fixture
async def make_host(bundled_db, tmp_path) -> AsyncIterator[Callable[..., Any]]:
    """``await make_host(name, writers=..., http=...)``: a started Host; main serves TCP replication.

    ``writers`` (default ``["main"]``) are the configured writers of both streams; ``http`` is the
    ``http`` section of its configuration (tokens, limits).
    """
    started: list[Host] = []
    port = free_port()

    async def start(name: str, writers: list[str] | None = None, http: dict[str, Any] | None = None) -> Host:
        writers = writers or ["main"]
        settings = load_config(
            environ={},
            deployment="bundledtest",
            instance_name=name,
            state_dir=str(tmp_path / "state"),
            database={"url": bundled_db},
            instance_map={
                "main": {"host": "127.0.0.1", "replication_port": port},
                "worker1": {"host": "127.0.0.1"},
                "worker2": {"host": "127.0.0.1"},
            },
            stream_writers={"account_data": writers, "to_device": writers},
            http=http or {},
        )
        host = Host(settings, load_plugins())
        await host.start()
        started.append(host)
        return host

    yield start
    for host in reversed(started):
        if host.db is not None:
            await host.stop()


async def until(predicate: Callable[[], Any], timeout: float = 10.0, what: str = "condition") -> Any:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if loop.time() > deadline:
            raise AssertionError(f"{what} not reached in time")
        await asyncio.sleep(0.01)


async def following(worker: Host, *streams: str) -> None:
    """Wait until ``worker`` follows ``streams`` on some connection."""
    assert worker.handler is not None
    wanted = set(streams)
    await until(lambda: any(wanted <= s for s in worker.handler._connected.values()), what=f"following {wanted}")


def positions(host: Host, stream: str) -> dict[str, int]:
    """The host's view of every configured writer's position (what a new sync token would hold)."""
    gen = host.id_generator(stream)
    return {w: gen.get_current_token_for_writer(w) for w in gen.writers}


async def sync(
    host: Host,
    stream: str,
    user: str,
    since: dict[str, int],
    *,
    device: str | None = None,
    limit: int = 1000,
) -> tuple[list[dict[str, Any]], dict[str, int]]:
    """What ``/sync`` asks of the stream for a token: the items after ``since`` and the new positions."""
    spec = host.plugins.registry.streams.get(stream)
    upto = positions(host, stream)
    request = SyncRequest(host=host, stream=stream, user=user, device=device, since=since, upto=upto, limit=limit)
    return await spec.sync_rows(request), upto


def stand_in_app(host: Host) -> Starlette:
    """The plugins' routes as the host's HTTP layer will serve them, with ``Authorization: Bearer
    <user_id>`` as the authenticated user (a stand-in until factstream.host serves HTTP)."""

    def wrap(endpoint: Callable[..., Any]) -> Callable[..., Any]:
        async def call(request: Request) -> Any:
            auth = request.headers.get("authorization", "")
            request.state.user = auth.removeprefix("Bearer ") or None
            request.state.host = host
            return await endpoint(request)

        return call

    specs = [r.spec for r in host.plugins.registry.routes]
    routes = [Route(spec.path, wrap(spec.endpoint), methods=list(spec.methods)) for spec in specs]
    return Starlette(routes=routes)


@pytest.fixture
async def client_for() -> AsyncIterator[Callable[[Host, str], httpx.AsyncClient]]:
    """``client_for(host, user)``: an HTTP client of the stand-in app, authenticated as ``user``."""
    clients: list[httpx.AsyncClient] = []

    def make(host: Host, user: str) -> httpx.AsyncClient:
        client = httpx.AsyncClient(
            transport=httpx.ASGITransport(app=stand_in_app(host)),
            base_url="http://test",
            headers={"Authorization": f"Bearer {user}"},
        )
        clients.append(client)
        return client

    yield make
    for client in clients:
        await client.aclose()
