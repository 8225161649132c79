"""A long poll of ``/sync`` on a worker wakes for everything the worker applied, after a backlog that holds
both writers' rows, over TCP and over Redis (docs/sync.md, "When a long poll returns").

Two writers of ``events`` (``w1``, ``w2``) and ``worker1``, as real processes. Bob is joined to rooms of
both writers and long-polls ``/sync`` on the worker. Each round opens a long poll, stops the worker
(SIGSTOP), has ``w2`` write a burst of events into bob's rooms, then ``w1`` one event into bob's room there,
then ``w2`` a short tail, and continues the worker. The link stays up (the stop is far shorter than the
keepalive's timeout), so the worker gets everything as one large backlog, in which rows of both writers
come between two POSITIONs. Once ``/events`` on the worker serves the newest event of the burst and
``w1``'s event (they are applied there), every long poll from bob's token must answer at once, until bob
has both: a poll that ends empty at its timeout then is a missed wake-up.

Before the fix the reader advanced the two writers one after the other and woke, at the first advance,
for the rows of both: the rows of the second were read at a token without them, and their own advance
woke nobody (docs/decisions.md). That failed in the first round or two on this machine.

``FACTSTREAM_WAKEUP_ROUNDS`` sets the rounds per transport (3 by default; the issue's soak ran 50).
"""

from __future__ import annotations

import concurrent.futures
import os
import signal
import time
from typing import Any

import httpx
import psycopg
import pytest

from factstream.db.engine import libpq_url
from tests.bundled.events.multiwriter import ALICE
from tests.bundled.events.test_multiwriter_processes import FILTER, Deployment, drained, get, messages
from tests.bundled.events.test_multiwriter_processes import deployment as deployment  # the fixture, TCP and Redis

pytestmark = pytest.mark.slow

ROUNDS = int(os.environ.get("FACTSTREAM_WAKEUP_ROUNDS", "3"))
#: Events ``w2`` writes while the worker is stopped, before ``w1``'s one event; then the tail.
BURST = 500
TAIL = 100
#: bob's rooms of ``w2`` the burst is spread over.
ROOMS = 2
#: The long poll open while the worker is stopped (woken by the backlog, not timed out).
OPEN_POLL_MS = 20_000
#: Each later long poll's timeout: short, so that a missed wake-up costs seconds, not minutes.
POLL_MS = 2_000


def send_burst(d: Deployment, rooms: list[str], prefix: str, count: int) -> list[str]:
    """``count`` messages of alice spread over ``rooms`` through ``w2``, 8 at a time; their event IDs."""
    with d.client("w2", ALICE) as http, concurrent.futures.ThreadPoolExecutor(8) as pool:

        def send(i: int) -> str:
            room = rooms[i % len(rooms)]
            body = {"msgtype": "m.text", "body": f"{prefix}-{i}"}
            response = http.put(f"/rooms/{room}/send/m.room.message/{prefix}-{i}", json=body)
            assert response.status_code == 200, response.text
            return str(response.json()["event_id"])

        return list(pool.map(send, range(count)))


def newest_of(d: Deployment, burst: list[str]) -> str:
    """The event of ``burst`` with the highest stream ordering (the one a limited timeline always shows)."""
    with psycopg.connect(libpq_url(d.cluster.database_url)) as conn:
        row = conn.execute(
            "SELECT event_id FROM events WHERE event_id = ANY(%s) ORDER BY stream_ordering DESC LIMIT 1", (burst,)
        ).fetchone()
    assert row is not None
    return str(row[0])


def wait_served(http: httpx.Client, since: str, event_id: str, timeout: float = 60.0) -> None:
    """Poll ``/events`` from ``since`` until it serves ``event_id`` (the newest of its room: on every page)."""
    deadline = time.monotonic() + timeout
    while event_id not in messages(get(http, "/events", **{"from": since, "limit": 100})):
        assert time.monotonic() < deadline, f"/events on the worker never served {event_id}"
        time.sleep(0.05)


def test_a_long_poll_wakes_for_both_writers_rows_after_a_backlog(deployment: Deployment) -> None:
    d = deployment
    owned = [d.rooms() for _ in range(ROOMS)]
    burst_rooms = [rooms["w2"] for rooms in owned]
    w1_room = owned[0]["w1"]
    worker = d.cluster.processes["worker1"]
    assert worker.popen is not None
    with (
        d.client("worker1") as http,
        d.client("worker1") as events_http,
        concurrent.futures.ThreadPoolExecutor(1) as pool,
    ):
        since = drained(http)
        for round_ in range(ROUNDS):
            events_since = get(events_http, "/events")["next"]
            poll = pool.submit(get, http, "/sync", since=since, filter=FILTER, timeout=OPEN_POLL_MS)
            time.sleep(0.3)
            os.kill(worker.popen.pid, signal.SIGSTOP)
            try:
                burst = send_burst(d, burst_rooms, f"r{round_}", BURST)
                other = d.send("w1", w1_room, f"w1-{round_}")
                burst += send_burst(d, burst_rooms, f"t{round_}", TAIL)
            finally:
                os.kill(worker.popen.pid, signal.SIGCONT)
            body: dict[str, Any] = poll.result(60)
            since = body["next_batch"]
            # Both are applied on the worker once /events there serves them.
            wanted = {newest_of(d, burst), other}
            for event_id in wanted:
                wait_served(events_http, events_since, event_id)
            wanted -= set(messages(body))
            for attempt in range(5):
                if not wanted:
                    break
                started = time.monotonic()
                body = get(http, "/sync", since=since, filter=FILTER, timeout=POLL_MS)
                since = body["next_batch"]
                got = messages(body)
                assert got, (
                    f"round {round_}: a long poll ended empty after {time.monotonic() - started:.1f} s while the "
                    f"worker serves {sorted(wanted)}, which bob never got (poll {attempt + 1})" + d.cluster.logs(15)
                )
                wanted -= set(got)
            assert not wanted, f"round {round_}: five polls never brought {sorted(wanted)}"
