"""Receipts across real processes (issue 46's acceptance): ``factstream run`` for ``main`` (the writer
of ``events`` and ``receipts``) and ``worker1`` (serving ``/sync``), replicating over TCP and over Redis.

A receipt sent on main reaches the room's members long-polling ``/sync`` on the worker, their long polls
woken by it; a member's private receipt reaches its owner's long poll and nobody else's, and a user who
is not in the room gets nothing.
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
#: The long polls woken by a receipt: they must return long before this.
LONG_POLL_MS = 20_000


class Deployment:
    """``main`` and ``worker1`` of a ``process_cluster``, started and healthy."""

    def __init__(self, cluster: ProcessCluster, redis_url: str | None) -> None:
        self.cluster = cluster
        cluster.configure(instances=["main", "worker1"], http={"tokens": TOKENS, "sync_timeout_max_seconds": 30})
        cluster.serve_http()
        config = cluster.config("receipts", redis_url=redis_url)
        cluster.migrate(config)
        for name in ("main", "worker1"):
            cluster.start(name, config)
        for name in ("main", "worker1"):
            cluster.wait_healthy(name, 60)

    def client(self, name: str, user: str) -> httpx.Client:
        return self.cluster.client(name, token_of(user), timeout=60)

    def post(self, user: str, path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        with self.client("main", user) as http:
            response = http.post(path, json=body or {})
        assert response.status_code == 200, f"POST {path}: {response.status_code} {response.text}"
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


def receipts(body: dict[str, Any], room: str) -> set[tuple[str, str, str]]:
    """``(event_id, receipt_type, user)`` of the room's ``m.receipt`` events in a ``/sync`` body."""
    room_part = body.get("rooms", {}).get("join", {}).get(room, {})
    return {
        (event_id, receipt_type, user)
        for event in room_part.get("ephemeral", {}).get("events", [])
        if event["type"] == "m.receipt"
        for event_id, types in event["content"].items()
        for receipt_type, users in types.items()
        for user in users
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


def poll_until(http: httpx.Client, since: str, room: str, timeout_ms: int) -> tuple[set[Any], float]:
    """Long polls from ``since`` until one brings receipts of ``room`` or ``timeout_ms`` passed."""
    started = time.monotonic()
    while (left := timeout_ms - int((time.monotonic() - started) * 1000)) > 0:
        body = sync(http, since, timeout=left)
        since = body["next_batch"]
        got = receipts(body, room)
        if got:
            return got, time.monotonic() - started
    return set(), time.monotonic() - started


def test_receipts_reach_the_members_on_a_worker_and_private_ones_only_their_owner(deployment: Deployment) -> None:
    d = deployment
    room = str(d.post(ALICE, "/createRoom", {"preset": "public_chat"})["room_id"])
    for user in (BOB, CAROL):
        d.post(user, f"/rooms/{room}/join")
    with d.client("main", ALICE) as http:
        body = {"msgtype": "m.text", "body": "hello"}
        response = http.put(f"/rooms/{room}/send/m.room.message/t1", json=body)
        assert response.status_code == 200, response.text
        message = str(response.json()["event_id"])
    readers = {user: d.client("worker1", user) for user in (BOB, CAROL, DAVE)}
    since = {user: drained(http) for user, http in readers.items()}
    with concurrent.futures.ThreadPoolExecutor(3) as pool:
        # alice's public receipt: both members' long polls wake with it; dave, no member, gets nothing
        polls = {
            user: pool.submit(poll_until, http, since[user], room, LONG_POLL_MS if user != DAVE else 3_000)
            for user, http in readers.items()
        }
        time.sleep(0.5)
        d.post(ALICE, f"/rooms/{room}/receipt/m.read/{message}")
        for user in (BOB, CAROL):
            got, took = polls[user].result(60)
            assert got == {(message, "m.read", ALICE)}, user
            assert took < 10, f"{user}'s long poll took {took:.1f} s"
        assert polls[DAVE].result(60)[0] == set()
        since = {user: drained(http) for user, http in readers.items()}
        # bob's private receipt: bob's long poll wakes with it, carol's does not
        polls = {
            user: pool.submit(poll_until, readers[user], since[user], room, LONG_POLL_MS if user == BOB else 3_000)
            for user in (BOB, CAROL)
        }
        time.sleep(0.5)
        d.post(BOB, f"/rooms/{room}/receipt/m.read.private/{message}")
        got, took = polls[BOB].result(60)
        assert got == {(message, "m.read.private", BOB)} and took < 10
        assert polls[CAROL].result(60)[0] == set()
    # what the worker shows from the start: the public receipt to both, the private one to bob alone
    assert receipts(sync(readers[BOB]), room) == {(message, "m.read", ALICE), (message, "m.read.private", BOB)}
    assert receipts(sync(readers[CAROL]), room) == {(message, "m.read", ALICE)}
    assert receipts(sync(readers[DAVE]), room) == set()
    for http in readers.values():
        http.close()
