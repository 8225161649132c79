"""Presence across real processes (issue 46's acceptance): ``factstream run`` for ``main`` (the writer of
``events`` and ``presence``) and ``worker1`` (serving ``/sync``), over TCP and over Redis.

* bob long-polls ``/sync`` on the worker: the worker reports him (``USER_SYNC``) and he is online on the
  presence writer; alice, who shares a room with him, sees it (``GET /presence`` and her ``/sync``);
  carol, who shares none, does not.
* worker1 is killed (SIGKILL: no ``CLEAR_USER_SYNC``) while bob's long poll is open: bob goes offline
  within the documented time (the writer learns the worker is gone, TCP at once or the instance lease
  within 2 s; then ``sync_online_timeout_ms``, here 2 s; then the next check, every 0.5 s).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from factstream.testing import ProcessCluster
from tests.bundled.events.conftest import TOKENS, token_of

pytestmark = pytest.mark.slow

ALICE, BOB, CAROL = "@alice:hs", "@bob:hs", "@carol:hs"
FAST = {"sync_online_timeout_ms": 2000, "stop_syncing_delay_ms": 1000, "check_interval_ms": 500}
#: How long bob may stay online after worker1 died: liveness 2 s + sync_online_timeout 2 s + a check, with room.
OFFLINE_WITHIN = 10.0


class Deployment:
    def __init__(self, cluster: ProcessCluster, redis_url: str | None) -> None:
        self.cluster = cluster
        cluster.configure(
            instances=["main", "worker1"],
            http={"tokens": TOKENS, "sync_timeout_max_seconds": 30},
            plugins={"presence": FAST},
        )
        cluster.serve_http()
        config = cluster.config("presence", redis_url=redis_url)
        cluster.migrate(config)
        for name in ("main", "worker1"):
            cluster.start(name, config)
        for name in ("main", "worker1"):
            cluster.wait_healthy(name, 60)

    def client(self, name: str, user: str, timeout: float = 60) -> httpx.Client:
        return self.cluster.client(name, token_of(user), timeout=timeout)

    def call(self, user: str, method: str, path: str, body: dict[str, Any] | None = None) -> httpx.Response:
        with self.client("main", user) as http:
            return http.request(method, path, json=body) if body is not None else http.request(method, path)

    def presence(self, asker: str, user: str) -> str | None:
        response = self.call(asker, "GET", f"/presence/{user}/status")
        if response.status_code == 404:
            return None
        assert response.status_code == 200, response.text
        return str(response.json()["presence"])


@pytest.fixture(params=["tcp", "redis"])
def deployment(request: pytest.FixtureRequest, process_cluster: ProcessCluster) -> Iterator[Deployment]:
    redis_url = None
    if request.param == "redis":
        request.applymarker(pytest.mark.redis)
        redis_url = str(request.getfixturevalue("redis_url"))
    yield Deployment(process_cluster, redis_url)


def keep_syncing(http: httpx.Client, stop: threading.Event) -> None:
    """Long polls, one after the other, until ``stop`` (or the worker dies)."""
    since = None
    while not stop.is_set():
        params: dict[str, Any] = {"timeout": 20_000} if since else {}
        if since:
            params["since"] = since
        try:
            response = http.get("/sync", params=params)
        except httpx.HTTPError:
            return
        since = response.json().get("next_batch", since)


def until(check: Any, timeout: float) -> float:
    started = time.monotonic()
    while not check():
        assert time.monotonic() - started < timeout, "timed out"
        time.sleep(0.2)
    return time.monotonic() - started


def test_presence_follows_syncing_on_a_worker_and_a_killed_worker_takes_its_users_offline(
    deployment: Deployment,
) -> None:
    d = deployment
    room = d.call(ALICE, "POST", "/createRoom", {"preset": "public_chat"}).json()["room_id"]
    assert d.call(BOB, "POST", f"/rooms/{room}/join", {}).status_code == 200
    stop = threading.Event()
    bob = d.client("worker1", BOB)
    syncing = threading.Thread(target=keep_syncing, args=(bob, stop), daemon=True)
    syncing.start()
    try:
        until(lambda: d.presence(ALICE, BOB) == "online", 15)
        assert d.presence(CAROL, BOB) is None  # carol shares no room with bob
        with d.client("main", ALICE) as alice:
            events = alice.get("/sync").json().get("presence", {}).get("events", [])
        assert {(e["sender"], e["content"]["presence"]) for e in events} >= {(BOB, "online")}
        with d.client("main", CAROL) as carol:
            events = carol.get("/sync").json().get("presence", {}).get("events", [])
        assert BOB not in {e["sender"] for e in events}
        d.cluster.processes["worker1"].kill()
        took = until(lambda: d.presence(ALICE, BOB) == "offline", OFFLINE_WITHIN + 5)
        assert took < OFFLINE_WITHIN, f"bob went offline {took:.1f} s after worker1 died"
    finally:
        stop.set()
        bob.close()
