"""The small RESP client of the Redis transport, against a real Redis."""

from __future__ import annotations

import asyncio
import uuid

import pytest

from factstream.replication.resp import RedisAddress, RespClient, RespError, pack, pack_publishes
from factstream.testing import free_port


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        ("redis://127.0.0.1:6379/0", RedisAddress("127.0.0.1", 6379)),
        ("redis://h", RedisAddress("h", 6379)),
        ("redis://user:p%40ss@h:7000/3", RedisAddress("h", 7000, db=3, username="user", password="p@ss")),
        ("redis://:secret@h/2", RedisAddress("h", 6379, db=2, password="secret")),
        ("rediss://cache.example:6380", RedisAddress("cache.example", 6380, tls=True)),
        ("unix:///run/redis.sock?db=4", RedisAddress(path="/run/redis.sock", db=4)),
    ],
)
def test_urls_are_read_like_redis_py_reads_them(url, expected):
    assert RedisAddress.from_url(url) == expected


@pytest.mark.parametrize("url", ["redis://h/notanumber", "http://h:6379", "redis://h:port"])
def test_a_bad_url_is_refused_naming_it(url):
    with pytest.raises(ValueError, match=r"Redis URL|must be a redis"):
        RedisAddress.from_url(url)


def test_commands_are_packed_as_arrays_of_bulk_strings():
    assert pack("SET", b"k", 5) == b"*3\r\n$3\r\nSET\r\n$1\r\nk\r\n$1\r\n5\r\n"
    assert pack_publishes([(b"ch", [b"a b", b""]), (b"c2", [b"x"])]) == b"".join(
        pack("PUBLISH", channel, message) for channel, message in [(b"ch", b"a b"), (b"ch", b""), (b"c2", b"x")]
    )


@pytest.mark.redis
async def test_commands_replies_and_errors(redis_url):
    conn = await RespClient.open(RedisAddress.from_url(redis_url))
    try:
        assert await conn.command("PING") == b"PONG"
        key = f"fs-resp-{uuid.uuid4().hex}"
        assert await conn.command("SET", key, "v\r\nwith a line break") == b"OK"
        assert await conn.command("GET", key) == b"v\r\nwith a line break"
        await conn.command("DEL", key)
        with pytest.raises(RespError, match="unknown command"):
            await conn.command("NOSUCHCOMMAND")
        assert await conn.command("PING") == b"PONG"  # the connection is still in step after an error
        conn.publish([(b"fs-resp-nobody", [b"a", b"b"])])  # answered in the background
        assert conn.unacknowledged == 2
        assert await conn.command("PING") == b"PONG"  # replies come in order: the publishes first
        assert conn.unacknowledged == 0
    finally:
        await conn.aclose()


@pytest.mark.redis
async def test_pipelined_publishes_reach_a_subscriber_in_order_in_batches(redis_url):
    address = RedisAddress.from_url(redis_url)
    channel = f"fs-resp-{uuid.uuid4().hex}".encode()
    reads: list[list[bytes]] = []
    sub = await RespClient.open(address)
    pub = await RespClient.open(address)
    try:
        await sub.subscribe(channel, lambda messages: reads.append([m[2] for m in messages]))
        messages = [b"RDATA s main %d [%d]" % (i, i) for i in range(5000)]
        pub.publish([(channel, messages[:10]), (channel, messages[10:])])

        async def all_arrived() -> None:
            while sum(map(len, reads)) < len(messages):
                await asyncio.sleep(0.01)

        await asyncio.wait_for(all_arrived(), 10)
        assert [m for read in reads for m in read] == messages
        assert len(reads) < len(messages) / 10, "messages should arrive many per read"
        assert pub.quiet_publishing  # so the 5,000 publishes were answered by two replies
        assert await pub.command("PING") == b"PONG"
        assert pub.unacknowledged == 0
    finally:
        await sub.aclose()
        await pub.aclose()


@pytest.mark.redis
async def test_a_killed_connection_fails_what_waits_and_keeps_unanswered_publishes(redis_url):
    address = RedisAddress.from_url(redis_url)
    victim = await RespClient.open(address)
    lost: list[Exception] = []
    victim.on_lost = lost.append
    victim_id = await victim.command("CLIENT", "ID")
    killer = await RespClient.open(address)
    try:
        waiting = asyncio.ensure_future(victim.command("BLPOP", f"fs-resp-{uuid.uuid4().hex}", 0, timeout=10))
        await asyncio.sleep(0.05)
        victim.publish([(b"fs-resp-nobody", [b"x"])])  # queued behind the blocked command
        victim.publish([(b"fs-resp-nobody", [b"y", b"z"])])  # a pipeline: published with replies off
        assert await killer.command("CLIENT", "KILL", "ID", victim_id) == 1
        with pytest.raises(RespError, match="lost"):
            await waiting
        assert lost and victim.lost is not None
        assert victim.unacknowledged_batches() == [(b"fs-resp-nobody", [b"x"]), (b"fs-resp-nobody", [b"y", b"z"])]
        with pytest.raises(RespError):
            await victim.command("PING")
    finally:
        await killer.aclose()
        victim.close()


async def test_an_unreachable_redis_is_a_clear_error():
    port = free_port()  # nothing listens there
    with pytest.raises(RespError, match=f"cannot connect to Redis at 127.0.0.1:{port}"):
        await RespClient.open(RedisAddress("127.0.0.1", port), timeout=2)


async def test_a_peer_that_never_answers_times_out():
    async def silent(reader, writer):
        await asyncio.sleep(10)

    async def answers_once(reader, writer):
        await reader.readuntil(b"ON\r\n")  # the CLIENT REPLY ON of the handshake
        writer.write(b"+OK\r\n")
        await asyncio.sleep(10)

    server = await asyncio.start_server(silent, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        with pytest.raises(RespError, match=r"timed out after 0\.3s"):
            await RespClient.open(RedisAddress("127.0.0.1", port), timeout=0.3)
    finally:
        server.close()
    server = await asyncio.start_server(answers_once, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        conn = await RespClient.open(RedisAddress("127.0.0.1", port))
        assert conn.quiet_publishing
        with pytest.raises(RespError, match=r"did not answer within 0\.2s"):
            await conn.command("PING", timeout=0.2)
        conn.close()
    finally:
        server.close()


async def test_a_redis_refusing_client_reply_gets_a_reply_per_publish():
    """Some managed services rename or forbid CLIENT: publishing then counts one reply per message."""
    received = bytearray()

    async def refuses_client(reader, writer):
        await reader.readuntil(b"ON\r\n")
        writer.write(b"-ERR unknown command 'CLIENT'\r\n")
        while data := await reader.read(65536):
            received.extend(data)
            writer.write(b":0\r\n" * data.count(b"PUBLISH"))

    server = await asyncio.start_server(refuses_client, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        conn = await RespClient.open(RedisAddress("127.0.0.1", port))
        assert not conn.quiet_publishing
        conn.publish([(b"ch", [b"a", b"b", b"c"])])
        assert conn.unacknowledged == 3
        for _ in range(100):
            if conn.unacknowledged == 0:
                break
            await asyncio.sleep(0.01)
        assert conn.unacknowledged == 0
        assert b"REPLY" not in received and received.count(b"PUBLISH") == 3
        conn.close()
    finally:
        server.close()
