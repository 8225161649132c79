"""``/sync`` shows a user exactly what ``/messages`` shows them: over every history visibility and every
history of the reader's membership (issue 32: "Visibility and redactions applied").

For each case a room is written with the Python API and read over HTTP twice: an initial ``/sync``
(timeline limit 100, ``include_leave``) and every page of ``/messages`` (dir=b). The two must list the
same events in the same order, with the same ``unsigned.membership``; where ``/messages`` refuses the
reader (invited and never joined, banned), the sync's answer is checked against its own rule.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from factstream.host.app import Host
from tests.bundled.events.conftest import store_of

ALICE, BOB = "@alice:hs", "@bob:hs"
Clients = Callable[[str], httpx.AsyncClient]
VISIBILITIES = ("world_readable", "shared", "invited", "joined")
#: Bob's history in the room, as steps between alice's messages ("m": alice sends a message).
HISTORIES = {
    "joined_early": ["join", "m", "m"],
    "joined_late": ["m", "join", "m"],
    "invited_then_joined": ["invite", "m", "join", "m"],
    "left": ["join", "m", "leave", "m"],
    "kicked": ["join", "m", "kick", "m"],
    "banned": ["join", "m", "ban", "m"],
    "rejected_invite": ["invite", "m", "leave", "m"],
    "invited_only": ["m", "invite", "m"],
    "never": ["m", "m"],
}
FILTER = json.dumps({"room": {"timeline": {"limit": 100}, "include_leave": True}})


async def write_history(host: Host, visibility: str, steps: list[str]) -> str:
    store = store_of(host)
    room = await store.create_room(ALICE, preset="public_chat", history_visibility=visibility, name="before")
    for i, step in enumerate(steps):
        if step == "m":
            await store.send(room, ALICE, "m.room.message", {"msgtype": "m.text", "body": f"m{i}"})
        elif step in ("join", "leave"):
            await store.change_membership(room, BOB, BOB, step)
        elif step == "kick":
            await store.change_membership(room, ALICE, BOB, "leave")
        else:
            await store.change_membership(room, ALICE, BOB, step)
    return room


async def all_messages(client: httpx.AsyncClient, room: str) -> list[dict[str, Any]] | None:
    """Every event ``/messages`` shows, oldest first (None: refused)."""
    events: list[dict[str, Any]] = []
    token: str | None = None
    while True:
        params: dict[str, Any] = {"dir": "b", "limit": 7}
        if token is not None:
            params["from"] = token
        response = await client.get(f"/rooms/{room}/messages", params=params)
        if response.status_code == 403:
            return None
        assert response.status_code == 200, response.text
        page = response.json()
        events += page["chunk"]
        token = page.get("end")
        if token is None:
            return events[::-1]


def _bodies(events: list[dict[str, Any]]) -> list[str]:
    return [e["content"]["body"] for e in events if e["type"] == "m.room.message"]


def shown(events: list[dict[str, Any]]) -> list[tuple[str, str | None]]:
    return [(e["event_id"], e.get("unsigned", {}).get("membership")) for e in events]


@pytest.mark.parametrize("visibility", VISIBILITIES)
async def test_sync_shows_what_messages_shows_for_every_membership_history(
    main: Host, client: Clients, visibility: str
) -> None:
    async with client(BOB) as bob:
        for name, steps in HISTORIES.items():
            room = await write_history(main, visibility, steps)
            response = await bob.get("/sync", params={"filter": FILTER})
            assert response.status_code == 200, response.text
            rooms = response.json().get("rooms", {})
            paged = await all_messages(bob, room)
            where = f"{visibility}/{name}"
            if name == "invited_only":
                assert room in rooms.get("invite", {}), where
                assert room not in rooms.get("join", {}) and room not in rooms.get("leave", {}), where
                continue
            if name == "never":
                assert all(room not in section for section in rooms.values()), where
                continue
            section = "join" if steps[-2:] == ["join", "m"] or name == "joined_early" else "leave"
            assert room in rooms.get(section, {}), f"{where}: expected in rooms.{section}"
            synced = rooms[section][room]["timeline"]["events"]
            if name == "rejected_invite":
                assert [e["content"]["membership"] for e in synced] == ["leave"], where
                continue
            if name == "banned":
                # /messages reads a banned user as a stranger (403, or the world_readable view); sync
                # shows the room as the reference does: up to the ban, as a member saw it
                kicked = await write_history(main, visibility, HISTORIES["kicked"])
                as_kicked = await all_messages(bob, kicked)
                assert as_kicked is not None, where
                assert synced[-1]["content"]["membership"] == "ban", where
                assert _bodies(synced) == _bodies(as_kicked), where
                continue
            assert paged is not None, where
            assert shown(synced) == shown(paged), where


async def test_state_from_before_a_join_under_joined_visibility_is_in_state_not_in_the_timeline(
    main: Host, client: Clients
) -> None:
    """The reference's #9923: its initial timeline shows current-state events /messages hides. Here the
    timeline is filtered like /messages and the room's state (which a member may read) is in ``state``."""
    store = store_of(main)
    room = await store.create_room(ALICE, preset="public_chat", history_visibility="joined")
    await store.send(room, ALICE, "m.room.topic", {"topic": "set before bob came"}, state_key="")
    await store.change_membership(room, BOB, BOB, "join")
    await store.send(room, ALICE, "m.room.message", {"msgtype": "m.text", "body": "hi bob"})
    async with client(BOB) as bob:
        body = (await bob.get("/sync", params={"filter": FILTER})).json()
    joined = body["rooms"]["join"][room]
    assert "m.room.topic" not in [e["type"] for e in joined["timeline"]["events"]]
    assert [e["content"] for e in joined["state"]["events"] if e["type"] == "m.room.topic"] == [
        {"topic": "set before bob came"}
    ]


async def test_the_state_section_tells_nothing_of_what_a_state_event_replaced(main: Host, client: Clients) -> None:
    """A ``joined`` room renamed before bob joined: the name in bob's ``state`` carries no ``prev_content``
    (the earlier name is in no state bob could read), in an initial sync and in the sync of his join."""
    store = store_of(main)
    room = await store.create_room(ALICE, preset="public_chat", history_visibility="joined", name="secret name")
    await store.send(room, ALICE, "m.room.name", {"name": "public name"}, state_key="")
    async with client(BOB) as bob:
        before = (await bob.get("/sync")).json()["next_batch"]
        await store.change_membership(room, BOB, BOB, "join")
        for since in (None, before):
            params = {"filter": FILTER} | ({"since": since} if since else {})
            body = (await bob.get("/sync", params=params)).json()
            state = body["rooms"]["join"][room]["state"]["events"]
            [name] = [e for e in state if e["type"] == "m.room.name"]
            assert name["content"] == {"name": "public name"}
            assert "secret name" not in json.dumps(body), since
