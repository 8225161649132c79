"""The events stream flows between real processes (issue 32's replication acceptance points), on TCP and
on Redis: ``factstream run`` for main (the writer) and worker1, whose link to main (TCP) or to Redis
goes through a proxy the test can cut and use to inject lines. The eventsprobe test plugin
(tests/plugin_projects/eventsprobe) records every events and backfill row worker1 receives, and on
main resolves merges with the state keys of a type dropped while the test asks for it.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from factstream.testing import ProcessCluster, RedisServer, TcpProxy, free_port, read_json_lines, wait_until
from tests.bundled.events.remote_history import ROOM_VERSION, Built, RemoteRoom

pytestmark = [pytest.mark.slow, pytest.mark.parametrize("transport", ["tcp", "redis"])]

PLUGINS = Path(__file__).resolve().parents[2] / "plugin_projects"
ALICE, ZED = "@alice:hs", "@zed:elsewhere"
TOKENS = {"tok-alice": {"user": ALICE}, "tok-server": {"user": "@server:hs", "write": True}}


class Flow:
    """main and worker1 (through :attr:`proxy`), HTTP clients, worker1's recorded rows."""

    def __init__(self, cluster: ProcessCluster, transport: str, redis: RedisServer) -> None:
        self.cluster, self.transport, self.redis = cluster, transport, redis
        self.record = cluster.workdir / "worker1.rows.jsonl"
        self.drop = cluster.workdir / "drop-state-type"
        self.http = {name: free_port() for name in ("main", "worker1")}
        cluster.configure(
            instances=list(self.http),
            instance_map={name: {"http_port": port} for name, port in self.http.items()},
            http={"tokens": TOKENS},
        )
        if transport == "tcp":
            self.proxy = TcpProxy(cluster.main_port)
            configs = {
                "main": cluster.config("main"),
                "worker1": cluster.config("worker1", replication_port=self.proxy.port),
            }
        else:
            self.proxy = TcpProxy(redis.port)
            configs = {
                "main": cluster.config("main", redis_url=f"redis://127.0.0.1:{redis.port}/0"),
                "worker1": cluster.config("worker1", redis_url=f"redis://127.0.0.1:{self.proxy.port}/0"),
            }
        self.proxy.start()
        cluster.cleanups.append(self.proxy.close)
        cluster.migrate(configs["main"])
        cluster.start("main", configs["main"], env={"FACTSTREAM_EVENTSPROBE_DROP": str(self.drop)})
        cluster.start("worker1", configs["worker1"], env={"FACTSTREAM_EVENTSPROBE_RECORD": str(self.record)})
        self.alice = httpx.Client(base_url=self.url("main"), headers={"Authorization": "Bearer tok-alice"}, timeout=20)
        self.server = httpx.Client(
            base_url=self.url("main"), headers={"Authorization": "Bearer tok-server"}, timeout=20
        )
        self.caught_up()

    def url(self, name: str) -> str:
        return f"http://127.0.0.1:{self.http[name]}"

    def position(self, name: str) -> int:
        r = httpx.get(
            f"{self.url(name)}/streams/events/positions", headers={"Authorization": "Bearer tok-alice"}, timeout=5
        )
        r.raise_for_status()
        return int(r.json()["positions"].get("main", 0))

    def caught_up(self, timeout: float = 30) -> int:
        target = self.position("main")
        wait_until(lambda: self.position("worker1") >= target, timeout, "worker1 to catch up", detail=self.cluster.logs)
        return target

    def rows(self, stream: str = "events") -> list[dict[str, Any]]:
        return [r for r in read_json_lines(self.record) if r["stream"] == stream]

    def cut(self) -> None:
        self.proxy.refuse()
        self.proxy.drop()

    def send(self, room: str, body: str) -> str:
        r = self.alice.put(f"/rooms/{room}/send/m.room.message/{body}", json={"msgtype": "m.text", "body": body})
        assert r.status_code == 200, r.text
        return str(r.json()["event_id"])

    def remote(self, room: RemoteRoom, events: list[Built], **extra: Any) -> None:
        body = json.dumps({"events": [json.loads(b.raw) for b in events], "room_version": ROOM_VERSION, **extra})
        r = self.server.post(f"/rooms/{room.room_id}/remote_events", content=body)
        assert r.status_code == 200, r.text


@pytest.fixture
def flow(process_cluster: ProcessCluster, plugin_installer: Any, redis_server: RedisServer, transport: str) -> Flow:
    plugin_installer.from_project(PLUGINS / "eventsprobe")
    return Flow(process_cluster, transport, redis_server)


def ev(row: dict[str, Any]) -> tuple[str, str]:
    kind, data = row["row"]
    return kind, data[0]


def test_a_worker_that_was_cut_off_receives_the_messages_then_the_state_event_then_its_state_row(flow: Flow) -> None:
    r = flow.alice.post("/createRoom", json={"preset": "public_chat"})
    room = r.json()["room_id"]
    flow.caught_up()
    flow.cut()
    mark = len(flow.rows())
    messages = [flow.send(room, f"m{i}") for i in range(101)]
    r = flow.alice.put(f"/rooms/{room}/state/m.room.topic", json={"topic": "after"})
    assert r.status_code == 200, r.text
    topic = r.json()["event_id"]
    assert len(flow.rows()) == mark  # nothing reached the worker meanwhile
    flow.proxy.accept()
    at = flow.caught_up(60)
    time.sleep(1)  # anything more would arrive now
    got = flow.rows()[mark:]
    assert [ev(r) for r in got[:101]] == [("ev", m) for m in messages]
    assert [r["token"] for r in got[:101]] == sorted(r["token"] for r in got[:101])
    assert [ev(r) for r in got[101:102]] == [("ev", topic)]
    assert [r["row"] for r in got[102:]] == [["state", [room, "m.room.topic", "", topic]]]
    assert got[-1]["token"] == at and len(got) == 103

    # a replayed RDATA of an old token, from the real writer's name on the authenticated link: ignored
    old = got[50]
    line = f"RDATA events main {old['token']} {json.dumps(old['row'], separators=(',', ':'))}\n".encode()
    if flow.transport == "tcp":
        assert flow.proxy.inject(line) == 1
    else:
        flow.redis.client().publish(flow.cluster.deployment, line.rstrip(b"\n"))
    time.sleep(1)
    assert flow.position("worker1") == at
    assert len(flow.rows()) == mark + 103
    later = flow.send(room, "later")  # the link still works, from where it was
    flow.caught_up()
    assert [ev(r) for r in flow.rows()[mark + 103 :]] == [("ev", later)]


@pytest.mark.parametrize("dropped", [100, 150])
def test_a_merge_that_removes_state_keys_sends_null_state_rows_or_one_state_all(flow: Flow, dropped: int) -> None:
    room = RemoteRoom("!merge:elsewhere")
    room.create(ZED)
    for i in range(dropped):
        room.add("m.drop", ZED, {"n": i}, state_key=f"k{i}")
    flow.remote(room, room.events)
    fork = room.events[-1].event_id
    side = room.add("m.room.name", ZED, {"name": "side"}, state_key="", prev=[fork])
    flow.remote(room, [side])
    flow.caught_up()
    mark = len(flow.rows())
    before = room.add("m.room.message", ZED, {"body": "before"}, prev=[fork])
    flow.remote(room, [before])
    flow.drop.write_text("m.drop")
    merge = room.add("m.room.topic", ZED, {"topic": "merged"}, state_key="", prev=[before.event_id, side.event_id])
    flow.remote(room, [merge])
    flow.drop.unlink()
    after = room.add("m.room.message", ZED, {"body": "after"})
    flow.remote(room, [after])
    flow.caught_up()
    time.sleep(0.5)
    got = flow.rows()[mark:]
    assert [ev(r) for r in got[:2]] == [("ev", before.event_id), ("ev", merge.event_id)]
    assert ev(got[-1]) == ("ev", after.event_id)
    middle = got[2:-1]
    assert {r["token"] for r in middle} == {got[1]["token"]}  # at the merge's ID
    if dropped < 150:
        expected = [["state", [room.room_id, "m.drop", f"k{i}", None]] for i in range(dropped)]
        expected.append(["state", [room.room_id, "m.room.topic", "", merge.event_id]])
        assert sorted(json.dumps(r["row"]) for r in middle) == sorted(json.dumps(e) for e in expected)
    else:
        assert [r["row"] for r in middle] == [["state-all", [room.room_id]]]


def test_backfilled_events_replicate_on_the_backfill_stream_and_never_as_new_events(flow: Flow) -> None:
    room = RemoteRoom("!backfill:elsewhere")
    room.create(ZED)
    room.add("m.room.member", ALICE, {"membership": "join"}, state_key=ALICE)
    flow.remote(room, room.events)
    old = [room.add("m.room.message", ZED, {"body": f"old {i}"}) for i in range(3)]
    recent = room.add("m.room.message", ZED, {"body": "recent"})
    flow.remote(room, [recent])
    since = f"s{flow.caught_up()}"
    mark = len(flow.rows())
    flow.remote(room, old, backfill=True)
    flow.caught_up()
    wait_until(lambda: len(flow.rows("backfill")) >= 3, 10, "the backfill rows", detail=flow.cluster.logs)
    backfill = flow.rows("backfill")
    assert sorted(r["row"][0] for r in backfill) == sorted(b.event_id for b in old)
    assert all(r["token"] > 0 and r["instance"] == "main" for r in backfill)
    assert flow.rows()[mark:] == []  # nothing on the events stream
    worker = httpx.Client(base_url=flow.url("worker1"), headers={"Authorization": "Bearer tok-alice"}, timeout=10)
    answer = worker.get("/events", params={"from": since}).json()
    shown = [e["event_id"] for r in answer["rooms"].values() for e in r["events"]]
    assert not set(shown) & {b.event_id for b in old}
    answer = worker.get("/events", params={"from": "s0"}).json()
    shown = [e["event_id"] for r in answer["rooms"].values() for e in r["events"]]
    assert recent.event_id in shown and not set(shown) & {b.event_id for b in old}
