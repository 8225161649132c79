"""The HTTP API between real processes: ``factstream run --instance main|worker1 --http-port N``.

Acceptance of the /sync issue: a client long-polling on the worker wakes within one replication round
trip of a write on the main instance and gets exactly the new rows; its ``next_batch`` then returns
nothing new until the next write; tokens minted by one instance work on the other.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx
import pytest

from factstream.testing import ProcessCluster, free_port, until
from tests.host.conftest import INBOX_PROJECT, TOKENS

pytestmark = pytest.mark.slow


class Cluster:
    """main (HTTP port from instance_map) and worker1 (``--http-port``, the CLI override) as processes."""

    def __init__(self, processes: ProcessCluster) -> None:
        self.processes = processes
        processes.env["FACTSTREAM_LOAD_PLUGINS"] = "inbox"
        processes.configure(stream_writers={"inbox": ["main"]}, http={"tokens": TOKENS})
        processes.serve_http("main")
        # worker1's port comes from --http-port (the CLI override), not from the instance_map
        processes.http_ports["worker1"] = free_port()

    def start(self, name: str) -> None:
        args = ["--http-port", str(self.processes.http_ports[name])] if name == "worker1" else []
        self.processes.start(name, args=args, wait=False)

    def url(self, name: str) -> str:
        return self.processes.url(name)

    def logs(self) -> str:
        return self.processes.logs(lines=4000)

    async def wait_healthy(self, name: str, *, connected: bool) -> None:
        proc = self.processes.processes[name]
        async with httpx.AsyncClient(base_url=self.url(name), timeout=2) as http:

            async def healthy() -> bool:
                if not proc.running:
                    raise AssertionError(f"{name} exited with {proc.popen and proc.popen.returncode}\n{self.logs()}")
                try:
                    health = (await http.get("/health")).json()
                except httpx.HTTPError:
                    return False
                return not connected or bool(health["replication"]["connected"])

            await until(healthy, START_TIMEOUT, f"{name} to become healthy", interval=0.1, detail=self.logs)


START_TIMEOUT = 30.0


@pytest.fixture
async def cluster(plugin_installer, process_cluster) -> Cluster:
    plugin_installer.from_project(INBOX_PROJECT)
    cluster = Cluster(process_cluster)
    cluster.start("main")
    await cluster.wait_healthy("main", connected=False)
    cluster.start("worker1")
    await cluster.wait_healthy("worker1", connected=True)
    return cluster


def items(response: httpx.Response) -> list[dict[str, Any]]:
    assert response.status_code == 200, response.text
    return list(response.json()["streams"].get("inbox", []))


@pytest.mark.serial  # asserts a time bound: run alone
async def test_a_worker_long_poll_wakes_on_a_write_on_main_with_exactly_the_new_rows(cluster):
    auth = {"Authorization": "Bearer alice-token"}
    writer = httpx.AsyncClient(
        base_url=cluster.url("main"), headers={"Authorization": "Bearer writer-token"}, timeout=10
    )
    main = httpx.AsyncClient(base_url=cluster.url("main"), headers=auth, timeout=30)
    worker = httpx.AsyncClient(base_url=cluster.url("worker1"), headers=auth, timeout=30)
    async with writer, main, worker:

        async def write(*messages: tuple[str, str]) -> list[int]:
            response = await writer.post("/inbox/messages", json=[{"user_id": u, "body": b} for u, b in messages])
            assert response.status_code == 200, response.text
            return list(response.json()["stream_ids"])

        await write(("@alice:hs", "first"), ("@bob:hs", "bob's"))
        # The worker sees the first message once it has replicated it.
        deadline = time.monotonic() + 10
        while not (initial := items(await worker.get("/sync"))):
            assert time.monotonic() < deadline, cluster.logs()
            await asyncio.sleep(0.05)
        assert [i["body"] for i in initial] == ["first"]
        since = (await worker.get("/sync")).json()["next_batch"]

        latencies = []
        for round_ in range(5):
            poll = asyncio.ensure_future(worker.get("/sync", params={"since": since, "timeout": 20000}))
            await asyncio.sleep(0.3)
            assert not poll.done(), poll.result().text
            written = time.monotonic()
            ids = await write(("@bob:hs", f"b{round_}"), ("@alice:hs", f"a{round_}"))
            response = await asyncio.wait_for(poll, 10)
            latencies.append(time.monotonic() - written)
            got = items(response)
            assert [(i["stream_id"], i["body"], i["user_id"]) for i in got] == [(ids[1], f"a{round_}", "@alice:hs")]
            since = response.json()["next_batch"]
            # Nothing new until the next write.
            quiet = await worker.get("/sync", params={"since": since, "timeout": 300})
            assert quiet.json() == {"next_batch": since, "streams": {}}
        # One replication round trip (plus the write's own HTTP call): well under a second here.
        assert max(latencies) < 1.0, latencies

        # Tokens cross instances both ways.
        from_main = (await main.get("/sync")).json()["next_batch"]
        assert from_main == since
        on_main = await main.get("/sync", params={"since": since, "timeout": 200})
        assert on_main.json() == {"next_batch": since, "streams": {}}
        poll = asyncio.ensure_future(main.get("/sync", params={"since": since, "timeout": 10000}))
        await asyncio.sleep(0.2)
        await write(("@alice:hs", "on main"))
        response = await asyncio.wait_for(poll, 5)
        assert [i["body"] for i in items(response)] == ["on main"]
        main_token = response.json()["next_batch"]
        on_worker = await worker.get("/sync", params={"since": main_token, "timeout": 1000})
        assert on_worker.status_code == 200
        assert items(on_worker) == []
        assert on_worker.json()["next_batch"] == main_token

        # The other endpoints answer on both instances.
        for http in (main, worker):
            positions = (await http.get("/streams/inbox/positions")).json()
            assert positions["current_token"] == int(main_token)
        assert (await worker.get("/health")).json()["replication"]["connected"] is True


async def test_a_running_host_keeps_its_start_up_heap_out_of_garbage_collection(cluster):
    """`factstream run` freezes what it holds after start-up, so full collections skip it (the
    metric reads the interpreter's own count: nothing frozen, it reads 0)."""
    for name in ("main", "worker1"):
        async with httpx.AsyncClient(base_url=cluster.url(name), timeout=10) as http:
            text = (await http.get("/metrics")).text
        metric = "factstream_gc_frozen_objects "
        values = [float(line.split()[-1]) for line in text.splitlines() if line.startswith(metric)]
        assert len(values) == 1, text[:2000]
        # A started host holds tens of thousands of long-lived objects (modules, the web app, plugins).
        assert values[0] > 10_000, (name, values)
