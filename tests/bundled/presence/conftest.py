"""Fixtures of the presence plugin's tests: the events plugin's hosts and users (its conftest), fast
timeouts, and helpers that set and read presence over HTTP as a Matrix client would."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import httpx
import pytest

from factstream.host.app import Host
from factstream.plugin.manager import load_plugins
from factstream.testing import HostCluster
from tests.bundled.events.conftest import TOKENS, clients_of, store_of

Clients = Callable[[str], httpx.AsyncClient]
#: Timeouts short enough for a test (plugins.presence): the state machine's rule is unchanged.
FAST: dict[str, int] = {
    "sync_online_timeout_ms": 1_000,
    "stop_syncing_delay_ms": 300,
    "check_interval_ms": 100,
}


@pytest.fixture(autouse=True)
def _presence_plugin_installed() -> None:
    if not {"events", "presence"} <= set(load_plugins().registry.streams.names()):
        pytest.skip("the bundled events and presence plugins are not installed (uv sync --all-packages)")


@pytest.fixture
async def main(host_cluster: HostCluster) -> Host:
    """One host, ``main``, writing ``events`` and ``presence`` with the :data:`FAST` timeouts."""
    host_cluster.configure(http={"tokens": TOKENS}, plugins={"presence": FAST})
    return await host_cluster("main")


@pytest.fixture
def client(host_cluster: HostCluster, main: Host) -> Clients:
    """``client(user)``: an HTTP client of ``main`` with ``user``'s token."""
    return clients_of(host_cluster, main)


async def shared_room(main: Host, *users: str) -> str:
    """A public room the first of ``users`` created and the others joined."""
    store = store_of(main)
    room = await store.create_room(users[0], preset="public_chat")
    for user in users[1:]:
        await store.change_membership(room, user, user, "join")
    return room


async def put_status(http: httpx.AsyncClient, user: str, body: Any) -> httpx.Response:
    """``PUT /presence/{user}/status`` with ``body`` as JSON (bytes: sent as they are)."""
    path = f"/presence/{user}/status"
    return await (http.put(path, content=body) if isinstance(body, bytes) else http.put(path, json=body))


async def get_status(http: httpx.AsyncClient, user: str) -> httpx.Response:
    return await http.get(f"/presence/{user}/status")


async def sync(http: httpx.AsyncClient, since: str | None = None, timeout: int = 0) -> dict[str, Any]:
    """One ``/sync`` (``since``: incremental; ``timeout`` in ms: a long poll)."""
    params: dict[str, Any] = {"timeout": timeout}
    if since is not None:
        params["since"] = since
    response = await http.get("/sync", params=params)
    assert response.status_code == 200, response.text
    return dict(response.json())


def presence_in(body: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The ``m.presence`` events of a ``/sync`` body, by sender (each sender at most once)."""
    out: dict[str, dict[str, Any]] = {}
    for event in body.get("presence", {}).get("events", []):
        assert event["type"] == "m.presence", event
        assert event["sender"] not in out, f"two m.presence events of {event['sender']}: {body['presence']}"
        out[event["sender"]] = event["content"]
    return out
