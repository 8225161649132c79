"""Fixtures of the receipts plugin's tests: the events plugin's hosts and users (its conftest), and
helpers that send receipts and read ``/sync`` over HTTP as a Matrix client would."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from factstream.host.app import Host
from factstream.plugin.manager import load_plugins
from factstream.testing import HostCluster
from tests.bundled.events.conftest import TOKENS, clients_of, token_of
from tests.export.conftest import spark  # noqa: F401  (the session's local Spark, for the export job test)

Clients = Callable[[str], httpx.AsyncClient]
#: The users of these tests: the events tests' five, and frank.
FRANK = "@frank:hs"
RECEIPT_TOKENS = TOKENS | {token_of(FRANK): {"user": FRANK}}


@pytest.fixture
async def main(host_cluster: HostCluster) -> Host:
    """One host, ``main``, writing ``events`` and ``receipts``, accepting the tokens of the users."""
    # Presence off: a user's first /sync makes them online, and that change wakes their own long poll
    # (and their room-mates'), which these tests of who a receipt wakes would count.
    host_cluster.configure(http={"tokens": RECEIPT_TOKENS}, plugins={"presence": {"enabled": False}})
    return await host_cluster("main")


@pytest.fixture
def client(host_cluster: HostCluster, main: Host) -> Clients:
    """``client(user)``: an HTTP client of ``main`` with ``user``'s token."""
    return clients_of(host_cluster, main)


@pytest.fixture(autouse=True)
def _receipts_plugin_installed() -> None:
    if not {"events", "receipts"} <= set(load_plugins().registry.streams.names()):
        pytest.skip("the bundled events and receipts plugins are not installed (uv sync --all-packages)")


async def send_receipt(
    http: httpx.AsyncClient, room: str, event_id: str, receipt_type: str = "m.read", body: Any = None
) -> httpx.Response:
    """``POST /rooms/{room}/receipt/{receipt_type}/{event_id}`` (with ``body`` as JSON when given)."""
    path = f"/rooms/{room}/receipt/{receipt_type}/{event_id}"
    return await http.post(path, json=body) if body is not None else await http.post(path)


async def sync(http: httpx.AsyncClient, since: str | None = None, timeout: int = 0) -> dict[str, Any]:
    """One ``/sync`` (``since``: incremental; ``timeout`` in ms: a long poll)."""
    params: dict[str, Any] = {"timeout": timeout}
    if since is not None:
        params["since"] = since
    response = await http.get("/sync", params=params)
    assert response.status_code == 200, response.text
    return dict(response.json())


def receipts_in(body: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Each joined room's ``m.receipt`` content in a ``/sync`` body (rooms without one left out)."""
    out: dict[str, dict[str, Any]] = {}
    for room_id, room in body.get("rooms", {}).get("join", {}).items():
        for event in room.get("ephemeral", {}).get("events", []):
            if event["type"] == "m.receipt":
                assert room_id not in out, f"two m.receipt events for {room_id}: {json.dumps(room)}"
                out[room_id] = event["content"]
    return out


def seen(body: dict[str, Any]) -> set[tuple[str, str, str, str]]:
    """The receipts of a ``/sync`` body as ``(room, event_id, receipt_type, user)``."""
    return {
        (room_id, event_id, receipt_type, user)
        for room_id, content in receipts_in(body).items()
        for event_id, types in content.items()
        for receipt_type, users in types.items()
        for user in users
    }
