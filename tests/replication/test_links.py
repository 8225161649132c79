"""Replication links as an operator sees them: state and counters per link, lag per writer, the metrics.

In-process hosts (``host_cluster``, notes written by main) over TCP and Redis; the lag's clock
arithmetic also directly on :class:`LagTracker` with a writer clock minutes off.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable
from typing import Any

import pytest
from prometheus_client import REGISTRY, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from factstream.host.app import Host
from factstream.replication.links import LagTracker, LinkStats, StreamLag
from factstream.replication.resp import RedisAddress
from factstream.testing import TcpProxy, until
from tests.replication.test_replication import append_notes


@pytest.fixture(params=["tcp", "redis"])
def transport(request):
    if request.param == "redis":
        request.getfixturevalue("redis_url")  # skipped (or failed) here when Redis is not usable
    return request.param


def scraped(name: str, **labels: str) -> float | None:
    """The value of one sample of this process's ``/metrics`` (None if there is none)."""
    for family in text_string_to_metric_families(generate_latest(REGISTRY).decode()):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                return float(sample.value)
    return None


def outbound(host: Host) -> LinkStats:
    assert host.transport is not None
    links = [link for link in host.transport.links() if link.direction == "outbound"]
    assert len(links) == 1, links
    return links[0]


# -- links ---------------------------------------------------------------------------------------------


async def test_a_workers_link_counts_what_crosses_it_and_its_reconnects(host_cluster, transport):
    host_cluster.configure(transport=transport)
    main = await host_cluster("main")
    overrides: dict[str, Any] = {}
    proxy = None
    if transport == "redis":  # the worker reaches Redis through a proxy the test can cut
        proxy = TcpProxy(RedisAddress.from_url(host_cluster.redis_url).port)
        proxy.start()
        overrides["redis"] = {"url": f"redis://127.0.0.1:{proxy.port}/0"}
    try:
        worker = await host_cluster("worker1", **overrides)
        await host_cluster.following(worker, "notes")
        link = outbound(worker)
        assert link.up and link.connects == 1 and link.disconnects == 0
        assert link.transport == transport
        assert link.peer == ("main" if transport == "tcp" else f"redis://127.0.0.1:{proxy.port}/0")  # type: ignore[union-attr]

        ids = await append_notes(main, 40)
        assert await worker.wait_for_stream_position("main", "notes", ids[-1], timeout=10)
        await until(lambda: outbound(worker).rows_received >= 40)
        assert link.commands_received >= 40 and link.bytes_received > 40 * 20
        assert link.commands_sent >= 2 and link.bytes_sent > 0  # NAME/PING/REPLICATE, or REPLICATE/FS_MULTILINE
        if transport == "tcp":
            assert main.transport is not None
            inbound = [s for s in main.transport.links() if s.peer == "worker1"]
            assert len(inbound) == 1 and inbound[0].direction == "inbound" and inbound[0].up
            assert inbound[0].rows_sent >= 40
        else:
            assert outbound(main).rows_sent >= 40

        # The link drops: counted once, down, then up again on the same LinkStats.
        if proxy is None:
            assert main.transport is not None
            for conn in list(main.transport.endpoint.connections):  # type: ignore[union-attr]
                conn.close("test: dropped")
        else:
            assert proxy.drop() >= 1
        await until(lambda: link.disconnects == 1, timeout=10)
        await until(lambda: link.up and link.connects == 2, timeout=15)
        assert outbound(worker) is link
        ids = await append_notes(main, 5)
        assert await worker.wait_for_stream_position("main", "notes", ids[-1], timeout=10)
        assert link.as_json()["state"] == "up"
    finally:
        if proxy is not None:
            proxy.close()


async def test_the_main_keeps_a_closed_inbound_link_for_a_while(host_cluster):
    main = await host_cluster("main")
    worker = await host_cluster("worker1")
    await host_cluster.following(worker, "notes")
    await worker.stop()

    assert main.transport is not None
    await until(lambda: any(not s.up for s in main.transport.links() if s.peer == "worker1"), timeout=10)
    closed = [s for s in main.transport.links() if s.peer == "worker1"]
    assert len(closed) == 1 and closed[0].disconnects == 1 and closed[0].direction == "inbound"


async def test_link_metrics_are_exported_per_instance_peer_and_transport(host_cluster):
    main = await host_cluster("main")
    worker = await host_cluster("worker1")
    await host_cluster.following(worker, "notes")
    ids = await append_notes(main, 10)
    assert await worker.wait_for_stream_position("main", "notes", ids[-1], timeout=10)
    await until(lambda: outbound(worker).rows_received >= 10)

    labels = {"instance": "worker1", "peer": "main", "transport": "tcp"}
    assert scraped("factstream_replication_link_up", **labels) == 1
    assert scraped("factstream_replication_connects_total", **labels) == 1
    assert scraped("factstream_replication_disconnects_total", **labels) == 0
    assert (scraped("factstream_replication_rows_received_total", **labels) or 0) >= 10
    assert (scraped("factstream_replication_bytes_received_total", **labels) or 0) > 0
    assert (scraped("factstream_replication_rows_sent_total", instance="main", peer="worker1") or 0) >= 10
    lag = {"instance": "worker1", "stream": "notes", "writer": "main"}
    assert scraped("factstream_replication_writer_position", **lag) == ids[-1]
    assert scraped("factstream_replication_lag_positions", **lag) == 0
    assert scraped("factstream_replication_lag_seconds", **lag) == 0


# -- lag -----------------------------------------------------------------------------------------------


class GatedSink:
    """The worker's pipeline behind a gate: rows wait until the test opens it (a reader that is behind)."""

    def __init__(self, sink: Any) -> None:
        self.sink = sink
        self.gate = asyncio.Event()

    async def _after_gate(self, waiting: Awaitable[None] | None) -> None:
        await self.gate.wait()
        if waiting is not None:
            await waiting

    def rows(self, stream: Any, instance: str, token: int, rows: list[Any]) -> Awaitable[None]:
        return self._after_gate(self.sink.rows(stream, instance, token, rows))

    def run(self, stream: Any, instance: str, tokens: list[int], rows: list[Any]) -> Awaitable[None]:
        return self._after_gate(self.sink.run(stream, instance, tokens, rows))

    def advanced(self, stream: Any, instance: str, token: int) -> None:
        self.sink.advanced(stream, instance, token)


@pytest.mark.parametrize("skew", [300.0, -300.0], ids=["writer-5min-ahead", "writer-5min-behind"])
async def test_lag_in_seconds_stays_right_when_the_writers_clock_is_minutes_off(host_cluster, skew):
    main = await host_cluster("main")
    assert main.streamer is not None
    main.streamer.clock = lambda: time.time() + skew  # every POSITION main sends is stamped minutes off
    worker = await host_cluster("worker1")
    await host_cluster.following(worker, "notes")
    assert worker.handler is not None
    assert worker.handler.lag._offsets.get("main") is not None, "main's POSITIONs should carry its clock"

    # Cut the worker off, write, and let it reconnect behind a closed gate: main's stamped POSITION
    # announces rows the worker cannot apply yet.
    await worker.disconnect_replication()
    ids = await append_notes(main, 5)
    gated = GatedSink(worker.handler.sink)
    worker.handler.sink = gated
    await worker.connect_replication()

    def notes_lag() -> StreamLag:
        assert worker.handler is not None
        return next(lag for lag in worker.handler.lags() if lag.stream == "notes")

    await until(lambda: notes_lag().lag_positions == 5, timeout=10, detail=lambda: f"{notes_lag()} {ids}")
    await asyncio.sleep(1.0)

    lag = notes_lag()
    assert (lag.stream, lag.writer, lag.writer_position) == ("notes", "main", ids[-1])
    assert lag.applied_position == ids[0] - 1
    assert 0.9 <= lag.lag_seconds < 10, lag  # about a second: not the five minutes of skew
    gated.gate.set()
    assert await worker.wait_for_stream_position("main", "notes", ids[-1], timeout=10)
    lag = notes_lag()
    assert (lag.lag_positions, lag.lag_seconds) == (0, 0.0)


def test_the_tracker_relates_a_skewed_writer_clock_through_the_smallest_offset():
    now = [1000.0]  # this process's monotonic clock
    applied = {"w": 0}
    tracker = LagTracker(lambda stream, writer: applied[writer], clock=lambda: now[0])
    writer_clock = 1_800_000_000.0 + 240.0  # the writer's wall clock, whatever it is
    # Samples: the writer stamps, the POSITION arrives 20 ms, then 5 ms, then 50 ms later.
    for token, trip in ((1, 0.020), (2, 0.005), (3, 0.050)):
        now[0] += 1.0
        writer_clock += 1.0
        applied["w"] = token - 1
        tracker.heard_token("s", "w", token, int((writer_clock - trip) * 1000))
    # Token 3 was stamped 50 ms before it arrived; its trip beyond the quickest (5 ms) is lag already.
    lag = tracker.lag("s", "w", applied=2)
    assert lag.lag_positions == 1
    assert lag.lag_seconds == pytest.approx(0.045, abs=0.002)
    now[0] += 2.0
    assert tracker.lag("s", "w", applied=2).lag_seconds == pytest.approx(2.045, abs=0.002)
    assert tracker.lag("s", "w", applied=3) == tracker.lag("s", "w", applied=3)
    assert tracker.lag("s", "w", applied=3).lag_seconds == 0.0


def test_unstamped_positions_and_rows_age_from_when_they_were_heard():
    now = [50.0]
    tracker = LagTracker(lambda stream, writer: 0, clock=lambda: now[0])
    tracker.heard_token("s", "w", 7)
    now[0] += 0.5
    tracker.heard_token("s", "w", 9)
    now[0] += 1.0
    assert tracker.lag("s", "w", applied=0).lag_seconds == pytest.approx(1.5)
    assert tracker.lag("s", "w", applied=7).lag_seconds == pytest.approx(1.0)
    assert tracker.lag("s", "w", applied=7).lag_positions == 2


# -- stamps only for peers that read them --------------------------------------------------------------


@pytest.mark.parametrize(("ping", "fields"), [("PING 1490197665618", 5), ("PING 1490197665618 stamps", 6)])
async def test_positions_carry_the_clock_stamp_only_to_peers_that_said_they_read_it(host_cluster, ping, fields):
    main = await host_cluster("main")
    await append_notes(main, 2)
    port = main.transport.endpoint.port  # type: ignore[union-attr]

    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(f"NAME worker1\n{ping}\nREPLICATE\n".encode())
    await writer.drain()
    position = ""
    async with asyncio.timeout(10):
        while not position.startswith("POSITION notes main"):
            position = (await reader.readline()).decode().strip()
    writer.close()

    assert len(position.split(" ")) == fields, position  # a reference peer gets the reference's line
