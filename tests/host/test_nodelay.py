"""Every HTTP connection a host accepts has TCP_NODELAY set, whatever listener accepted it.

Without it, a response under ~64 KB on a kept-alive connection leaves as two writes (uvicorn's head,
then the body) and the body waits up to 40 ms for the client's delayed acknowledgement of the head.
The option is read from the server's side of each accepted connection: the host's own IPv4 and IPv6
listeners, and a listening socket handed in that was made without ``IPPROTO_TCP`` (asyncio sets the
option by itself only on sockets whose ``proto`` is ``IPPROTO_TCP``). The replication and Redis links
are checked in ``tests/replication/test_nodelay.py``.
"""

from __future__ import annotations

import asyncio
import os
import socket

import pytest
from starlette.applications import Starlette
from starlette.responses import PlainTextResponse
from starlette.routing import Route

from factstream.host.server import HttpServer
from factstream.sockets import nodelay
from factstream.testing import free_port
from tests.host.conftest import TOKENS


def _ipv6_loopback() -> bool:
    try:
        with socket.socket(socket.AF_INET6, socket.SOCK_STREAM) as s:
            s.bind(("::1", 0))
    except OSError:
        return False
    return True


async def _keep_alive_requests(
    host: str, port: int, count: int = 3
) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    """Open one kept-alive connection and answer ``count`` GET /health on it; returns the open connection."""
    reader, writer = await asyncio.open_connection(host, port)
    for _ in range(count):
        writer.write(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
        await writer.drain()
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
        length = next(
            int(line.split(b":")[1]) for line in head.split(b"\r\n") if line.lower().startswith(b"content-length")
        )
        await reader.readexactly(length)
        assert head.startswith(b"HTTP/1.1 200"), head
    return reader, writer


async def _server_side_nodelay(server: HttpServer, host: str, port: int) -> list[bool]:
    _, writer = await _keep_alive_requests(host, port)
    try:
        sockets = server.connection_sockets()
        assert sockets, "the server holds no open connection"
        return [nodelay(s) for s in sockets]
    finally:
        writer.close()


@pytest.mark.parametrize("bind", ["127.0.0.1", "::1"])
async def test_a_running_host_sets_nodelay_on_every_accepted_connection(host_cluster, bind):
    if bind == "::1" and not _ipv6_loopback():
        pytest.skip("this machine has no IPv6 loopback")
    host_cluster.configure(instances=("main",))
    host = await host_cluster("main", http={"tokens": TOKENS, "bind": bind, "port": free_port()})
    assert host.http is not None
    assert await _server_side_nodelay(host.http, bind, host.http.port) == [True]


async def _health(request: object) -> PlainTextResponse:
    return PlainTextResponse("ok")


async def test_a_listening_socket_handed_in_without_ipproto_tcp_gets_nodelay_connections():
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)  # proto 0: asyncio would not set the option
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    assert sock.proto == 0
    server = HttpServer(Starlette(routes=[Route("/health", _health)]), "", 0, sock=sock)
    await server.start()
    try:
        assert server.url == f"http://127.0.0.1:{server.port}"
        assert await _server_side_nodelay(server, "127.0.0.1", server.port) == [True]
    finally:
        await server.close()


async def test_the_hosts_postgresql_connections_have_nodelay(host_cluster):
    """libpq sets TCP_NODELAY on its TCP connections itself: checked, not assumed (a Unix socket, the
    embedded server's, has no Nagle to turn off)."""
    host_cluster.configure(instances=("main",))
    host = await host_cluster("main")
    async with host.database().pool.connection() as conn:
        fd = conn.pgconn.socket
        with socket.socket(fileno=os.dup(fd)) as sock:
            if sock.family not in (socket.AF_INET, socket.AF_INET6):
                pytest.skip("the test database is reached over a Unix socket")
            assert nodelay(sock)
