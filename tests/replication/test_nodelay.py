"""TCP_NODELAY on both ends of a replication TCP link, on the Redis client's socket and on the test
harness's proxy: a small command must never wait for the peer's delayed acknowledgement (see
``factstream.sockets``). The option is read from each end's own socket."""

from __future__ import annotations

import asyncio
import socket

from factstream.replication.resp import RedisAddress, RespClient
from factstream.replication.tcp import TcpClient, TcpServer
from factstream.replication.tcp_connection import CLOSE_TIMEOUT, WRITE_CHUNK
from factstream.sockets import nodelay, set_nodelay
from factstream.testing.helpers import until
from factstream.testing.processes import TcpProxy


async def test_both_ends_of_a_replication_tcp_link_set_nodelay(host_cluster):
    main = await host_cluster("main")
    worker = await host_cluster("worker1")
    await host_cluster.following(worker, "notes")
    server, client = main.transport.endpoint, worker.transport.endpoint
    assert isinstance(server, TcpServer) and isinstance(client, TcpClient)
    assert client.connection is not None
    assert nodelay(client.connection.writer.transport)
    assert [nodelay(c.writer.transport) for c in server.connections] == [True]


async def test_the_redis_client_sets_nodelay(redis_url):
    client = await RespClient.open(RedisAddress.from_url(redis_url))
    try:
        assert nodelay(client.transport)
        assert await client.command("PING") in (b"PONG", "PONG")
    finally:
        client.close()


async def test_the_test_proxy_sets_nodelay_on_both_of_its_connections():
    backend_sockets: list[socket.socket] = []

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        backend_sockets.append(writer.transport.get_extra_info("socket"))
        await reader.read()

    backend = await asyncio.start_server(serve, "127.0.0.1", 0)
    proxy = TcpProxy(backend.sockets[0].getsockname()[1])
    proxy.start()
    try:
        _, writer = await asyncio.open_connection("127.0.0.1", proxy.port)
        for _ in range(500):
            if backend_sockets and proxy.connections():
                break
            await asyncio.sleep(0.01)
        assert proxy.nodelay() == [True, True]  # the accepted side and the side to the target
        writer.close()
    finally:
        proxy.close()
        backend.close()


def test_set_nodelay_leaves_other_sockets_alone(tmp_path):
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as unix:
        assert set_nodelay(unix) is False
        assert nodelay(unix) is False
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as udp:
        assert set_nodelay(udp) is False
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as tcp:
        assert nodelay(tcp) is False
        assert set_nodelay(tcp) is True
        assert nodelay(tcp) is True


async def test_main_stops_in_bounded_time_beside_a_peer_that_stopped_reading(host_cluster):
    """A peer that asked for rows and never reads them leaves the server's buffer full: closing must
    drop the connection after ``CLOSE_TIMEOUT`` rather than wait for the buffer to drain for ever."""
    main = await host_cluster("main")
    _reader, writer = await asyncio.open_connection("127.0.0.1", main.transport.endpoint.port)
    writer.transport.get_extra_info("socket").setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    writer.write(b"NAME stalled\nREPLICATE\n")
    await writer.drain()
    # far more than the socket buffers hold (about 4 MB), in a few statements: one transaction per
    # fact took a minute of the suite, for the same rows
    gen = main.id_generator("notes")
    async with main.database().transaction() as txn:
        for start in range(0, 20_000, 1_000):
            notes = [{"author": f"{'x' * 200}{i}", "body": "x"} for i in range(start, start + 1_000)]
            await gen.append_many_txn(txn, "notes", notes)
    server = main.transport.endpoint
    assert isinstance(server, TcpServer)

    def stuck() -> bool:
        """The stalled peer's connection holds what it cannot send (or overflowed and is closing)."""
        conn = next((c for c in server.connections if c.peer == "stalled"), None)
        return conn is not None and (conn.closed or conn.writer.transport.get_write_buffer_size() >= WRITE_CHUNK)

    await until(stuck, 30, "the stalled peer's connection to back up")
    loop = asyncio.get_running_loop()
    started = loop.time()
    await asyncio.wait_for(main.stop(), CLOSE_TIMEOUT + 20)
    assert loop.time() - started < CLOSE_TIMEOUT + 10
    writer.transport.abort()


def test_free_port_never_hands_out_a_port_twice_in_one_process():
    """Two ports asked for in a row (a main's replication port, a worker's HTTP port) are distinct even
    when the kernel offers the same one again: a repeat once made a worker fail to listen."""
    from factstream.sockets import free_port

    ports = [free_port() for _ in range(300)]
    assert len(set(ports)) == len(ports)
    for port in ports[-3:]:  # and each is free: it can be listened on
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))
