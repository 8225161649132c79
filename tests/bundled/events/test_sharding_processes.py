"""Two ``events`` writers and a reader as real processes, over TCP and over Redis: a writer SIGKILLed in the
middle of a remote batch, restarted, and every batch sent again.

``factstream run`` for worker1 (the first instance: the TCP replication hub; it writes no events), w1
and w2 (``stream_writers.events`` and ``backfill``: both). Rooms live on both writers (remote rooms
whose IDs each writer owns, and a room each writer creates). The eventsprobe test plugin
(tests/plugin_projects/eventsprobe) records, in every process, every ``events`` row it handles, its
own committed ones included (``FACTSTREAM_EVENTSPROBE_LOCAL``).

The failure: remote batches of w1's rooms are being persisted on w1, one after another, when w1 is
SIGKILLed. w1 starts again and every batch of its rooms is sent again, acknowledged or not. Then:

* every event is stored exactly once (the resent ones already stored are reported ``already_stored``);
* each process received each event's ``ev`` row exactly once: w2 and worker1 every event; w1 every
  event of w2 and every one of its own, except that its own rows of the batches that were in flight
  when it was killed may be missing from its record (a SIGKILL between the commit and the process's
  own rows handler; the rows are not delivered again to the writer that wrote them) but never twice;
* per room, the ``ev`` rows come in the order of their stream orderings and of the room's depth.

Also: a host whose ``backfill`` writers are not its ``events`` writers exits with status 2 and says why.
"""

from __future__ import annotations

import collections
import itertools
import json
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest
from factstream_events.shared.sharding import writer_for

from factstream.db.engine import libpq_url
from factstream.testing import ProcessCluster, RedisServer, read_json_lines, wait_until
from tests.bundled.events.remote_history import ROOM_VERSION, Built, RemoteRoom

pytestmark = pytest.mark.slow

PLUGINS = Path(__file__).resolve().parents[2] / "plugin_projects"
ALICE, ZED = "@alice:hs", "@zed:elsewhere"
TOKENS = {"tok-alice": {"user": ALICE}, "tok-server": {"user": "@server:hs", "write": True}}
WRITERS = ("w1", "w2")
PROCESSES = ("worker1", "w1", "w2")
ROOMS_PER_WRITER = 2
BATCHES_PER_ROOM = 8
EVENTS_PER_BATCH = 20
#: w1 is killed once this many of its batches were acknowledged (of ROOMS_PER_WRITER * BATCHES_PER_ROOM).
KILL_AFTER = 7


def owned_rooms(writer: str, count: int) -> list[str]:
    names = (f"!shard-{writer}-{n}:elsewhere" for n in itertools.count())
    return list(itertools.islice((r for r in names if writer_for(r, WRITERS) == writer), count))


def batches_of(room_id: str) -> list[list[Built]]:
    """The room's history as a remote server sends it: its first events, then batches of messages."""
    room = RemoteRoom(room_id)
    room.create(ZED)
    room.add("m.room.member", ALICE, {"membership": "join"}, state_key=ALICE)
    out = [list(room.events)]
    for b in range(BATCHES_PER_ROOM - 1):
        out.append([room.add("m.room.message", ZED, {"body": f"{b}.{i}"}) for i in range(EVENTS_PER_BATCH)])
    return out


class Shards:
    """worker1, w1 and w2 started as processes; their HTTP clients and their probes' records."""

    def __init__(self, cluster: ProcessCluster, transport: str, redis: RedisServer) -> None:
        self.cluster = cluster
        cluster.configure(
            instances=list(PROCESSES),
            stream_writers={"events": list(WRITERS), "backfill": list(WRITERS)},
            http={"tokens": TOKENS},
        )
        cluster.serve_http()
        redis_url = f"redis://127.0.0.1:{redis.port}/0" if transport == "redis" else None
        self.config = cluster.config("shards", redis_url=redis_url)
        cluster.migrate(self.config)
        for name in PROCESSES:
            env = {"FACTSTREAM_EVENTSPROBE_RECORD": str(self.record(name)), "FACTSTREAM_EVENTSPROBE_LOCAL": "1"}
            cluster.start(name, self.config, env=env)
        self.clients = {
            (name, who): cluster.client(name, token, timeout=30)
            for name in PROCESSES
            for who, token in (("alice", "tok-alice"), ("server", "tok-server"))
        }

    def record(self, name: str) -> Path:
        return self.cluster.workdir / f"{name}.rows.jsonl"

    def client(self, name: str, who: str = "server") -> httpx.Client:
        return self.clients[(name, who)]

    def positions(self, name: str) -> dict[str, int]:
        r = self.client(name, "alice").get("/streams/events/positions")
        r.raise_for_status()
        return {k: int(v) for k, v in r.json()["positions"].items()}

    def caught_up(self, timeout: float = 45) -> None:
        """Wait until every process has reached each writer's own position."""
        target = {w: self.positions(w)[w] for w in WRITERS}

        def reached() -> bool:
            return all(self.positions(p).get(w, 0) >= t for p in PROCESSES for w, t in target.items())

        wait_until(reached, timeout, "every process to reach both writers", detail=self.cluster.logs)

    def send(self, writer: str, room_id: str, batch: list[Built]) -> dict[str, Any]:
        body = json.dumps({"events": [b.event for b in batch], "room_version": ROOM_VERSION})
        r = self.client(writer).post(f"/rooms/{room_id}/remote_events", content=body)
        assert r.status_code == 200, r.text
        return dict(r.json())

    def ev_rows(self, name: str) -> list[dict[str, Any]]:
        return [r for r in read_json_lines(self.record(name)) if r["stream"] == "events" and r["row"][0] == "ev"]


@pytest.fixture(params=["tcp", "redis"])
def shards(request: pytest.FixtureRequest, process_cluster: ProcessCluster, plugin_installer: Any) -> Shards:
    plugin_installer.from_project(PLUGINS / "eventsprobe")
    redis = request.getfixturevalue("redis_server") if request.param == "redis" else None
    return Shards(process_cluster, request.param, redis)  # type: ignore[arg-type]


def stored(cluster: ProcessCluster, rooms: list[str]) -> list[tuple[str, str, int, int]]:
    """``(event_id, room_id, stream_ordering, depth)`` of every stored event of ``rooms``."""
    with psycopg.connect(libpq_url(cluster.database_url)) as conn:
        rows = conn.execute(
            "SELECT event_id, room_id, stream_ordering, topological_ordering FROM events WHERE room_id = ANY(%s)",
            (rooms,),
        ).fetchall()
    return [(str(a), str(b), int(c), int(d)) for a, b, c, d in rows]


def test_a_writer_killed_mid_batch_restarts_and_every_event_is_stored_and_delivered_once(shards: Shards) -> None:
    rooms = {w: owned_rooms(w, ROOMS_PER_WRITER) for w in WRITERS}
    history = {room: batches_of(room) for w in WRITERS for room in rooms[w]}
    local_rooms = {}
    for w in WRITERS:  # a room each writer creates, and a message in it
        r = shards.client(w, "alice").post("/createRoom", json={"preset": "public_chat"})
        assert r.status_code == 200, r.text
        local_rooms[w] = r.json()["room_id"]
        assert writer_for(local_rooms[w], WRITERS) == w
    for room in rooms["w2"]:  # w2's rooms, all written before the failure
        for batch in history[room]:
            shards.send("w2", room, batch)
    shards.caught_up()

    # w1's batches, one after another (the rooms taken in turn), until w1 is killed in the middle of one
    order = [(room, i) for i in range(BATCHES_PER_ROOM) for room in rooms["w1"]]
    acked: list[tuple[str, int]] = []
    enough = threading.Event()

    def sender() -> None:
        for room, i in order:
            try:
                shards.send("w1", room, history[room][i])
            except (httpx.HTTPError, AssertionError):
                return
            acked.append((room, i))
            if len(acked) >= KILL_AFTER:
                enough.set()

    thread = threading.Thread(target=sender, name="w1-batches")
    thread.start()
    assert enough.wait(60), f"w1 acknowledged only {len(acked)} batches:{shards.cluster.logs()}"
    shards.cluster.processes["w1"].stop(signal.SIGKILL)
    thread.join(30)
    assert not thread.is_alive()
    in_flight = [b for b in order if b not in acked][:1]  # the batch w1 was persisting, if any
    assert len(acked) < len(order), "w1 finished every batch before it was killed"

    shards.cluster.start("w1", shards.config)  # started again as it was configured (same env)
    for room, i in order:  # every batch again: the acknowledged ones are all already stored
        outcome = shards.send("w1", room, history[room][i])
        ids = [b.event_id for b in history[room][i]]
        assert sorted(outcome["stored"] + outcome["already_stored"]) == sorted(ids)
        if (room, i) in acked:
            assert outcome["stored"] == [], (room, i)
    for w in WRITERS:  # both writers write after the restart
        r = shards.client(w, "alice").put(
            f"/rooms/{local_rooms[w]}/send/m.room.message/after-{w}", json={"msgtype": "m.text", "body": "a"}
        )
        assert r.status_code == 200, r.text
    shards.caught_up()

    # stored once
    all_rooms = [*rooms["w1"], *rooms["w2"], *local_rooms.values()]
    rows = stored(shards.cluster, all_rooms)
    ids = [r[0] for r in rows]
    assert len(ids) == len(set(ids))
    expected_remote = {b.event_id for batches in history.values() for batch in batches for b in batch}
    assert expected_remote <= set(ids)
    by_id = {r[0]: r for r in rows}
    maybe_missing_on_w1 = {b.event_id for room, i in [*in_flight, *acked[-1:]] for b in history[room][i]}

    # delivered once, everywhere, in order
    for name in PROCESSES:
        got = shards.ev_rows(name)
        counts = collections.Counter(r["row"][1][0] for r in got if r["row"][1][0] in by_id)
        twice = [e for e, n in counts.items() if n > 1]
        assert not twice, f"{name} received {len(twice)} ev rows twice, e.g. {twice[:3]}"
        missing = set(by_id) - set(counts)
        if name == "w1":
            missing -= maybe_missing_on_w1
        assert not missing, f"{name} never received {len(missing)} ev rows, e.g. {sorted(missing)[:3]}"
        for r in got:
            event_id = r["row"][1][0]
            if event_id in by_id:
                assert r["token"] == by_id[event_id][2] and r["instance"] == writer_for(by_id[event_id][1], WRITERS)
        per_room: dict[str, list[tuple[int, int]]] = collections.defaultdict(list)
        for r in got:
            event_id = r["row"][1][0]
            if event_id in by_id:
                per_room[by_id[event_id][1]].append((by_id[event_id][2], by_id[event_id][3]))
        for room, seen in per_room.items():
            assert seen == sorted(seen), f"{name}: the ev rows of {room} are out of order"


def test_a_host_whose_backfill_writers_differ_from_its_events_writers_exits_with_status_2(
    process_cluster: ProcessCluster,
) -> None:
    process_cluster.configure(
        instances=["w1", "w2"], stream_writers={"events": ["w1", "w2"], "backfill": ["w1"]}, http={"port": 0}
    )
    config = process_cluster.config("bad")
    process_cluster.migrate(config)
    result = subprocess.run(
        [sys.executable, "-m", "factstream", "-c", str(config), "run", "--instance", "w1"],
        capture_output=True,
        text=True,
        env=process_cluster.env,
        cwd=process_cluster.workdir,
        timeout=120,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 2, output
    assert "stream_writers.backfill (w1) must name the same instances as stream_writers.events (w1, w2)" in output
