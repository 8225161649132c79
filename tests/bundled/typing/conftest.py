"""Fixtures of the typing plugin's tests: the events plugin's users and a ``main`` host writing ``events``
and ``typing``, and helpers that type and read ``/sync`` over HTTP as a Matrix client would."""

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

Clients = Callable[[str], httpx.AsyncClient]
ALICE, BOB, CAROL, DAVE, EVE = "@alice:hs", "@bob:hs", "@carol:hs", "@dave:hs", "@eve:hs"
#: A user of these tests besides the events tests' five: in no room unless a test puts them in one.
FRANK = "@frank:hs"
TYPING_TOKENS = TOKENS | {token_of(FRANK): {"user": FRANK}}


@pytest.fixture(autouse=True)
def _typing_plugin_installed() -> None:
    if not {"events", "typing"} <= set(load_plugins().registry.streams.names()):
        pytest.skip("the bundled events and typing plugins are not installed (uv sync --all-packages)")


@pytest.fixture
async def main(host_cluster: HostCluster) -> Host:
    """One host, ``main``, writing ``events`` and ``typing``, accepting the tokens of the users."""
    host_cluster.configure(http={"tokens": TYPING_TOKENS})
    return await host_cluster("main")


@pytest.fixture
def client(host_cluster: HostCluster, main: Host) -> Clients:
    """``client(user)``: an HTTP client of ``main`` with ``user``'s token."""
    return clients_of(host_cluster, main)


async def put_typing(
    http: httpx.AsyncClient, room: str, user: str, body: Any = None, *, content: bytes | None = None
) -> httpx.Response:
    """``PUT /rooms/{room}/typing/{user}`` with ``body`` as JSON (``{"typing": true}`` by default), or
    the raw ``content``."""
    path = f"/rooms/{room}/typing/{user}"
    if content is not None:
        return await http.put(path, content=content)
    return await http.put(path, json={"typing": True} if body is None else body)


async def sync(http: httpx.AsyncClient, since: str | None = None, timeout: int = 0) -> dict[str, Any]:
    """One ``/sync`` (``since``: incremental; ``timeout`` in ms: a long poll)."""
    params: dict[str, Any] = {"timeout": timeout}
    if since is not None:
        params["since"] = since
    response = await http.get("/sync", params=params)
    assert response.status_code == 200, response.text
    return dict(response.json())


def typing_of(body: dict[str, Any]) -> dict[str, list[str]]:
    """Each joined room's ``m.typing`` list in a ``/sync`` body (rooms without one left out); a room
    elsewhere than ``rooms.join`` with an ``m.typing`` fails."""
    out: dict[str, list[str]] = {}
    for section, rooms in body.get("rooms", {}).items():
        for room_id, room in rooms.items():
            for event in room.get("ephemeral", {}).get("events", []):
                if event["type"] != "m.typing":
                    continue
                assert section == "join", f"m.typing in rooms.{section}.{room_id}: {json.dumps(room)}"
                assert room_id not in out, f"two m.typing events for {room_id}: {json.dumps(room)}"
                assert set(event) == {"type", "content"} and set(event["content"]) == {"user_ids"}, event
                out[room_id] = event["content"]["user_ids"]
    return out
