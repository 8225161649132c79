"""Helpers of the bundled plugins' tests, beside ``conftest.py``: hosts whose configuration takes the
plugins' settings and bearer tokens, clients of the host's real HTTP API (its route wrapper, access
levels and error shape), and a stream's ``sync_rows`` called as ``/sync`` calls it (with the host's
plugin API).

A test module makes its fixtures from them::

    @pytest.fixture
    async def make_host(bundled_db, tmp_path):
        async with Hosts(bundled_db, tmp_path) as hosts:
            yield hosts.start
"""

from __future__ import annotations

from pathlib import Path
from types import TracebackType
from typing import Any

import httpx

from factstream import SyncRequest
from factstream.config import load_config
from factstream.host.app import Host
from factstream.plugin.manager import load_plugins
from tests.plugins_bundled.conftest import free_port, positions

#: The users with a bearer token on every host; every token may write.
USERS = ("@alice:hs", "@bob:hs", "@carol:hs")


def token_of(user: str) -> str:
    return "tok-" + user.strip("@").replace(":", "-")


TOKENS = {token_of(user): {"user": user, "write": True} for user in USERS}


class Hosts:
    """``await hosts.start(name, writers=..., http=..., plugins=...)``: a started host (main serves TCP
    replication); every host started is stopped when the context ends.

    ``writers`` (default ``["main"]``) are the configured writers of both streams; ``http`` is added to
    the ``http`` section (which holds :data:`TOKENS`); ``plugins`` is the ``plugins`` section.
    """

    def __init__(self, database_url: str, tmp_path: Path) -> None:
        self.database_url = database_url
        self.tmp_path = tmp_path
        self.port = free_port()
        self.started: list[Host] = []
        self.clients: list[httpx.AsyncClient] = []

    def settings(
        self,
        name: str,
        writers: list[str] | None = None,
        http: dict[str, Any] | None = None,
        plugins: dict[str, Any] | None = None,
        environ: dict[str, str] | None = None,
    ) -> Any:
        writers = writers or ["main"]
        return load_config(
            environ=environ or {},
            deployment="bundledtest",
            instance_name=name,
            state_dir=str(self.tmp_path / "state"),
            database={"url": self.database_url},
            instance_map={
                "main": {"host": "127.0.0.1", "replication_port": self.port},
                "worker1": {"host": "127.0.0.1"},
                "worker2": {"host": "127.0.0.1"},
            },
            stream_writers={"account_data": writers, "to_device": writers},
            http={"tokens": TOKENS, **(http or {})},
            plugins=plugins or {},
        )

    async def start(
        self,
        name: str,
        writers: list[str] | None = None,
        http: dict[str, Any] | None = None,
        plugins: dict[str, Any] | None = None,
        environ: dict[str, str] | None = None,
    ) -> Host:
        host = Host(self.settings(name, writers, http, plugins, environ), load_plugins())
        self.started.append(host)
        await host.start()
        return host

    def client(self, host: Host, user: str) -> httpx.AsyncClient:
        """An HTTP client of ``host``'s API (its ASGI app, no socket), with ``user``'s bearer token."""
        client = httpx.AsyncClient(
            transport=httpx.ASGITransport(app=host.app),
            base_url="http://test",
            headers={"Authorization": f"Bearer {token_of(user)}"},
        )
        self.clients.append(client)
        return client

    async def __aenter__(self) -> Hosts:
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        for client in self.clients:
            await client.aclose()
        for host in reversed(self.started):
            if host.db is not None:
                await host.stop()


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
    assert spec.sync_rows is not None
    upto = positions(host, stream)
    request = SyncRequest(host=host.api, stream=stream, user=user, device=device, since=since, upto=upto, limit=limit)
    return list(await spec.sync_rows(request)), upto
