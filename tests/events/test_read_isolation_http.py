"""Reads never cross rooms, and ``unsigned`` never tells more than the reader may read (red team of
issue 30).

* A read names its room in the path: an event of another room is unknown there, on ``/event`` and
  ``/state?at=`` alike (the same answer as an event the server does not hold: the other room's
  graph, visibility and the reader's standing in it are never consulted).
"""

from __future__ import annotations

import pytest

from tests.events.scenario import ALICE, BOB, RoomDriver

# -- the path's room ----------------------------------------------------------------------------------------


@pytest.mark.parametrize("readable_in_its_room", [True, False])
async def test_an_event_of_another_room_is_unknown_in_the_paths_room(main, client, readable_in_its_room):
    x = await RoomDriver.create(client, ALICE, preset="public_chat")
    await x.member("join", BOB)
    y = await RoomDriver.create(client, ALICE, preset="public_chat", history_visibility="joined")
    y_message = await y.say(ALICE, "in room y")
    if readable_in_its_room:
        await y.member("join", BOB)
        y_message = await y.say(ALICE, "in room y, bob joined")
    assert (await client(BOB).get(f"/rooms/{y.room_id}/event/{y_message}")).status_code == (
        200 if readable_in_its_room else 404
    )
    unknown = "$" + "A" * 43
    for as_server in (False, True):
        c = client("server" if as_server else BOB)
        for path, params in (
            (f"/rooms/{x.room_id}/event/{{}}", {}),
            (f"/rooms/{x.room_id}/state", {"at": "{}"}),
        ):
            if as_server:
                params = {**params, ("server" if "at" in params else "raw"): "true"}
            answers = []
            for event_id in (y_message, unknown):
                r = await c.get(path.format(event_id), params={k: v.format(event_id) for k, v in params.items()})
                answers.append((r.status_code, r.json()["error"].replace(event_id, "EVENT")))
            # the other room's event reads exactly as one the server does not hold
            assert answers[0] == answers[1], (as_server, path, answers)
            assert answers[0][0] == 404
