"""The backfill / traversal read, ``GET /rooms/{room}/backfill?v=...&limit=N`` (writer token), over
remote event graphs with forks, gaps and outliers, against real PostgreSQL (docs/plugins/events.md,
Orderings, The event graph and ``GET /rooms/{room_id}/backfill``): deepest first from the seeds, the
limit, seeds of other rooms ignored, backward extremities where prev_events are missing, an outlier
joining the graph when it is persisted normally.
"""

from __future__ import annotations

import json

import pytest

from factstream.host.app import Host
from tests.bundled.events import scenario
from tests.bundled.events.scenario import ALICE, Clients, RoomDriver, error_of, post_remote, remote_event

ZED = "@zed:elsewhere"


@pytest.fixture
async def main(host_cluster) -> Host:
    host_cluster.configure(http={"tokens": scenario.TOKENS})
    return await host_cluster("main")


class Graph:
    """A remote room's events by name: ``add(name, depth, *prev names)`` builds one (a message)."""

    def __init__(self, room_id: str) -> None:
        self.room_id = room_id
        self.events: dict[str, dict] = {}
        self.ids: dict[str, str] = {}
        self.add("create", 1, event_type="m.room.create", state_key="", content={"room_version": "10"})
        self.add("join", 2, "create", event_type="m.room.member", state_key=ZED, content={"membership": "join"})

    def add(self, name: str, depth: int, *prev: str, event_type: str = "m.room.message", **kw) -> str:
        content = kw.pop("content", {"body": name})
        prev_ids = [self.ids.get(p, p) for p in prev]
        event, event_id = remote_event(self.room_id, event_type, ZED, content, prev_ids, depth, **kw)
        self.events[name], self.ids[name] = event, event_id
        return event_id

    async def post(self, client: Clients, *names: str, **extra) -> None:
        await post_remote(client, self.room_id, [self.events[n] for n in names], **extra)


async def walk_back(client: Clients, graph: Graph, *seeds: str, limit: int = 50) -> list[str]:
    """The names of the events the walk returns, in order."""
    r = await client("server").get(
        f"/rooms/{graph.room_id}/backfill", params={"v": [graph.ids.get(s, s) for s in seeds], "limit": limit}
    )
    assert r.status_code == 200, r.text
    return [next(n for n, e in graph.events.items() if e == pdu) for pdu in r.json()["pdus"]]


async def backward_extremities(main: Host, room_id: str) -> set[str]:
    rows = await main.api.database().fetchall(
        "SELECT event_id FROM event_backward_extremities WHERE room_id = %(r)s", {"r": room_id}
    )
    return {str(r[0]) for r in rows}


async def forked(client: Clients) -> Graph:
    """create(1) - join(2) - x3 - x4 - x5 - x6 and join - y3, merged by m(7) = [x6, y3], then n(8).
    y3 arrives in a later batch than x3 (a later stream ordering at the same depth)."""
    g = Graph("!fork:elsewhere")
    for depth in range(3, 7):
        g.add(f"x{depth}", depth, "join" if depth == 3 else f"x{depth - 1}")
    g.add("y3", 3, "join")
    g.add("m", 7, "x6", "y3")
    g.add("n", 8, "m")
    await g.post(client, "create", "join", "x3", "x4", "x5", "x6")
    await g.post(client, "y3", "m", "n")
    return g


async def test_the_walk_is_deepest_first_over_a_fork(main, client):
    g = await forked(client)
    # breadth first would give n, m, x6, y3, ...: deepest first takes the long branch down to depth 4
    # before the short one; at depth 3 the later stream ordering (y3) comes first
    assert await walk_back(client, g, "n") == ["n", "m", "x6", "x5", "x4", "y3", "x3", "join", "create"]
    # several seeds: one queue
    assert await walk_back(client, g, "x4", "y3") == ["x4", "y3", "x3", "join", "create"]
    assert await walk_back(client, g, "y3", "x4", "y3") == ["x4", "y3", "x3", "join", "create"]
    # the walk returns each event's stored bytes, as received
    r = await client("server").get(f"/rooms/{g.room_id}/backfill", params={"v": g.ids["m"], "limit": 3})
    for name in ("m", "x6", "x5"):
        stored = await client("server").get(f"/rooms/{g.room_id}/event/{g.ids[name]}", params={"raw": "true"})
        assert stored.content in r.content and stored.content != json.dumps(g.events[name]).encode()
    # the merge event has both edges
    rows = await main.api.database().fetchall(
        "SELECT prev_event_id FROM event_edges WHERE event_id = %(e)s ORDER BY 1", {"e": g.ids["m"]}
    )
    assert {r[0] for r in rows} == {g.ids["x6"], g.ids["y3"]}


@pytest.mark.parametrize(
    ("limit", "expected"), [(1, ["n"]), (4, ["n", "m", "x6", "x5"]), (6, ["n", "m", "x6", "x5", "x4", "y3"])]
)
async def test_the_limit_keeps_the_deepest(main, client, limit, expected):
    g = await forked(client)
    assert await walk_back(client, g, "n", limit=limit) == expected


async def test_seeds_of_other_rooms_and_unknown_seeds_are_ignored(main, client):
    g = await forked(client)
    local = await RoomDriver.create(client, ALICE, preset="public_chat")
    elsewhere = await local.say(ALICE, "in another room")
    assert await walk_back(client, g, elsewhere) == []
    assert await walk_back(client, g, elsewhere, "x4", "$" + "u" * 43) == ["x4", "x3", "join", "create"]
    # and the other way round: this room's events are not walked from the local room
    r = await client("server").get(f"/rooms/{local.room_id}/backfill", params={"v": [g.ids["n"]], "limit": 10})
    assert r.status_code == 200 and r.json() == {"pdus": []}


async def test_bad_walk_requests(main, client):
    g = await forked(client)
    server = client("server")
    cases = [
        ({"limit": 5}, 400, "v"),
        ({"v": g.ids["n"], "limit": 0}, 400, "limit"),
        ({"v": g.ids["n"], "limit": 1001}, 400, "limit"),
        ({"v": g.ids["n"], "limit": "ten"}, 400, "limit"),
    ]
    for params, status, field in cases:
        r = await server.get(f"/rooms/{g.room_id}/backfill", params=params)
        assert r.status_code == status and field in error_of(r), (params, r.text)
    r = await server.get("/rooms/!nowhere:elsewhere/backfill", params={"v": g.ids["n"]})
    assert r.status_code == 404, r.text
    r = await client(ALICE).get(f"/rooms/{g.room_id}/backfill", params={"v": g.ids["n"]})
    assert r.status_code == 403, "a user token may not walk the graph"


async def test_missing_prev_events_are_backward_extremities_until_they_arrive(main, client):
    g = Graph("!gappy:elsewhere")
    g.add("p", 3, "join")
    g.add("k", 4, "join")  # held back: a gap
    g.add("far", 4, "$missing-far")  # its only prev_event is not held either
    g.add("q", 5, "p", "k")
    g.add("r", 6, "q", "far")
    await g.post(client, "create", "join", "p")
    await g.post(client, "q", "r")
    assert await backward_extremities(main, g.room_id) == {g.ids["k"], g.ids["far"]}
    assert await walk_back(client, g, "r") == ["r", "q", "p", "join", "create"]
    # the gap fills from backfill (negative stream orderings): no longer a backward extremity, walked
    await g.post(client, "k", backfill=True)
    assert await backward_extremities(main, g.room_id) == {g.ids["far"]}
    assert await walk_back(client, g, "r") == ["r", "q", "k", "p", "join", "create"]
    await g.post(client, "far", backfill=True)
    assert await backward_extremities(main, g.room_id) == {"$missing-far"}
    # at depth 4 both are backfilled; the later one has the lower (more negative) stream ordering
    assert await walk_back(client, g, "r") == ["r", "q", "k", "far", "p", "join", "create"]
    orderings = dict(
        await main.api.database().fetchall(
            "SELECT event_id, stream_ordering FROM events WHERE room_id = %(r)s", {"r": g.room_id}
        )
    )
    assert orderings[g.ids["k"]] < 0 < orderings[g.ids["q"]]


async def test_an_outlier_joins_the_walk_when_persisted_normally(main, client):
    g = Graph("!outlying:elsewhere")
    g.add("o", 3, "join")
    g.add("s", 4, "o")
    await g.post(client, "create", "join")
    await g.post(client, "o", outlier=True)
    await g.post(client, "s")
    # an outlier is in no timeline: not walked to, and ignored as a seed; it stands as a gap
    assert await walk_back(client, g, "s") == ["s"]
    assert await walk_back(client, g, "o") == []
    assert g.ids["o"] in await backward_extremities(main, g.room_id)
    [(stream_before,)] = await main.api.database().fetchall(
        "SELECT stream_ordering FROM events WHERE event_id = %(e)s", {"e": g.ids["o"]}
    )
    await g.post(client, "o")
    assert await walk_back(client, g, "s") == ["s", "o", "join", "create"]
    assert g.ids["o"] not in await backward_extremities(main, g.room_id)
    [(stream_after, outlier)] = await main.api.database().fetchall(
        "SELECT stream_ordering, outlier FROM events WHERE event_id = %(e)s", {"e": g.ids["o"]}
    )
    assert (stream_after, outlier) == (stream_before, False)
    rows = await main.api.database().fetchall(
        "SELECT stream_id FROM ex_outlier_stream WHERE event_id = %(e)s", {"e": g.ids["o"]}
    )
    assert len(rows) == 1 and rows[0][0] > stream_before


async def forward_extremities(main: Host, room_id: str) -> set[str]:
    rows = await main.api.database().fetchall(
        "SELECT event_id FROM event_forward_extremities WHERE room_id = %(r)s", {"r": room_id}
    )
    return {str(r[0]) for r in rows}


async def test_a_parent_arriving_after_its_child_is_not_a_forward_extremity(main, client):
    g = Graph("!late-parent:elsewhere")
    g.add("p", 3, "join")
    g.add("c", 4, "p")
    g.add("q", 3, "join")
    g.add("d", 4, "q")
    await g.post(client, "create", "join")
    await g.post(client, "c")  # p is missing: a gap, and c an end of the room
    assert await forward_extremities(main, g.room_id) == {g.ids["join"], g.ids["c"]}
    await g.post(client, "p")  # p already has a child: it closes the gap and does not become an end
    assert await forward_extremities(main, g.room_id) == {g.ids["c"]}
    assert g.ids["p"] not in await backward_extremities(main, g.room_id)
    # the same when the parent was held as an outlier before it is persisted normally
    await g.post(client, "q", outlier=True)
    await g.post(client, "d")
    assert g.ids["q"] in await backward_extremities(main, g.room_id)
    await g.post(client, "q")
    assert await forward_extremities(main, g.room_id) == {g.ids["c"], g.ids["d"]}
    assert await backward_extremities(main, g.room_id) == set()
    # a parent sent in the same batch as its child is no end either, whatever the order in the batch
    g.add("r", 5, "c", "d")
    g.add("s", 6, "r")
    await g.post(client, "s", "r")
    assert await forward_extremities(main, g.room_id) == {g.ids["s"]}
