"""Typing across real processes (issue 46's acceptance): ``factstream run`` for ``main`` (the writer of
``events`` and of the kept ``typing`` stream) and ``worker1`` (serving ``/sync``), over TCP and Redis.

* A user typing on main is seen by the room's members long-polling ``/sync`` on the worker, their long
  polls woken by it, and by nobody else (a user in no room with them sees nothing).
* main is killed (SIGKILL, its typing state lost with it) while the members sync on the worker, and
  started again: every member's list is emptied (nobody types any more: nothing sticks), and the next
  typing on the new main reaches them (nothing of the new run is skipped).
"""

from __future__ import annotations

import concurrent.futures
import time
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from factstream.testing import ProcessCluster
from tests.bundled.events.conftest import TOKENS, token_of

pytestmark = pytest.mark.slow

ALICE, BOB, CAROL, DAVE = "@alice:hs", "@bob:hs", "@carol:hs", "@dave:hs"
LONG_POLL_MS = 20_000


class Deployment:
    """``main`` and ``worker1`` of a ``process_cluster``, started and healthy."""

    def __init__(self, cluster: ProcessCluster, redis_url: str | None) -> None:
        self.cluster = cluster
        cluster.configure(instances=["main", "worker1"], http={"tokens": TOKENS, "sync_timeout_max_seconds": 30})
        cluster.serve_http()
        self.config = cluster.config("typing", redis_url=redis_url)
        cluster.migrate(self.config)
        for name in ("main", "worker1"):
            cluster.start(name, self.config)
        for name in ("main", "worker1"):
            cluster.wait_healthy(name, 60)

    def client(self, name: str, user: str) -> httpx.Client:
        return self.cluster.client(name, token_of(user), timeout=60)

    def call(self, user: str, method: str, path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        with self.client("main", user) as http:
            response = http.request(method, path, json=body or {})
        assert response.status_code == 200, f"{method} {path}: {response.status_code} {response.text}"
        return dict(response.json())


@pytest.fixture(params=["tcp", "redis"])
def deployment(request: pytest.FixtureRequest, process_cluster: ProcessCluster) -> Iterator[Deployment]:
    redis_url = None
    if request.param == "redis":
        request.applymarker(pytest.mark.redis)
        redis_url = str(request.getfixturevalue("redis_url"))
    yield Deployment(process_cluster, redis_url)


def sync(http: httpx.Client, since: str | None = None, timeout: int = 0) -> dict[str, Any]:
    params: dict[str, Any] = {"timeout": timeout}
    if since is not None:
        params["since"] = since
    response = http.get("/sync", params=params)
    assert response.status_code == 200, response.text
    return dict(response.json())


def typing_of(body: dict[str, Any]) -> dict[str, list[str]]:
    """Each room's ``m.typing`` list in a ``/sync`` body."""
    return {
        room: event["content"]["user_ids"]
        for room, part in body.get("rooms", {}).get("join", {}).items()
        for event in part.get("ephemeral", {}).get("events", [])
        if event["type"] == "m.typing"
    }


def drained(http: httpx.Client) -> str:
    """An initial ``/sync``, then incremental ones until one brings no rooms: the token to poll from."""
    since = sync(http)["next_batch"]
    for _ in range(30):
        body = sync(http, since, timeout=500)
        since = body["next_batch"]
        if not body.get("rooms"):
            return since
    raise AssertionError("/sync on the worker never settled")


def poll_until(http: httpx.Client, since: str, room: str, timeout_ms: int) -> tuple[list[str] | None, str, float]:
    """Long polls from ``since`` until one brings ``room``'s typing list or ``timeout_ms`` passed:
    ``(the list or None, the last token, seconds taken)``."""
    started = time.monotonic()
    while (left := timeout_ms - int((time.monotonic() - started) * 1000)) > 0:
        body = sync(http, since, timeout=left)
        since = body["next_batch"]
        typing = typing_of(body)
        if room in typing:
            return typing[room], since, time.monotonic() - started
    return None, since, time.monotonic() - started


def test_typing_reaches_the_members_on_a_worker_and_survives_the_writer_s_restart(deployment: Deployment) -> None:
    d = deployment
    room = str(d.call(ALICE, "POST", "/createRoom", {"preset": "public_chat"})["room_id"])
    d.call(BOB, "POST", f"/rooms/{room}/join")
    other = str(d.call(DAVE, "POST", "/createRoom", {"preset": "public_chat"})["room_id"])
    readers = {user: d.client("worker1", user) for user in (BOB, DAVE)}
    since = {user: drained(http) for user, http in readers.items()}
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        polls = {
            BOB: pool.submit(poll_until, readers[BOB], since[BOB], room, LONG_POLL_MS),
            DAVE: pool.submit(poll_until, readers[DAVE], since[DAVE], room, 3_000),
        }
        time.sleep(0.5)
        d.call(ALICE, "PUT", f"/rooms/{room}/typing/{ALICE}", {"typing": True, "timeout": 60_000})
        users, since[BOB], took = polls[BOB].result(60)
        assert users == [ALICE]
        assert took < 10, f"bob's long poll took {took:.1f} s"
        assert polls[DAVE].result(60)[0] is None  # dave is in no room with alice
    assert typing_of(sync(readers[DAVE])) == {}
    assert typing_of(sync(readers[DAVE], since[DAVE])).get(other) is None

    # main dies with alice typing; bob keeps syncing on the worker through the restart
    d.cluster.processes["main"].kill()
    d.cluster.start("main", d.config)
    d.cluster.wait_healthy("main", 60)
    users, since[BOB], took = poll_until(readers[BOB], since[BOB], room, LONG_POLL_MS)
    assert users == [], "alice's typing from before main's restart still shows"
    # a token from before the restart, replayed, also says nobody types (nothing sticks)
    d.call(BOB, "PUT", f"/rooms/{room}/typing/{BOB}", {"typing": True})
    users, since[BOB], took = poll_until(readers[BOB], since[BOB], room, LONG_POLL_MS)
    assert users == [BOB], "typing on the restarted main did not reach the worker"
    d.call(BOB, "PUT", f"/rooms/{room}/typing/{BOB}", {"typing": False})
    users, since[BOB], took = poll_until(readers[BOB], since[BOB], room, LONG_POLL_MS)
    assert users == []
    for http in readers.values():
        http.close()
