"""Acceptance with real processes: ``factstream run`` for main (and a second writer, writer2) and
worker1, Redis replication (a dedicated redis-server; worker1 reaches it through a proxy that can
cut it off), the HTTP API, and clients that write to the writers and sync through worker1.

The probe test plugin (tests/plugin_projects/probe) records every row worker1 receives (stream, writer,
token), so "in order, once" is checked on what replication delivered, against the stream IDs in the
database.
"""

from __future__ import annotations

import json
import os
import random
import signal
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import psycopg
import pytest

from factstream.db.engine import libpq_url
from factstream.testing import (
    FactstreamProcess,
    ProcessCluster,
    RedisServer,
    TcpProxy,
    read_json_lines,
    wait_until,
)

pytestmark = [pytest.mark.slow, pytest.mark.redis]

PLUGINS = Path(__file__).resolve().parents[2] / "plugin_projects"

#: The soak test's length in seconds (``FACTSTREAM_SOAK_SECONDS`` shortens it for quick local runs).
SOAK_SECONDS = float(os.environ.get("FACTSTREAM_SOAK_SECONDS", "60"))
USERS = ["@alice:hs", "@bob:hs", "@carol:hs"]
DEVICES = ["D1", "D2"]


def token_of(user: str) -> str:
    return "tok-" + user.strip("@").replace(":", "-")


class Deployment:
    """A ``process_cluster`` (main, writer2, worker1 over Redis; worker1 through a proxy), HTTP clients per
    instance, and the database."""

    def __init__(self, cluster: ProcessCluster, redis: RedisServer) -> None:
        self.cluster = cluster
        self.redis = redis
        self.database_url = cluster.database_url
        self.record = cluster.workdir / "worker1.record.jsonl"
        self.proxy = TcpProxy(redis.port)
        self.proxy.start()
        cluster.cleanups.append(self.proxy.close)
        for key in [k for k in cluster.env if k.startswith("FACTSTREAM_PROBE_")]:
            del cluster.env[key]
        cluster.configure(
            instances=["main", "writer2", "worker1"],
            stream_writers={"account_data": ["main", "writer2"], "to_device": ["main", "writer2"]},
            http={
                "tokens": {token_of(u): {"user": u, "write": True} for u in USERS},
                "sync_timeout_max_seconds": 5,
            },
        )
        cluster.serve_http()
        self.configs = {
            name: cluster.config(name, redis_url=f"redis://127.0.0.1:{port}/0")
            for name, port in (("direct", redis.port), ("proxied", self.proxy.port))
        }

    @property
    def processes(self) -> dict[str, FactstreamProcess]:
        return self.cluster.processes

    def migrate(self) -> None:
        self.cluster.migrate(self.configs["direct"])

    def start(self, name: str) -> FactstreamProcess:
        env = {"FACTSTREAM_PROBE_RECORD": str(self.record)} if name == "worker1" else {}
        config = self.configs["proxied" if name == "worker1" else "direct"]
        proc = self.cluster.start(name, config, env=env)
        self.cluster.wait_healthy(name, 30)
        return proc

    def client(self, name: str, user: str, timeout: float = 15.0) -> httpx.Client:
        return self.cluster.client(name, token_of(user), timeout=timeout)

    def recorded(self, stream: str) -> list[tuple[str, int]]:
        return [(r["instance"], r["token"]) for r in read_json_lines(self.record) if r["stream"] == stream]

    def stream_ids(self, table: str) -> list[tuple[str, int]]:
        with psycopg.connect(libpq_url(self.database_url)) as conn:
            rows = conn.execute(f"SELECT instance_name, stream_id FROM {table} ORDER BY stream_id").fetchall()
        return [(str(i), int(s)) for i, s in rows]

    def fetch(self, sql: str) -> list[tuple[Any, ...]]:
        with psycopg.connect(libpq_url(self.database_url)) as conn:
            return conn.execute(sql).fetchall()

    def logs(self, lines: int = 40) -> str:
        return self.cluster.logs(lines)


@pytest.fixture
def deployment(plugin_installer, process_cluster, redis_server) -> Deployment:
    plugin_installer.from_project(PLUGINS / "probe")
    d = Deployment(process_cluster, redis_server)
    d.migrate()
    return d


def sync(client: httpx.Client, since: str | None, device: str, timeout_ms: int = 0) -> dict[str, Any]:
    params = {"timeout": str(timeout_ms), "device": device}
    if since:
        params["since"] = since
    response = client.get("/sync", params=params)
    assert response.status_code == 200, response.text
    return response.json()


def in_order_once(recorded: list[tuple[str, int]], expected: list[tuple[str, int]]) -> list[str]:
    problems = []
    if sorted(recorded) != sorted(expected):
        missing = sorted(set(expected) - set(recorded))
        extra = [r for r in recorded if recorded.count(r) > 1 or r not in expected]
        problems.append(f"missing {missing[:10]} ({len(missing)}), duplicated or unexpected {extra[:10]}")
    for writer in {w for w, _ in recorded}:
        tokens = [t for w, t in recorded if w == writer]
        if tokens != sorted(set(tokens)):
            problems.append(f"{writer}'s tokens are not strictly increasing")
    return problems


@pytest.mark.serial  # asserts a time bound: run alone
def test_changes_and_messages_written_while_the_worker_is_cut_off_all_arrive_in_order_once(deployment):
    d = deployment
    for name in ("main", "worker1"):
        d.start(name)
    alice, bob = d.client("main", "@alice:hs"), d.client("worker1", "@bob:hs")
    warm = alice.put("/user/@alice:hs/account_data/m.warm", json={})
    assert warm.status_code == 200, warm.text
    wait_until(lambda: d.recorded("account_data"), 30, "worker1 following the account_data stream", detail=d.logs)
    first = sync(bob, None, "PHONE")  # Bob's phone is known from now on
    assert first["streams"] == {}

    d.proxy.refuse()
    killed = d.redis.client().execute_command("CLIENT", "KILL", "TYPE", "pubsub")
    assert killed >= 2
    for n in range(105):
        response = alice.put(f"/user/@alice:hs/account_data/m.t{n % 7}", json={"n": n})
        assert response.status_code == 200, response.text
    for n in range(101):
        response = alice.put(f"/sendToDevice/m.test/txn{n}", json={"messages": {"@bob:hs": {"*": {"n": n}}}})
        assert (response.status_code, response.json()) == (200, {"stored": 1}), response.text
    time.sleep(0.5)
    assert len(d.recorded("account_data")) == 1, "worker1 received rows while cut off"
    assert d.recorded("to_device") == []

    d.proxy.accept()
    expected_ad, expected_td = d.stream_ids("account_data_stream"), d.stream_ids("device_inbox")
    assert (len(expected_ad), len(expected_td)) == (106, 101)
    wait_until(lambda: len(d.recorded("to_device")) >= 101, 60, "worker1 catching up", detail=d.logs)
    wait_until(lambda: len(d.recorded("account_data")) >= 106, 60, "worker1 catching up", detail=d.logs)
    time.sleep(1.0)  # anything duplicated would show up now
    assert in_order_once(d.recorded("account_data"), expected_ad) == []
    assert in_order_once(d.recorded("to_device"), expected_td) == []

    # Through worker1: Bob's phone gets the 101 messages in order; Alice's sync has her latest values.
    got: list[int] = []
    since = first["next_batch"]
    while len(got) < 101:
        body = sync(bob, since, "PHONE", timeout_ms=2000)
        got += [item["content"]["n"] for item in body["streams"].get("to_device", [])]
        since = body["next_batch"]
    assert got == list(range(101))
    assert sync(bob, since, "PHONE")["streams"].get("to_device") is None
    data = sync(d.client("worker1", "@alice:hs"), None, "LAPTOP")["streams"]["account_data"]
    latest = {item["type"]: item["content"] for item in data}
    assert latest == {"m.warm": {}, **{f"m.t{k}": {"n": max(n for n in range(105) if n % 7 == k)} for k in range(7)}}

    # A message wakes exactly its recipient's long poll: Bob's returns with it at once, Carol's waits.
    carol = d.client("worker1", "@carol:hs")
    carol_since = sync(carol, None, "TABLET")["next_batch"]
    polls: dict[str, tuple[float, dict[str, Any]]] = {}

    def poll(name: str, client: httpx.Client, token: str, device: str) -> None:
        started = time.monotonic()
        body = sync(client, token, device, timeout_ms=4000)
        polls[name] = (time.monotonic() - started, body)

    threads = [
        threading.Thread(target=poll, args=("bob", bob, since, "PHONE")),
        threading.Thread(target=poll, args=("carol", carol, carol_since, "TABLET")),
    ]
    for thread in threads:
        thread.start()
    time.sleep(1.0)
    sent_at = time.monotonic()
    alice.put("/sendToDevice/m.test/wake", json={"messages": {"@bob:hs": {"PHONE": {"n": "wake"}}}})
    for thread in threads:
        thread.join(10)
    bob_took, bob_body = polls["bob"]
    carol_took, carol_body = polls["carol"]
    assert [i["content"] for i in bob_body["streams"]["to_device"]] == [{"n": "wake"}]
    assert bob_took - 1.0 < 1.0, f"Bob's long poll returned {time.monotonic() - sent_at:.2f} s after the send"
    assert carol_body["streams"] == {} and carol_took > 3.5, f"Carol's poll returned after {carol_took:.2f} s"


class SyncingDevice(threading.Thread):
    """One client device syncing through worker1 until told to stop, keeping what it received."""

    def __init__(self, d: Deployment, user: str, device: str, stop: threading.Event) -> None:
        super().__init__(name=f"sync-{user}-{device}", daemon=True)
        self.d, self.user, self.device, self.stop_event = d, user, device, stop
        self.messages: list[dict[str, Any]] = []
        self.account_data: dict[tuple[str | None, str], Any] = {}
        self.since: str | None = None
        self.errors = 0
        self.responses = 0

    def run(self) -> None:
        with self.d.client("worker1", self.user, timeout=10) as client:
            while not self.stop_event.is_set():
                try:
                    body = sync(client, self.since, self.device, timeout_ms=1000)
                except (httpx.HTTPError, AssertionError):
                    self.errors += 1  # worker1 is restarting: retry with the same token
                    time.sleep(0.2)
                    continue
                self.responses += 1
                self.messages += body["streams"].get("to_device", [])
                for item in body["streams"].get("account_data", []):
                    self.account_data[(item["room_id"], item["type"])] = item["content"]
                self.since = body["next_batch"]


def test_soak_random_writes_on_two_writers_while_the_worker_restarts(deployment):
    d = deployment
    for name in ("main", "writer2", "worker1"):
        d.start(name)
    stop_syncing = threading.Event()
    devices = {(u, dev): SyncingDevice(d, u, dev, stop_syncing) for u in USERS for dev in DEVICES}
    for device in devices.values():
        device.start()
    wait_until(lambda: all(dv.responses for dv in devices.values()), 30, "every device syncing", detail=d.logs)

    rng = random.Random(7)
    sent: dict[tuple[str, str], list[str]] = {key: [] for key in devices}
    writers = {name: {u: d.client(name, u) for u in USERS} for name in ("main", "writer2")}
    deadline = time.monotonic() + SOAK_SECONDS
    next_restart = time.monotonic() + rng.uniform(2, 5)
    restarts = retries = 0
    n = 0
    while time.monotonic() < deadline:
        n += 1
        writer = rng.choice(["main", "writer2"])
        user = rng.choice(USERS)
        client = writers[writer][user]
        if rng.random() < 0.4:
            room = rng.choice([None, "!r1:hs", "!r2:hs"])
            path = f"/user/{user}/account_data/m.t{rng.randrange(4)}"
            if room:
                path = f"/user/{user}/rooms/{room}/account_data/m.t{rng.randrange(4)}"
            response = client.put(path, json={"n": n, "by": writer})
            assert response.status_code == 200, response.text
        else:
            to = rng.choice(USERS)
            target = rng.choice([*DEVICES, "*"])
            message_id = f"{writer}-{n}"
            body = {"messages": {to: {target: {"id": message_id}}}}
            response = client.put(f"/sendToDevice/m.soak/{message_id}", json=body)
            assert response.status_code == 200, response.text
            if rng.random() < 0.1:  # a client retry: same transaction, nothing new
                retries += 1
                again = client.put(f"/sendToDevice/m.soak/{message_id}", json=body)
                assert again.json() == response.json()
            for dev in DEVICES if target == "*" else [target]:
                sent[(to, dev)].append(message_id)
        if time.monotonic() >= next_restart:
            restarts += 1
            d.processes["worker1"].stop(signal.SIGKILL if restarts % 2 else signal.SIGTERM)
            d.start("worker1")
            next_restart = time.monotonic() + rng.uniform(2, 5)
        time.sleep(rng.uniform(0, 0.02))

    def delivered() -> bool:
        return all(len(devices[key].messages) >= len(ids) for key, ids in sent.items())

    wait_until(delivered, 60, "every device receiving its messages", detail=d.logs)
    time.sleep(2.0)  # a duplicate would arrive now
    stop_syncing.set()
    for device in devices.values():
        device.join(15)

    print(f"soak: {n} writes, {restarts} worker restarts, {retries} retried sends")
    assert restarts >= (2 if SOAK_SECONDS >= 20 else 1)
    for key, ids in sent.items():
        got = [m["content"]["id"] for m in devices[key].messages]
        duplicates = len(got) - len(set(got))
        assert sorted(got) == sorted(ids), f"{key}: missing {set(ids) - set(got)}, {duplicates} duplicates"
        for writer in ("main", "writer2"):
            mine = [m["stream_id"] for m in devices[key].messages if m["instance"] == writer]
            assert mine == sorted(mine), f"{key}: {writer}'s messages out of order"
    latest = d.fetch("SELECT user_id, room_id, data_type, content FROM account_data_latest")
    for user_id, room, data_type, content in latest:
        for dev in DEVICES:
            held = devices[(user_id, dev)].account_data.get((room or None, data_type))
            assert held == json.loads(content), f"{user_id}/{dev} holds {held} for {room or 'global'} {data_type}"
