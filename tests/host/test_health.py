"""``/health`` tells the truth: degraded, with a 503 and the reasons, when a replication link is down
past its grace period, a writer holds unfinished IDs that do not move, or the database is unreachable.

The acceptance tests run real ``factstream run`` processes (main and worker1 with the ``notes`` and
``probe`` test plugins, as in tests/replication/test_processes.py) and stop the main instance under a
running worker (TCP), or cut the worker's connection to Redis: the worker's ``/health``, ``/metrics``
and log follow. The reasons are also checked one by one on in-process hosts.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from factstream.host.health import DATABASE_UNREACHABLE, LINK_DOWN, WRITER_STALLED, check_health
from factstream.testing import TcpProxy, until, wait_until
from tests.replication.test_processes import Cluster, probe_cluster, start_pair

#: The grace period of the process tests: a link down longer than this makes the worker degraded.
GRACE = 1.5


# -- the reasons, one by one (in-process hosts) --------------------------------------------------------


async def test_a_single_instance_is_ok_and_says_so(inbox_cluster, client):
    main = await inbox_cluster("main")
    health = await check_health(main.parts, time.time())
    assert (health.status, health.reasons) == ("ok", [])

    response = await client(main).get("/health")
    assert response.status_code == 200
    body = response.json()
    assert (body["status"], body["reasons"], body["instance"]) == ("ok", [], "main")
    assert body["replication"]["links"] == []  # the main instance has no worker yet


async def test_a_link_down_past_its_grace_period_degrades_the_worker(inbox_cluster, client):
    main = await inbox_cluster("main")
    worker = await inbox_cluster("worker1", health={"link_grace_seconds": 5})
    await inbox_cluster.following(worker, "inbox")
    assert (await check_health(worker.parts, time.time())).status == "ok"

    await main.stop()
    assert worker.transport is not None
    await until(lambda: not worker.transport.links()[0].up, timeout=10)
    down_since = worker.transport.links()[0].since

    within = await check_health(worker.parts, down_since + 4.9)
    assert within.status == "ok", within  # a reconnection within the grace period is no problem
    past = await check_health(worker.parts, down_since + 5.1)
    assert past.status == "degraded"
    [reason] = past.reasons
    assert reason.code == LINK_DOWN
    assert reason.details == {"peer": "main", "transport": "tcp", "down_seconds": 5.1}

    response = await client(worker).get("/health")  # within the grace period of the real clock
    assert response.status_code == 200
    assert response.json()["replication"]["links"][0]["state"] == "down"


async def test_unfinished_ids_that_do_not_move_are_a_stalled_writer(inbox_cluster):
    main = await inbox_cluster("main", health={"writer_stall_seconds": 30})
    gen = main.id_generator("inbox")
    now = time.time()
    async with gen.get_next() as held:
        assert (await check_health(main.parts, now)).status == "ok"  # first seen now
        assert (await check_health(main.parts, now + 29)).status == "ok"
        stalled = await check_health(main.parts, now + 31)
        assert stalled.status == "degraded"
        [reason] = stalled.reasons
        assert reason.code == WRITER_STALLED
        assert reason.details["stream"] == "inbox"
        assert reason.details["oldest_unfinished"] == held
        assert reason.details["stalled_seconds"] == 31
    assert (await check_health(main.parts, now + 32)).status == "ok"  # finished: the position moves on


async def test_an_unreachable_database_degrades_the_instance_with_a_503(inbox_cluster, client):
    main = await inbox_cluster("main", health={"database_timeout_seconds": 1})
    assert main.db is not None
    await main.db.close()  # as if the database went away: the pool has no connection to give

    started = time.monotonic()
    health = await check_health(main.parts, time.time())
    assert time.monotonic() - started < 5
    assert health.status == "degraded"
    assert [r.code for r in health.reasons] == [DATABASE_UNREACHABLE]

    response = await client(main).get("/health")
    assert response.status_code == 503
    assert response.json()["status"] == "degraded"
    assert response.json()["reasons"][0]["code"] == DATABASE_UNREACHABLE
    lenient = await client(main).get("/health", params={"strict": "false"})
    assert lenient.status_code == 200
    assert lenient.json()["status"] == "degraded"


# -- acceptance: real processes ------------------------------------------------------------------------


class HealthCluster(Cluster):
    """The probe cluster of the replication process tests, with HTTP ports and a short grace period."""

    def __init__(self, workdir: Path, database_url: str, env: dict[str, str]) -> None:
        super().__init__(workdir, database_url, env)
        self.serve_http()
        self.configure(health={"link_grace_seconds": GRACE})

    def get(self, name: str, path: str, **params: str) -> httpx.Response:
        return httpx.get(f"{self.url(name)}{path}", params=params, timeout=5)

    def metric(self, name: str, metric: str, **labels: str) -> float | None:
        """One sample of process ``name``'s ``/metrics`` (None if it has none)."""
        text = self.get(name, "/metrics").text
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                if sample.name == metric and all(sample.labels.get(k) == v for k, v in labels.items()):
                    return float(sample.value)
        return None


@pytest.fixture
def cluster(plugin_installer, fresh_database, tmp_path) -> Iterator[HealthCluster]:
    yield from probe_cluster(HealthCluster, plugin_installer, fresh_database, tmp_path)


def watch_degrade(cluster: HealthCluster, cut_at: float) -> dict[str, Any]:
    """Poll the worker's ``/health`` until it answers 503; check that it did not before the grace
    period had passed since its link went down (every answer within it was 200)."""
    answers: list[tuple[float, int, dict[str, Any]]] = []

    def degraded() -> bool:
        response = cluster.get("worker1", "/health")
        answers.append((time.time(), response.status_code, response.json()))
        return response.status_code == 503

    wait_until(degraded, 20, "worker1's /health to turn degraded", interval=0.05, detail=cluster.logs)
    at, _, body = answers[-1]
    [link] = body["replication"]["links"]
    assert link["state"] == "down" and link["since"] >= cut_at - 1, link
    assert at - link["since"] >= GRACE, f"degraded {at - link['since']:.2f}s after the link went down"
    assert [r["code"] for r in body["reasons"]] == [LINK_DOWN], body
    assert body["reasons"][0]["details"]["down_seconds"] >= GRACE
    # Every answer given while the link was down for less than the grace period said ok (an answer got at
    # client time t was made no later than t). How many there were depends on the machine's load.
    for t, code, b in answers:
        if b["replication"]["links"][0]["state"] == "down" and t - link["since"] < GRACE:
            assert code == 200, f"degraded {t - link['since']:.2f}s after the link went down: {b}"
    assert cluster.get("worker1", "/health", strict="false").status_code == 200
    return body


def test_a_worker_is_degraded_while_its_main_is_stopped_and_ok_when_it_returns(cluster):
    config = cluster.config("main")
    main, worker = start_pair(cluster, config, config, slow=True)
    link = {"instance": "worker1", "peer": "main", "transport": "tcp"}
    assert cluster.get("worker1", "/health").status_code == 200
    assert cluster.metric("worker1", "factstream_replication_link_up", **link) == 1
    assert cluster.metric("worker1", "factstream_replication_disconnects_total", **link) == 0

    # Lag: the worker is made slow while main writes; it reports how far behind it is, then catches up.
    cluster.slow_file.write_text("50")
    written = cluster.write(300, rate=150)
    lag = {"instance": "worker1", "stream": "notes", "writer": "main"}
    wait_until(
        lambda: (
            (cluster.metric("worker1", "factstream_replication_lag_positions", **lag) or 0) > 0
            and (cluster.metric("worker1", "factstream_replication_lag_seconds", **lag) or 0) > 0
        ),
        30,
        "worker1 to report a lag behind main",
        interval=0.1,
        detail=cluster.logs,
    )
    cluster.wait_ack(written)
    cluster.slow_file.unlink()
    cluster.wait_until_worker_has_everything(settle=0)
    newest = max(t for t, _, _ in cluster.notes_in_database())
    wait_until(
        lambda: cluster.metric("worker1", "factstream_replication_lag_positions", **lag) == 0,
        10,
        "the lag to return to 0",
    )
    assert cluster.metric("worker1", "factstream_replication_lag_seconds", **lag) == 0
    assert cluster.metric("worker1", "factstream_replication_writer_position", **lag) == newest

    # The main instance stops: degraded after the grace period, not before (watched while it stops).
    cut_at = time.time()
    assert main.popen is not None
    main.popen.send_signal(signal.SIGTERM)
    watch_degrade(cluster, cut_at)
    assert main.popen.wait(15) == 0
    assert cluster.metric("worker1", "factstream_replication_link_up", **link) == 0
    assert cluster.metric("worker1", "factstream_health_degraded", instance="worker1") == 1
    assert cluster.metric("worker1", "factstream_health_reason", instance="worker1", code=LINK_DOWN) == 1

    # It returns: ok again, the reconnection counted.
    main.start()
    main.wait_started()
    wait_until(lambda: cluster.get("worker1", "/health").status_code == 200, 30, "worker1 to be ok again")
    assert cluster.metric("worker1", "factstream_replication_link_up", **link) == 1
    assert cluster.metric("worker1", "factstream_replication_disconnects_total", **link) == 1
    assert cluster.metric("worker1", "factstream_replication_connects_total", **link) == 2
    assert cluster.metric("worker1", "factstream_health_degraded", instance="worker1") == 0
    cluster.write_and_wait(20)
    cluster.wait_until_worker_has_everything(settle=0)

    log = worker.log()
    assert log.count("replication link up") == 2, worker.tail()
    assert log.count("replication link down") == 1, worker.tail()
    # Reconnection attempts: the first failure at INFO, the others quiet until one succeeds.
    assert log.count("replication reconnect failed") == 1, worker.tail()


def test_a_worker_is_degraded_while_its_redis_link_is_cut_and_ok_when_it_returns(redis_server, cluster):
    proxy = TcpProxy(redis_server.port)
    proxy.start()
    cluster.cleanups.append(proxy.close)
    main_config = cluster.config("main", redis_url=redis_server.url)
    peer = f"redis://127.0.0.1:{proxy.port}/0"
    worker_config = cluster.config("worker1", redis_url=peer)
    _main, worker = start_pair(cluster, main_config, worker_config)
    link = {"instance": "worker1", "peer": peer, "transport": "redis"}
    assert cluster.get("worker1", "/health").status_code == 200
    assert cluster.metric("worker1", "factstream_replication_link_up", **link) == 1

    # Rows written while the worker's Redis link is cut reach it by catching up from the database.
    proxy.refuse()
    cut_at = time.time()
    assert proxy.drop() >= 1
    watch_degrade(cluster, cut_at)
    cluster.write_and_wait(300)
    assert cluster.metric("worker1", "factstream_replication_link_up", **link) == 0

    proxy.accept()
    wait_until(lambda: cluster.get("worker1", "/health").status_code == 200, 30, "worker1 to be ok again")
    cluster.wait_until_worker_has_everything(settle=0)
    assert cluster.metric("worker1", "factstream_replication_link_up", **link) == 1
    assert cluster.metric("worker1", "factstream_replication_disconnects_total", **link) == 1
    assert cluster.metric("worker1", "factstream_replication_connects_total", **link) == 2
    lag = {"instance": "worker1", "stream": "notes", "writer": "main"}
    assert cluster.metric("worker1", "factstream_replication_lag_positions", **lag) == 0
    catchup = {"instance": "worker1", "stream": "notes"}
    assert (cluster.metric("worker1", "factstream_replication_catchup_rows_total", **catchup) or 0) >= 300

    log = worker.log()
    assert log.count("replication link up") == 2, worker.tail()
    assert log.count("replication link down") == 1, worker.tail()
    # One line for each of the two connections (subscribed, publishing), however many attempts failed.
    assert 1 <= log.count("replication reconnect failed") <= 2, worker.tail()
    assert "catch-up begun" in log and "catch-up finished" in log, worker.tail()
