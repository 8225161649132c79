"""The walk of one ``/sync`` request through the events plugin's read wing (docs/plugins/events.md,
"The read path"): it reads as a table of contents, as the write path does, not as a bounce between
modules.

The walk is traced, not reviewed: a profile hook sees every Python frame that starts while an
incremental ``/sync`` (and an initial one) is answered, and keeps those of the wing's own modules
(``factstream_events.read.*``) and of the plugin's entry (``store``, ``routes``); the Matrix rules and the
shared helpers below them (``rules.*``, ``shared.*``) are the libraries both wings call, as leaves. A
*stop* is a frame of such a module that starts while no frame of that module is on its await chain (its
callers); a *return* is a stop at a module the walk had stopped at before, and left. The acceptance of
the read wing's plan: at most 3 returns. A module that calls another in a loop, or a helper that reaches
back into the module that called it, shows here.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any

import httpx
import pytest

from factstream.host.app import Host
from tests.bundled.events.conftest import store_of

ALICE, BOB = "@alice:hs", "@bob:hs"
Clients = Callable[[str], httpx.AsyncClient]
MAX_RETURNS = 3
_PACKAGE = "factstream_events"
_WALKED = ("read", "store", "routes")


def _module(frame: FrameType) -> str | None:
    """The wing module a frame runs in (``read.sync``, ``store``), or None when it is not one of them."""
    name = frame.f_globals.get("__name__", "")
    if not isinstance(name, str) or not name.startswith(_PACKAGE + "."):
        return None
    tail = name[len(_PACKAGE) + 1 :]
    return tail if tail.split(".", 1)[0] in _WALKED else None


@contextmanager
def walk() -> Iterator[list[str]]:
    """The stops of the walk (``module:function``), in order, while the block runs (module docstring)."""
    stops: list[str] = []
    started: set[int] = set()
    held: list[FrameType] = []  # keeps the frames seen alive, so that no id is reused

    def profile(frame: FrameType, event: str, arg: Any) -> None:
        if event != "call" or id(frame) in started:
            return  # a coroutine resumed is the same frame: not a new step of the walk
        module = _module(frame)
        if module is None:
            return
        started.add(id(frame))
        held.append(frame)
        caller = frame.f_back
        while caller is not None:
            if _module(caller) == module:
                return  # still inside that module: not a stop
            caller = caller.f_back
        stops.append(f"{module}:{frame.f_code.co_name}")

    sys.setprofile(profile)
    try:
        yield stops
    finally:
        sys.setprofile(None)
        held.clear()


def returns(stops: list[str]) -> list[str]:
    """The stops at a module the walk had stopped at before, and left (a stop right after one at the same
    module is the walk staying there: the caller asks that module twice in a row)."""
    modules = [stop.split(":", 1)[0] for stop in stops]
    seen: set[str] = set()
    out = []
    for i, module in enumerate(modules):
        if module in seen and modules[i - 1] != module:
            out.append(module)
        seen.add(module)
    return out


async def _sync(client: httpx.AsyncClient, since: str | None = None, **filter_: Any) -> dict[str, Any]:
    params: dict[str, Any] = {"timeout": 0}
    if since is not None:
        params["since"] = since
    if filter_:
        params["filter"] = json.dumps({"room": filter_})
    response = await client.get("/sync", params=params)
    assert response.status_code == 200, response.text
    return dict(response.json())


@pytest.fixture(autouse=True)
def _only_the_events_plugin_reads_rooms(monkeypatch: pytest.MonkeyPatch) -> None:
    """The walk is the events plugin's own: the plugins that ask it who is in a room (typing, receipts,
    presence, through ``Memberships``) enter its read wing on their own account, and are left out."""
    monkeypatch.setenv("FACTSTREAM_BLOCK_PLUGINS", "typing,receipts,presence")


async def test_one_sync_walks_the_read_wing_with_at_most_three_returns(main: Host, client: Clients) -> None:
    """Every part of an incremental ``/sync`` at once (a room joined in the range with its whole state, a
    limited timeline with the state it skipped, a room left, an invite, lazy-loaded members), then an
    initial one: each walk returns to a module it left at most three times."""
    store = store_of(main)
    lobby = await store.create_room(ALICE, preset="public_chat", name="Lobby")
    busy = await store.create_room(ALICE, preset="public_chat", name="Busy")
    left = await store.create_room(ALICE, preset="public_chat", name="Left")
    private = await store.create_room(ALICE, preset="private_chat", name="Private")
    await store.change_membership(busy, BOB, BOB, "join")
    await store.change_membership(left, BOB, BOB, "join")
    async with client(BOB) as bob:
        since = (await _sync(bob))["next_batch"]
        await store.change_membership(lobby, BOB, BOB, "join")
        await store.send(busy, ALICE, "m.room.topic", {"topic": "skipped by the timeline"}, state_key="")
        for i in range(12):
            await store.send(busy, ALICE, "m.room.message", {"msgtype": "m.text", "body": f"m{i}"})
        await store.send(left, ALICE, "m.room.message", {"msgtype": "m.text", "body": "before the leave"})
        await store.change_membership(left, BOB, BOB, "leave")
        await store.change_membership(private, ALICE, BOB, "invite")
        with walk() as incremental:
            body = await _sync(bob, since, timeline={"limit": 5}, state={"lazy_load_members": True})
        with walk() as initial:
            first = await _sync(bob)
    rooms = body["rooms"]
    assert set(rooms["join"]) == {lobby, busy} and set(rooms["leave"]) == {left} and set(rooms["invite"]) == {private}
    assert rooms["join"][busy]["timeline"]["limited"] is True
    assert set(first["rooms"]["join"]) == {lobby, busy}
    for name, stops in (("incremental", incremental), ("initial", initial)):
        assert stops, f"the {name} /sync walk saw no module of the read wing: the trace is broken"
        back = returns(stops)
        assert len(back) <= MAX_RETURNS, f"the {name} /sync walk returns {len(back)} times: {' -> '.join(stops)}"
