"""Several writers of the ``events`` stream, rooms sharded between them (the writer side).

``writer_for`` (rendezvous hashing) as a mapping: deterministic, independent of the list's order,
balanced, and moving only the rooms it must when a writer is added or removed. Then two in-process
writers ``w1`` and ``w2`` on one database: every write (each HTTP write route, each Python API write,
a remote batch, a backfilled batch) of a room is refused on the other writer with 421 / MisdirectedWrite
naming the room's writer and its URL, and stores nothing (the tables say so); the room's writer stores
it; ``createRoom`` on each writer makes rooms that writer owns; and a configuration whose ``backfill``
writers are not its ``events`` writers never starts.
"""

from __future__ import annotations

import collections
import itertools
import math
from collections.abc import Callable
from typing import Any

import httpx
import pytest
from factstream_events.rules.errors import MisdirectedWrite
from factstream_events.shared.sharding import writer_for
from factstream_events.store import RemoteEvent
from factstream_events.write.persist import Origin
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from factstream import PluginError
from factstream.host.app import Host
from factstream.testing import HostCluster, free_port
from tests.bundled.events.conftest import SERVER_TOKEN, TOKENS, store_of, token_of
from tests.bundled.events.remote_history import ROOM_VERSION, RemoteRoom

ALICE, BOB, ZED = "@alice:hs", "@bob:hs", "@zed:elsewhere"
WRITERS = ("w1", "w2")

writer_names = st.lists(st.text(min_size=1, max_size=12), min_size=1, max_size=8, unique=True)
room_ids = st.text(min_size=1, max_size=80).map(lambda s: f"!{s}:hs")


def owned_by(writer: str, writers: tuple[str, ...] = WRITERS, prefix: str = "!room") -> str:
    """The first room ID ``<prefix><n>:elsewhere`` that ``writer`` owns."""
    for n in itertools.count():
        room_id = f"{prefix}{n}:elsewhere"
        if writer_for(room_id, writers) == writer:
            return room_id
    raise AssertionError("unreachable")


# -- the mapping --------------------------------------------------------------------------------------------


#: The machines that run the tests may be loaded: no deadline, no health check on slow generation.
relaxed = settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])


@relaxed
@given(room_ids, writer_names.flatmap(lambda ws: st.tuples(st.just(ws), st.permutations(ws))))
def test_the_writer_of_a_room_is_one_of_the_writers_and_does_not_depend_on_their_order(
    room_id: str, lists: tuple[list[str], list[str]]
) -> None:
    writers, shuffled = lists
    owner = writer_for(room_id, writers)
    assert owner in writers
    assert writer_for(room_id, shuffled) == owner
    assert writer_for(room_id, tuple(reversed(writers))) == owner
    assert writer_for(room_id, list(writers)) == owner  # the same answer again


def test_no_writers_is_an_error() -> None:
    with pytest.raises(ValueError, match="no writers"):
        writer_for("!a:hs", [])


@pytest.mark.parametrize("count", [2, 3, 5, 8])
def test_rooms_are_spread_evenly_over_the_writers(count: int) -> None:
    """Chi-square over 20,000 rooms: a fair spread passes at the 0.1% level (the rooms are fixed, so
    the test is deterministic); each writer also gets within 10% of its share."""
    writers = [f"writer-{i}" for i in range(count)]
    rooms = 20_000
    got = collections.Counter(writer_for(f"!{i:06d}:hs", writers) for i in range(rooms))
    expected = rooms / count
    chi2 = sum((got[w] - expected) ** 2 / expected for w in writers)
    critical = {2: 10.83, 3: 13.82, 5: 18.47, 8: 24.32}[count]  # chi-square, count - 1 dof, p = 0.001
    assert chi2 < critical, (chi2, got)
    assert all(abs(got[w] - expected) < 0.1 * expected for w in writers), got


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.from_regex(r"[a-z][a-z0-9]{0,8}", fullmatch=True), min_size=1, max_size=6, unique=True))
def test_adding_a_writer_moves_only_rooms_to_it_and_about_one_in_n_plus_one(writers: list[str]) -> None:
    new = "new-writer"
    rooms = [f"!r{i}:hs" for i in range(3000)]
    before = {r: writer_for(r, writers) for r in rooms}
    after = {r: writer_for(r, [*writers, new]) for r in rooms}
    moved = [r for r in rooms if before[r] != after[r]]
    assert all(after[r] == new for r in moved)  # nobody else's rooms change hands
    share = len(moved) / len(rooms)
    expected = 1 / (len(writers) + 1)
    sigma = math.sqrt(expected * (1 - expected) / len(rooms))
    assert abs(share - expected) < 5 * sigma, (share, expected)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.lists(st.from_regex(r"[a-z][a-z0-9]{0,8}", fullmatch=True), min_size=2, max_size=6, unique=True),
    st.data(),
)
def test_removing_a_writer_moves_only_its_own_rooms(writers: list[str], data: st.DataObject) -> None:
    gone = data.draw(st.sampled_from(writers))
    rest = [w for w in writers if w != gone]
    rooms = [f"!r{i}:hs" for i in range(2000)]
    for room in rooms:
        before, after = writer_for(room, writers), writer_for(room, rest)
        assert after == before or before == gone
        assert after in rest


# -- two writers in one deployment ------------------------------------------------------------------------


@pytest.fixture
def ports() -> dict[str, int]:
    return {"w1": free_port(), "w2": free_port()}


def configure(cluster: HostCluster, ports: dict[str, int], **config: Any) -> None:
    """w1 and w2 write ``events`` and ``backfill``; worker1 writes neither. The ``instance_map`` gives
    their HTTP ports (for the 421's URL) but ``http.port: 0`` keeps the in-process hosts off sockets."""
    defaults: dict[str, Any] = {
        "instance_map": {name: {"http_port": port} for name, port in ports.items()},
        "stream_writers": {"events": list(WRITERS), "backfill": list(WRITERS)},
        "http": {"tokens": TOKENS, "port": 0},
    }
    cluster.configure(instances=["w1", "w2", "worker1"], **(defaults | config))


@pytest.fixture
async def writers(host_cluster: HostCluster, ports: dict[str, int]) -> dict[str, Host]:
    configure(host_cluster, ports)
    return {name: await host_cluster(name) for name in WRITERS}


async def stored_counts(host: Host, room_id: str) -> dict[str, int]:
    """Rows of the room (or naming it) in the tables a write touches."""
    queries = {
        "rooms": "SELECT count(*) FROM rooms WHERE room_id = %(r)s",
        "events": "SELECT count(*) FROM events WHERE room_id = %(r)s",
        "event_json": "SELECT count(*) FROM event_json WHERE room_id = %(r)s",
        "edges": "SELECT count(*) FROM event_edges WHERE room_id = %(r)s",
        "state": "SELECT count(*) FROM current_state_events WHERE room_id = %(r)s",
        "state_groups": "SELECT count(*) FROM state_groups WHERE room_id = %(r)s",
        "memberships": "SELECT count(*) FROM room_memberships WHERE room_id = %(r)s",
        "redactions": "SELECT count(*) FROM redactions WHERE room_id = %(r)s",
        "txn_ids": "SELECT count(*) FROM event_txn_ids",  # none names a room; any new one counts
    }
    out = {}
    for name, sql in queries.items():
        rows = await host.api.database().fetchall(sql, {"r": room_id})
        out[name] = int(rows[0][0])
    return out


def assert_misdirected(r: httpx.Response, room_id: str, writer: str, ports: dict[str, int]) -> None:
    assert r.status_code == 421, r.text
    body = r.json()
    assert body["errcode"] == "M_MISDIRECTED"
    assert body["writer"] == writer
    assert body["writer_url"] == f"http://127.0.0.1:{ports[writer]}"
    assert room_id in body["error"] and writer in body["error"] and body["writer_url"] in body["error"]


def remote_room(room_id: str) -> RemoteRoom:
    room = RemoteRoom(room_id)
    room.create(ZED)
    room.add("m.room.member", ALICE, {"membership": "join"}, state_key=ALICE)
    return room


def batch_body(events: list[Any], **extra: Any) -> dict[str, Any]:
    return {"events": [e.event for e in events], "room_version": ROOM_VERSION, **extra}


async def test_create_room_on_each_writer_gives_rooms_that_writer_owns(
    host_cluster: HostCluster, writers: dict[str, Host]
) -> None:
    for name, host in writers.items():
        client = host_cluster.client(host, token_of(ALICE))
        for _ in range(8):
            r = await client.post("/createRoom", json={})
            assert r.status_code == 200, r.text
            assert writer_for(r.json()["room_id"], WRITERS) == name
            room_id = await store_of(host).create_room(ALICE)
            assert writer_for(room_id, WRITERS) == name


async def test_every_write_route_on_the_wrong_writer_is_refused_naming_the_writer_and_stores_nothing(
    host_cluster: HostCluster, writers: dict[str, Host], ports: dict[str, int]
) -> None:
    w1, w2 = writers["w1"], writers["w2"]
    room_id = await store_of(w1).create_room(ALICE, preset="public_chat")
    message = await store_of(w1).send(room_id, ALICE, "m.room.message", {"msgtype": "m.text", "body": "hi"})
    await store_of(w1).change_membership(room_id, ALICE, BOB, "invite")
    before = await stored_counts(w1, room_id)
    alice, bob, server = (host_cluster.client(w2, t) for t in (token_of(ALICE), token_of(BOB), SERVER_TOKEN))
    remote = RemoteRoom(room_id)
    later = remote.add("m.room.message", ZED, {"body": "x"}, prev=[message], depth=100)
    requests: list[Callable[[], Any]] = [
        lambda: alice.put(f"/rooms/{room_id}/send/m.room.message/t1", json={"msgtype": "m.text", "body": "no"}),
        lambda: alice.put(f"/rooms/{room_id}/send/m.room.message/t2", content=b"not json"),  # 421 before 400
        lambda: alice.put(f"/rooms/{room_id}/state/m.room.topic", json={"topic": "no"}),
        lambda: alice.put(f"/rooms/{room_id}/state/m.room.member/{ALICE}", json={"membership": "leave"}),
        lambda: bob.post(f"/rooms/{room_id}/join", json={}),
        lambda: alice.post(f"/rooms/{room_id}/leave", json={}),
        lambda: alice.post(f"/rooms/{room_id}/invite", json={"user_id": "@carol:hs"}),
        lambda: alice.post(f"/rooms/{room_id}/kick", json={"user_id": BOB}),
        lambda: alice.post(f"/rooms/{room_id}/ban", json={"user_id": BOB}),
        lambda: alice.post(f"/rooms/{room_id}/unban", json={"user_id": BOB}),
        lambda: alice.put(f"/rooms/{room_id}/redact/{message}/t3", json={}),
        lambda: server.post(f"/rooms/{room_id}/remote_events", json=batch_body([later])),
        lambda: server.post(f"/rooms/{room_id}/remote_events", json=batch_body([later], backfill=True)),
        lambda: server.post(f"/rooms/{room_id}/remote_events", json=batch_body([later], outlier=True)),
    ]
    for request in requests:
        assert_misdirected(await request(), room_id, "w1", ports)
    assert await stored_counts(w1, room_id) == before

    # the room's writer takes the same writes
    w1_alice = host_cluster.client(w1, token_of(ALICE))
    r = await w1_alice.put(f"/rooms/{room_id}/send/m.room.message/t1", json={"msgtype": "m.text", "body": "yes"})
    assert r.status_code == 200, r.text
    r = await host_cluster.client(w1, SERVER_TOKEN).post(f"/rooms/{room_id}/remote_events", json=batch_body([later]))
    assert r.status_code == 200 and r.json()["stored"] == [later.event_id], r.text
    after = await stored_counts(w1, room_id)
    assert after["events"] == before["events"] + 2


async def test_a_remote_room_sent_to_the_wrong_writer_is_not_created(
    host_cluster: HostCluster, writers: dict[str, Host], ports: dict[str, int]
) -> None:
    for right, wrong in (("w1", "w2"), ("w2", "w1")):
        room = remote_room(owned_by(right, prefix=f"!remote-{right}-"))
        client = host_cluster.client(writers[wrong], SERVER_TOKEN)
        r = await client.post(f"/rooms/{room.room_id}/remote_events", json=batch_body(room.events))
        assert_misdirected(r, room.room_id, right, ports)
        counts = await stored_counts(writers[right], room.room_id)
        assert {k: v for k, v in counts.items() if k != "txn_ids"} == dict.fromkeys(counts.keys() - {"txn_ids"}, 0)
        r = await host_cluster.client(writers[right], SERVER_TOKEN).post(
            f"/rooms/{room.room_id}/remote_events", json=batch_body(room.events)
        )
        assert r.status_code == 200 and len(r.json()["stored"]) == len(room.events), r.text


async def test_the_python_api_on_the_wrong_writer_raises_misdirected_write_and_stores_nothing(
    writers: dict[str, Host], ports: dict[str, int]
) -> None:
    w1, w2 = writers["w1"], writers["w2"]
    room_id = await store_of(w1).create_room(ALICE, preset="public_chat")
    message = await store_of(w1).send(room_id, ALICE, "m.room.message", {"msgtype": "m.text", "body": "hi"})
    before = await stored_counts(w1, room_id)
    wrong = store_of(w2)
    remote = RemoteRoom(room_id)
    later = remote.add("m.room.message", ZED, {"body": "x"}, prev=[message], depth=100)
    attempts: list[Callable[[], Any]] = [
        lambda: wrong.send(room_id, ALICE, "m.room.message", {"msgtype": "m.text", "body": "no"}, txn_id="t"),
        lambda: wrong.send(room_id, ALICE, "m.room.topic", {"topic": "no"}, state_key=""),
        lambda: wrong.change_membership(room_id, ALICE, BOB, "invite"),
        lambda: wrong.redact(room_id, ALICE, message),
        lambda: wrong.persist_remote(room_id, [RemoteEvent(later.raw)]),
        lambda: wrong.persist_remote(room_id, [RemoteEvent(later.raw)], backfill=True),
        lambda: wrong.persister.persist(room_id, [], origin=Origin.REMOTE),  # the write path's own guard
    ]
    for attempt in attempts:
        with pytest.raises(MisdirectedWrite) as info:
            await attempt()
        assert info.value.writer == "w1" and info.value.status == 421
        assert info.value.url == f"http://127.0.0.1:{ports['w1']}"
        assert room_id in str(info.value)
    assert await stored_counts(w1, room_id) == before


async def test_backfill_goes_to_the_rooms_writer(
    host_cluster: HostCluster, writers: dict[str, Host], ports: dict[str, int]
) -> None:
    for right, wrong in (("w1", "w2"), ("w2", "w1")):
        room = remote_room(owned_by(right, prefix=f"!backfill-{right}-"))
        old = [room.add("m.room.message", ZED, {"body": f"old {i}"}) for i in range(3)]
        recent = room.add("m.room.message", ZED, {"body": "recent"})
        head = room.events[:2]
        server = host_cluster.client(writers[right], SERVER_TOKEN)
        r = await server.post(f"/rooms/{room.room_id}/remote_events", json=batch_body([*head, recent]))
        assert r.status_code == 200, r.text
        before = await stored_counts(writers[right], room.room_id)
        r = await host_cluster.client(writers[wrong], SERVER_TOKEN).post(
            f"/rooms/{room.room_id}/remote_events", json=batch_body(old, backfill=True)
        )
        assert_misdirected(r, room.room_id, right, ports)
        assert await stored_counts(writers[right], room.room_id) == before
        r = await server.post(f"/rooms/{room.room_id}/remote_events", json=batch_body(old, backfill=True))
        assert r.status_code == 200 and sorted(r.json()["stored"]) == sorted(e.event_id for e in old), r.text
        rows = (
            await writers[right]
            .api.database()
            .fetchall(
                "SELECT count(*), max(stream_ordering), bool_and(instance_name = %(w)s) FROM events"
                " WHERE event_id = ANY(%(ids)s)",
                {"ids": [e.event_id for e in old], "w": right},
            )
        )
        count, highest, by_writer = rows[0]
        assert count == 3 and highest < 0 and by_writer  # backfill IDs, written by the room's writer


async def test_an_instance_that_writes_no_room_refuses_create_room(
    host_cluster: HostCluster, writers: dict[str, Host]
) -> None:
    worker = await host_cluster("worker1")
    r = await host_cluster.client(worker, token_of(ALICE)).post("/createRoom", json={})
    assert r.status_code == 421 and r.json()["errcode"] == "M_MISDIRECTED", r.text
    assert "w1, w2" in r.json()["error"]
    with pytest.raises(MisdirectedWrite, match="create rooms on one of: w1, w2"):
        await store_of(worker).create_room(ALICE)


@pytest.mark.parametrize(
    ("events", "backfill"),
    [(["w1", "w2"], ["w1"]), (["w1"], ["w1", "w2"]), (["w1", "w2"], ["worker1", "w2"])],
)
async def test_a_deployment_whose_backfill_writers_are_not_its_events_writers_does_not_start(
    host_cluster: HostCluster, ports: dict[str, int], events: list[str], backfill: list[str]
) -> None:
    configure(host_cluster, ports, stream_writers={"events": events, "backfill": backfill})
    with pytest.raises(PluginError) as info:
        await host_cluster("w1")
    message = str(info.value)
    assert f"stream_writers.backfill ({', '.join(backfill)})" in message, message
    assert f"stream_writers.events ({', '.join(events)})" in message, message
    assert "'events'" in message  # the plugin that refused


async def test_the_same_writers_in_another_order_start(host_cluster: HostCluster, ports: dict[str, int]) -> None:
    configure(host_cluster, ports, stream_writers={"events": ["w1", "w2"], "backfill": ["w2", "w1"]})
    host = await host_cluster("w1")
    room_id = await store_of(host).create_room(ALICE)
    assert writer_for(room_id, ["w2", "w1"]) == "w1"
