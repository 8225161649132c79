"""Two writers of ``events`` and a sync worker as real processes (issue 35; docs/plugins/events.md, "Tokens
with several writers"), replicating over TCP or Redis.

* A stalled writer: ``w1`` is stuck inside its transaction, holding a reserved stream ID (a test
  transaction holds the ``event_txn_ids`` key its send writes; ``pg_stat_activity`` shows it waiting).
  Meanwhile a message in ``w2``'s room reaches a long poll of ``/sync`` on the worker and ``/events``
  on ``w2``, ``w1`` and the worker. The test rolls back: ``w1`` commits, and the next reads bring
  its message once and nothing of ``w2`` again.
* A long poll on the worker wakes for a new event in either writer's rooms within one round trip.
"""

from __future__ import annotations

import concurrent.futures
import json
import time
from collections.abc import Iterator
from typing import Any

import httpx
import psycopg
import pytest
from factstream_events.shared.sharding import writer_for

from factstream.db.engine import libpq_url
from factstream.testing import ProcessCluster, wait_until
from tests.bundled.events.conftest import TOKENS, token_of
from tests.bundled.events.multiwriter import ALICE, BOB, INSTANCES, WAITING, WRITERS

pytestmark = pytest.mark.slow

FILTER = json.dumps({"room": {"timeline": {"limit": 100}}})
LONG_POLL_MS = 20_000


class Deployment:
    """``w1``, ``w2`` (writers of ``events``) and ``worker1`` of a ``process_cluster``."""

    def __init__(self, cluster: ProcessCluster, redis_url: str | None) -> None:
        self.cluster = cluster
        cluster.configure(
            instances=list(INSTANCES),
            stream_writers={"events": list(WRITERS), "backfill": list(WRITERS)},
            http={"tokens": TOKENS, "sync_timeout_max_seconds": 30},
        )
        cluster.serve_http()
        self.config = cluster.config("multiwriter", redis_url=redis_url)
        cluster.migrate(self.config)
        for name in INSTANCES:
            cluster.start(name, self.config)
        for name in INSTANCES:
            cluster.wait_healthy(name, 60)

    def client(self, name: str, user: str = BOB) -> httpx.Client:
        return self.cluster.client(name, token_of(user), timeout=60)

    def call(self, name: str, user: str, method: str, path: str, body: dict[str, Any] | None = None) -> dict[str, Any]:
        with self.client(name, user) as http:
            response = http.request(method, path, json=body or {})
        assert response.status_code == 200, f"{method} {path} on {name}: {response.status_code} {response.text}"
        return dict(response.json())

    def rooms(self) -> dict[str, str]:
        """A public room of each writer, created by it (``writer_for``), bob joined."""
        owned: dict[str, str] = {}
        while len(owned) < len(WRITERS):
            for writer in WRITERS:
                if writer in owned:
                    continue
                room = self.call(writer, ALICE, "POST", "/createRoom", {"preset": "public_chat"})["room_id"]
                if writer_for(room, WRITERS) == writer:
                    self.call(writer, BOB, "POST", f"/rooms/{room}/join")
                    owned[writer] = room
        return owned

    def send(self, writer: str, room: str, txn: str) -> str:
        body = {"msgtype": "m.text", "body": txn}
        return str(self.call(writer, ALICE, "PUT", f"/rooms/{room}/send/m.room.message/{txn}", body)["event_id"])


@pytest.fixture(params=["tcp", "redis"])
def deployment(request: pytest.FixtureRequest, process_cluster: ProcessCluster) -> Iterator[Deployment]:
    redis_url = None
    if request.param == "redis":
        request.applymarker(pytest.mark.redis)
        redis_url = str(request.getfixturevalue("redis_url"))
    yield Deployment(process_cluster, redis_url)


def get(http: httpx.Client, path: str, **params: Any) -> dict[str, Any]:
    response = http.get(path, params=params)
    assert response.status_code == 200, response.text
    return dict(response.json())


def messages(answer: dict[str, Any]) -> list[str]:
    """The message IDs of an ``/events`` or ``/sync`` answer."""
    if "next" in answer:
        rooms = [v["events"] for v in answer["rooms"].values()]
    else:
        rooms = [v["timeline"]["events"] for v in answer.get("rooms", {}).get("join", {}).values()]
    return [e["event_id"] for events in rooms for e in events if e["type"] == "m.room.message"]


def drained(http: httpx.Client) -> str:
    """An initial ``/sync``, then incremental ones until one brings no rooms (the worker has caught up
    with the rooms' creation and joins): the token to long-poll from."""
    since = get(http, "/sync", filter=FILTER)["next_batch"]
    for _ in range(30):
        body = get(http, "/sync", since=since, filter=FILTER, timeout=1000)
        since = body["next_batch"]
        if not body.get("rooms"):
            return since
    raise AssertionError("/sync on the worker never settled")


def until_events(http: httpx.Client, since: str, wanted: str, timeout: float = 15.0) -> tuple[list[str], str]:
    """Poll ``/events`` from ``since`` until ``wanted`` came: every message received, and the last ``next``."""
    got: list[str] = []
    deadline = time.monotonic() + timeout
    while wanted not in got:
        assert time.monotonic() < deadline, f"{wanted} never reached /events (got {got})"
        answer = get(http, "/events", **{"from": since, "limit": 100})
        got += messages(answer)
        since = answer["next"]
        if wanted not in got:
            time.sleep(0.1)
    return got, since


def test_a_stalled_writer_holds_back_none_of_the_other_writers_rooms_on_any_process(deployment: Deployment) -> None:
    d = deployment
    rooms = d.rooms()
    readers = {name: d.client(name) for name in INSTANCES}
    sync_since = drained(readers["worker1"])
    events_since = {name: get(http, "/events")["next"] for name, http in readers.items()}
    url = libpq_url(d.cluster.database_url)
    with (
        psycopg.connect(url) as held,
        psycopg.connect(url, autocommit=True) as watch,
        concurrent.futures.ThreadPoolExecutor(4) as pool,
    ):
        held.execute(
            "INSERT INTO event_txn_ids (user_id, txn_id, request_hash, event_id, inserted_ts)"
            " VALUES (%s, 'send/stalled', 'held by the test', '$held', 0)",
            (ALICE,),
        )
        stalled = pool.submit(d.send, "w1", rooms["w1"], "stalled")
        wait_until(lambda: watch.execute(WAITING).fetchone()[0] > 0, 30, "w1 to wait on the held key")
        assert not stalled.done()
        long_poll = pool.submit(get, readers["worker1"], "/sync", since=sync_since, filter=FILTER, timeout=LONG_POLL_MS)
        time.sleep(0.5)
        started = time.monotonic()
        quick = d.send("w2", rooms["w2"], "quick")
        woken = long_poll.result(LONG_POLL_MS / 1000 + 30)
        waited = time.monotonic() - started
        assert messages(woken) == [quick] and waited < LONG_POLL_MS / 1000 / 2, (waited, woken)
        sync_since = woken["next_batch"]
        for name, http in readers.items():
            got, events_since[name] = until_events(http, events_since[name], quick)
            assert got == [quick], f"{name} while w1 is stalled: {got}"
        assert watch.execute(WAITING).fetchone()[0] > 0 and not stalled.done(), "w1 is still stalled"
        held.rollback()
        slow = stalled.result(30)
    for name, http in readers.items():
        got, events_since[name] = until_events(http, events_since[name], slow)
        assert got == [slow], f"{name} after w1 committed: {got}"
        assert messages(get(http, "/events", **{"from": events_since[name]})) == []
    after = get(readers["worker1"], "/sync", since=sync_since, filter=FILTER, timeout=LONG_POLL_MS)
    assert messages(after) == [slow]
    assert messages(get(readers["worker1"], "/sync", since=after["next_batch"], filter=FILTER, timeout=500)) == []
    for http in readers.values():
        http.close()


def test_a_long_poll_on_the_worker_wakes_for_either_writers_room_within_one_round_trip(deployment: Deployment) -> None:
    d = deployment
    rooms = d.rooms()
    with d.client("worker1") as http, concurrent.futures.ThreadPoolExecutor(1) as pool:
        since = drained(http)
        for round_ in range(2):
            for writer in WRITERS:
                poll = pool.submit(get, http, "/sync", since=since, filter=FILTER, timeout=LONG_POLL_MS)
                time.sleep(0.5)
                started = time.monotonic()
                event_id = d.send(writer, rooms[writer], f"wake-{writer}-{round_}")
                body = poll.result(LONG_POLL_MS / 1000 + 30)
                waited = time.monotonic() - started
                assert messages(body) == [event_id], body
                assert waited < 5.0, f"the long poll took {waited:.1f} s to wake for {writer}'s room"
                since = body["next_batch"]
