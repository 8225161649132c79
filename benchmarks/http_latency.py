"""Whole-request latency of small HTTP answers on kept-alive connections, against plain Starlette.

A real host (``factstream run``, a process of its own, the bundled plugins, an events writer) is
driven over loopback sockets by a client that keeps one connection alive, as every real client does,
and sends one request at a time. The routes are small answers: ``GET /health``, an empty
``GET /events`` (nothing new since the caller's token), a ``GET /rooms/{id}/messages`` page of 20 and
a local send (``PUT /rooms/{id}/send/m.room.message/{txn}``, a new transaction each time).

The baseline, measured in the same run, is a plain Starlette app on uvicorn (its own process, the same
HTTP implementation, h11) answering the same routes with bodies of the same sizes, precomputed: what
the web stack alone costs. ``speed`` is the baseline's latency over the host's (1.0x: as fast as the
bare stack; the target is at least 0.8x at p50), and the whole request's p99 should stay under 5 ms.
The host's CPU per request comes from its process's ``/proc`` times (user + system), so it does not
depend on the other processes sharing the machine.

A Nagle stall (a response head and body written separately, the body waiting for the client's delayed
ACK) shows here as ~40 ms answers: fresh connections, as ``curl`` makes, never show it.

Alone: ``uv run python benchmarks/run.py --only http``.
"""

from __future__ import annotations

import http.client
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

TOKENS = {"tok-alice": {"user": "@alice:bench"}}
HEADERS = {"Authorization": "Bearer tok-alice", "Content-Type": "application/json"}
#: Messages in the room before measuring, so that a /messages page is full.
MESSAGES = 40


class Client:
    """One kept-alive HTTP/1.1 connection, a request at a time (``http.client`` sends a request's head
    and body in one write)."""

    def __init__(self, port: int) -> None:
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)

    def call(self, method: str, path: str, body: Any = None) -> tuple[int, bytes]:
        payload = None if body is None else json.dumps(body).encode()
        self.conn.request(method, path, body=payload, headers=HEADERS)
        response = self.conn.getresponse()
        data = response.read()
        return response.status, data

    def close(self) -> None:
        self.conn.close()


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _wait_port(port: int, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
            conn.request("GET", "/health")
            conn.getresponse().read()
            conn.close()
            return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"nothing answered on port {port} within {timeout:g}s")


def _requests(room_id: str, since: str) -> dict[str, tuple[str, str, Any]]:
    """Per measured route: method, path (``{txn}`` filled per request) and body."""
    return {
        "/health": ("GET", "/health", None),
        "empty /events": ("GET", f"/events?from={since}", None),
        "/messages page of 20": ("GET", f"/rooms/{room_id}/messages?dir=b&limit=20", None),
        "local send": ("PUT", f"/rooms/{room_id}/send/m.room.message/{{txn}}", {"msgtype": "m.text", "body": "hi"}),
    }


def _measure(client: Client, method: str, path: str, body: Any, seconds: float, pid: int | None) -> dict[str, Any]:
    latencies: list[float] = []
    cpu0 = _cpu_seconds(pid) if pid else 0.0
    size = 0
    end = time.perf_counter() + seconds
    while time.perf_counter() < end or len(latencies) < 50:
        target = path.replace("{txn}", uuid.uuid4().hex)
        started = time.perf_counter()
        status, data = client.call(method, target, body)
        latencies.append((time.perf_counter() - started) * 1000)
        if status != 200:
            raise RuntimeError(f"{method} {target} answered {status}: {data[:200]!r}")
        size = len(data)
    cpu = (_cpu_seconds(pid) - cpu0) if pid else 0.0
    latencies.sort()
    return {
        "n": len(latencies),
        "p50": statistics.median(latencies),
        "p99": latencies[min(len(latencies) - 1, int(len(latencies) * 0.99))],
        "cpu_ms": cpu * 1000 / len(latencies),
        "size": size,
    }


def _start_host(url: str, workdir: Path) -> tuple[Any, int]:
    from factstream.testing import free_port
    from factstream.testing.processes import ProcessCluster

    cluster = ProcessCluster(workdir, url, dict(os.environ), instances=("main",))
    port = free_port()
    cluster.configure(http={"tokens": TOKENS, "port": port})
    cluster.migrated = True  # run.py migrated the database
    cluster.start("main")
    _wait_port(port)
    return cluster, port


def _prepare(port: int) -> tuple[str, str]:
    client = Client(port)
    status, data = client.call("POST", "/createRoom", {"name": "bench"})
    assert status == 200, data
    room_id = json.loads(data)["room_id"]
    for i in range(MESSAGES):
        client.call("PUT", f"/rooms/{room_id}/send/m.room.message/prep{i}", {"msgtype": "m.text", "body": f"m{i}"})
    status, data = client.call("GET", "/events")
    since = json.loads(data)["next"]
    client.close()
    return room_id, since


def _baseline(port: int, sizes: dict[str, int], requests: dict[str, tuple[str, str, Any]]) -> subprocess.Popen[bytes]:
    spec = {name: [method, path, sizes[name]] for name, (method, path, _) in requests.items()}
    return subprocess.Popen(
        [sys.executable, __file__, "--baseline", str(port), json.dumps(spec)],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )


def _serve_baseline(port: int, spec: dict[str, list[Any]]) -> None:
    """A plain Starlette app answering each route with a JSON body of the host's size."""
    import uvicorn
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import Response
    from starlette.routing import Route

    def body_of(size: int) -> bytes:
        filler = max(0, size - len(b'{"x":""}'))
        return b'{"x":"' + b"a" * filler + b'"}'

    routes = []
    for method, path, size in spec.values():
        payload = body_of(size)

        async def answer(request: Request, payload: bytes = payload) -> Response:
            await request.body()
            return Response(payload, media_type="application/json")

        route_path = path.split("?")[0].replace("{txn}", "{txn_id}")
        routes.append(Route(route_path, answer, methods=[method]))
    app = Starlette(routes=routes)
    uvicorn.run(app, host="127.0.0.1", port=port, http="h11", log_level="warning", access_log=False, lifespan="off")


def run(url: str, seconds: float = 3.0) -> list[str]:
    """Measure the host and the baseline, ``seconds`` per route each; returns report lines."""
    from factstream.testing import free_port

    workdir = Path(tempfile.mkdtemp(prefix="factstream-bench-http-"))
    cluster, port = _start_host(url, workdir)
    baseline_proc = None
    lines = []
    try:
        host_pid = cluster.processes["main"].popen.pid
        room_id, since = _prepare(port)
        requests = _requests(room_id, since)
        host_client = Client(port)
        ours = {name: _measure(host_client, *req, seconds, host_pid) for name, req in requests.items()}
        host_client.close()
        base_port = free_port()
        baseline_proc = _baseline(base_port, {name: r["size"] for name, r in ours.items()}, requests)
        _wait_port(base_port)
        base_client = Client(base_port)
        theirs = {name: _measure(base_client, *req, seconds, baseline_proc.pid) for name, req in requests.items()}
        base_client.close()
        for name, r in ours.items():
            b = theirs[name]
            verdict = "ok" if r["p99"] <= 5.0 and b["p50"] / r["p50"] >= 0.8 else "MISSED"
            lines.append(
                f"{name} ({r['size']:,} B, {r['n']:,} requests): host p50 {r['p50']:.2f} ms, p99 {r['p99']:.2f} ms, "
                f"{r['cpu_ms']:.2f} ms CPU/request; Starlette p50 {b['p50']:.2f} ms, p99 {b['p99']:.2f} ms, "
                f"{b['cpu_ms']:.2f} ms CPU/request; speed {b['p50'] / r['p50']:.2f}x at p50, "
                f"{b['p99'] / r['p99']:.2f}x at p99 (targets >= 0.8x, p99 <= 5 ms: {verdict})"
            )
    finally:
        if baseline_proc is not None:
            baseline_proc.terminate()
            baseline_proc.wait(10)
        cluster.stop_all()
    return lines


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == "--baseline":
        _serve_baseline(int(sys.argv[2]), json.loads(sys.argv[3]))
    else:
        print("run it through benchmarks/run.py --only http", file=sys.stderr)
        sys.exit(2)
