"""Replication trust between real hosts (one event loop, real PostgreSQL and Redis).

A peer speaks only for the instance it is (authenticated with ``replication.secret``, or ``NAME``d
without one), only about streams that instance is configured to write, and never under the receiving
process's own name; a POSITION can never move a position past what the stream's sequence has handed
out. Refused over TCP with ``ERROR`` and a closed link, dropped over Redis; the hub never relays what
it refused. With a secret, a client that cannot prove it learns nothing.
"""

from __future__ import annotations

import asyncio

import redis.asyncio as aioredis

from factstream.replication.auth import ReplicationSecret
from factstream.testing import until
from tests.replication.test_replication import append_notes, received

SECRET = "correct horse battery staple"
FORGED_TOKEN = 900_000


async def raw_session(port: int, lines: list[bytes], *, read_for: float = 1.5) -> list[str]:
    """Connect, send ``lines``, and return every line the server sent until it closed (or ``read_for`` s)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"".join(lines))
    await writer.drain()
    got: list[str] = []
    try:
        async with asyncio.timeout(read_for):
            while line := await reader.readline():
                got.append(line.decode(errors="replace").rstrip("\n"))
    except TimeoutError:
        pass
    finally:
        writer.close()
    return got


def closed_with(lines: list[str], error: str) -> bool:
    return bool(lines) and lines[-1].startswith("ERROR") and error in lines[-1]


# -- who may say what, over TCP ---------------------------------------------------------------------


async def test_forged_rdata_under_the_servers_own_name_is_refused_and_never_relayed(host_cluster):
    main = await host_cluster("main")
    worker = await host_cluster("worker1")
    await host_cluster.following(worker, "notes")
    port = main.transport.endpoint.port

    lines = await raw_session(port, [b"NAME x\n", b"PING 1\n", b'RDATA notes main %d ["eve"]\n' % FORGED_TOKEN])

    assert closed_with(lines, "main is this process's own instance name"), lines
    ids = await append_notes(main, 5)
    await until(lambda: [t for _, _, t, _ in received("worker1")] == ids)
    assert all(r.author != "eve" for *_, r in received("worker1"))
    assert worker.id_generator("notes").get_current_token_for_writer("main") == ids[-1]
    assert await worker.wait_for_stream_position("main", "notes", ids[-1], timeout=5)


async def test_rdata_under_another_instances_name_is_refused(host_cluster):
    main = await host_cluster("main", stream_writers={"notes": ["main", "worker1"]})
    worker = await host_cluster("worker1", stream_writers={"notes": ["main", "worker1"]})
    await host_cluster.following(worker, "notes")
    port = main.transport.endpoint.port

    lines = await raw_session(port, [b"NAME worker2\n", b'RDATA notes worker1 5 ["eve"]\n'])

    assert closed_with(lines, "peer worker2 cannot speak for worker1"), lines
    assert main.handler.refused == 1


async def test_rdata_before_naming_itself_is_refused(host_cluster):
    main = await host_cluster("main", stream_writers={"notes": ["main", "worker1"]})
    port = main.transport.endpoint.port

    lines = await raw_session(port, [b'RDATA notes worker1 5 ["eve"]\n'])

    assert closed_with(lines, "a peer must send NAME before it speaks for worker1"), lines


async def test_a_peer_cannot_name_itself_after_the_server(host_cluster):
    main = await host_cluster("main")
    port = main.transport.endpoint.port

    lines = await raw_session(port, [b"NAME main\n"])

    assert closed_with(lines, "NAME main: that is this process's own instance name"), lines


async def test_rdata_for_a_stream_the_peer_does_not_write_is_refused(host_cluster):
    main = await host_cluster("main")
    worker = await host_cluster("worker1")
    await host_cluster.following(worker, "notes")
    port = main.transport.endpoint.port

    lines = await raw_session(port, [b"NAME worker2\n", b'RDATA notes worker2 5 ["eve"]\n'])

    assert closed_with(lines, "instance worker2 is not configured to write stream notes"), lines
    ids = await append_notes(main, 3)
    await until(lambda: [t for _, _, t, _ in received("worker1")] == ids)


async def test_a_forged_position_from_a_non_writer_cannot_poison_the_writer(host_cluster):
    main = await host_cluster("main")
    gen = main.id_generator("notes")
    first = await append_notes(main, 3)

    lines = await raw_session(main.transport.endpoint.port, [b"NAME forger\n", b"POSITION notes forger 0 50\n"])

    assert closed_with(lines, "instance forger is not configured to write stream notes"), lines
    assert gen.get_current_token() == first[-1]
    assert "forger" not in gen.get_positions()
    ids = await append_notes(main, 3)  # handed out twice before: "stream ID 4 handed out twice (watermark 50)"
    assert ids == [first[-1] + 1, first[-1] + 2, first[-1] + 3]
    assert gen.get_current_token() == ids[-1]


async def test_a_position_beyond_the_sequence_is_refused_and_never_relayed(host_cluster):
    writers = ("main", "worker2")
    main = await host_cluster("main", stream_writers={"notes": list(writers)})
    worker = await host_cluster("worker1", stream_writers={"notes": list(writers)})
    await host_cluster.following(worker, "notes")
    await append_notes(main, 2)
    allocated = await main.id_generator("notes").get_max_allocated_token()

    lines = await raw_session(
        main.transport.endpoint.port, [b"NAME worker2\n", b"POSITION notes worker2 0 %d\n" % FORGED_TOKEN]
    )

    assert closed_with(lines, f"beyond the highest ID the stream's sequence has handed out ({allocated})"), lines
    await asyncio.sleep(0.3)
    for host in (main, worker):
        assert host.id_generator("notes").get_positions().get("worker2", 0) < FORGED_TOKEN
    assert (main.handler.refused, worker.handler.refused) == (1, 0)
    # A legitimate POSITION of that writer, within the sequence, is accepted and relayed (and
    # processed before the rows that follow it on the stream).
    lines = await raw_session(
        main.transport.endpoint.port, [b"NAME worker2\n", b"POSITION notes worker2 0 %d\n" % allocated]
    )
    ids = await append_notes(main, 1)
    await until(lambda: received("worker1")[-1][2] == ids[0])
    assert not any(line.startswith("ERROR") for line in lines), lines
    assert (main.handler.refused, worker.handler.refused) == (1, 0)


# -- the shared secret, over TCP ------------------------------------------------------------------


async def test_with_the_secret_everything_replicates_as_before(host_cluster):
    main = await host_cluster("main", replication={"secret": SECRET})
    worker = await host_cluster("worker1", replication={"secret": SECRET})
    await host_cluster.following(worker, "notes")

    ids = await append_notes(main, 20)

    await until(lambda: [t for _, _, t, _ in received("worker1")] == ids)
    [conn] = main.transport.endpoint.connections
    assert conn.peer == "worker1" and conn.trusted


async def test_a_client_without_the_secret_is_refused_and_learns_nothing(host_cluster):
    main = await host_cluster("main", replication={"secret": SECRET})
    await append_notes(main, 3)

    lines = await raw_session(main.transport.endpoint.port, [b"NAME worker1\n", b"PING 1\n", b"REPLICATE \n"])

    assert lines[0] == "SERVER test"
    assert lines[1].startswith("FS_CHALLENGE ")
    assert closed_with(lines, "authentication required"), lines
    assert not [line for line in lines if line.startswith(("POSITION", "RDATA"))], lines


async def test_a_client_with_a_wrong_proof_is_refused_and_learns_nothing(host_cluster):
    main = await host_cluster("main", replication={"secret": SECRET})
    await append_notes(main, 3)
    reader, writer = await asyncio.open_connection("127.0.0.1", main.transport.endpoint.port)
    assert (await reader.readline()).startswith(b"SERVER ")
    challenge = await reader.readline()
    wrong = ReplicationSecret("not the secret at all", "test")
    _, auth = wrong.answer_challenge(challenge, b"0" * 32, "worker1")

    writer.write(auth + b"NAME worker1\nREPLICATE \n")
    await writer.drain()
    rest = (await asyncio.wait_for(reader.read(), 5)).decode().splitlines()
    writer.close()

    assert closed_with(rest, "authentication failed"), rest
    assert not [line for line in rest if line.startswith(("POSITION", "RDATA", "FS_AUTH_OK"))], rest


async def test_a_client_that_proves_the_secret_gets_the_servers_proof_and_positions(host_cluster):
    main = await host_cluster("main", replication={"secret": SECRET})
    ids = await append_notes(main, 3)
    reader, writer = await asyncio.open_connection("127.0.0.1", main.transport.endpoint.port)
    await reader.readline()
    challenge = await reader.readline()
    secret = ReplicationSecret(SECRET, "test")
    client_nonce = b"ab" * 16
    server_nonce, auth = secret.answer_challenge(challenge, client_nonce, "worker1")

    writer.write(auth + b"NAME worker1\nREPLICATE \n")
    await writer.drain()
    got: list[bytes] = []
    async with asyncio.timeout(5):
        while not any(line.startswith(b"POSITION notes main") for line in got):
            got.append(await reader.readline())
    writer.close()

    ok = next(line for line in got if line.startswith(b"FS_AUTH_OK"))
    assert secret.check_server(ok, server_nonce, client_nonce) == "main"
    assert f"POSITION notes main {ids[-1]} {ids[-1]}".encode() in [line.rstrip() for line in got]


async def test_a_worker_with_a_wrong_secret_never_replicates(host_cluster):
    main = await host_cluster("main", replication={"secret": SECRET})
    worker = await host_cluster("worker1", replication={"secret": "a different secret entirely"})
    await asyncio.sleep(0.5)

    await append_notes(main, 3)

    await asyncio.sleep(0.5)
    assert received("worker1") == []
    assert not [conn for conn in main.transport.endpoint.connections if conn.trusted]
    assert worker.transport.endpoint.connects >= 1


async def test_a_worker_with_a_secret_refuses_a_server_that_does_not_ask_for_it(host_cluster, caplog):
    main = await host_cluster("main")
    worker = await host_cluster("worker1", replication={"secret": SECRET})
    await asyncio.sleep(0.5)

    await append_notes(main, 3)

    await asyncio.sleep(0.5)
    assert received("worker1") == []
    assert "does not ask for replication.secret" in caplog.text
    assert worker.transport.endpoint.connects >= 1


async def test_without_a_secret_a_synapse_peer_still_interoperates_both_ways(host_cluster):
    """A client speaking Synapse's lines gets positions and rows; a server speaking them feeds a worker."""
    main = await host_cluster("main")
    ids = await append_notes(main, 2)
    reader, writer = await asyncio.open_connection("127.0.0.1", main.transport.endpoint.port)
    writer.write(b"NAME synapse_worker\nPING 1600000000000\nREPLICATE \n")
    await writer.drain()
    got: list[bytes] = []
    async with asyncio.timeout(5):
        while not any(line.startswith(b"POSITION notes main") for line in got):
            got.append(await reader.readline())
    more = await append_notes(main, 1)
    async with asyncio.timeout(5):
        while not got[-1].startswith(b"RDATA"):
            got.append(await reader.readline())
    writer.close()
    assert got[0] == b"SERVER test\n"
    assert f"POSITION notes main {ids[-1]} {ids[-1]}\n".encode() in got
    assert got[-1] == f'RDATA notes main {more[0]} ["ada0"]\n'.encode()
    await main.stop()

    # Now the other way: a Synapse-like server on main's port, and a worker that connects to it.
    lines_seen: list[bytes] = []

    async def serve(r: asyncio.StreamReader, w: asyncio.StreamWriter) -> None:
        w.write(b"SERVER test\nPING 1600000000000\n")
        while line := await r.readline():
            lines_seen.append(line)
            if line.startswith(b"REPLICATE"):
                w.write(f"POSITION notes main {more[0]} {more[0]}\n".encode())
                w.write(f'RDATA notes main {more[0] + 1} ["synapse"]\n'.encode())
                await w.drain()

    server = await asyncio.start_server(serve, "127.0.0.1", main.settings.instance_map["main"].replication_port)
    try:
        await host_cluster("worker1")
        await until(lambda: [r.author for *_, r in received("worker1")][-1:] == ["synapse"])
    finally:
        server.close()
    assert lines_seen[0] == b"NAME worker1\n"


# -- Redis --------------------------------------------------------------------------------------------


async def publish(redis_url: str, channel: str, *messages: bytes) -> None:
    """Publish ``messages`` on a deployment's channel (``host_cluster.deployment``), as an outsider would."""
    client = aioredis.from_url(redis_url)
    try:
        for message in messages:
            await client.publish(channel, message)
    finally:
        await client.aclose()


async def test_redis_drops_positions_of_non_writers_and_rows_under_the_receivers_own_name(host_cluster, redis_url):
    host_cluster.configure(transport="redis")
    main = await host_cluster("main")
    worker = await host_cluster("worker1")
    await host_cluster.following(worker, "notes")
    first = await append_notes(main, 2)
    await until(lambda: len(received("worker1")) == 2)

    await publish(
        redis_url,
        host_cluster.deployment,
        b"POSITION notes forger 0 50",
        b'RDATA notes worker1 %d ["eve"]' % FORGED_TOKEN,
        b"POSITION notes main 0 %d" % FORGED_TOKEN,
    )
    ids = await append_notes(main, 2)

    await until(lambda: [t for _, _, t, _ in received("worker1")] == first + ids)
    for host in (main, worker):
        positions = host.id_generator("notes").get_positions()
        assert "forger" not in positions and positions.get("main", 0) < FORGED_TOKEN, positions
    assert worker.handler.refused >= 1
    assert main.id_generator("notes").get_current_token() == ids[-1]


async def test_with_a_secret_redis_drops_unsigned_and_misattributed_messages(host_cluster, redis_url):
    host_cluster.configure(transport="redis")
    writers = ("main", "worker2")
    main = await host_cluster("main", stream_writers={"notes": list(writers)}, replication={"secret": SECRET})
    worker = await host_cluster("worker1", stream_writers={"notes": list(writers)}, replication={"secret": SECRET})
    await host_cluster.following(worker, "notes")
    first = await append_notes(main, 2)
    await until(lambda: len(received("worker1")) == 2)
    secret = ReplicationSecret(SECRET, host_cluster.deployment)
    outsider = ReplicationSecret("an outsider's guess at it", host_cluster.deployment)

    await publish(
        redis_url,
        host_cluster.deployment,
        b'RDATA notes main %d ["unsigned"]' % FORGED_TOKEN,
        outsider.sign(b'RDATA notes main %d ["outsider"]' % FORGED_TOKEN, b"main"),
        secret.sign(b'RDATA notes main %d ["misattributed"]' % FORGED_TOKEN, b"worker2"),
        secret.sign(b"POSITION notes worker2 0 %d" % FORGED_TOKEN, b"worker2"),
        secret.sign(b'RDATA notes main 5 ["x"]', b"main")[:-1] + b"x",  # a tampered signature
    )
    ids = await append_notes(main, 2)

    await until(lambda: [t for _, _, t, _ in received("worker1")] == first + ids)
    assert not [r for *_, r in received("worker1") if r.author != "ada0" and r.author != "ada1"]
    positions = worker.id_generator("notes").get_positions()
    assert max(positions.values()) < FORGED_TOKEN, positions
    await until(lambda: worker.transport.unsigned == 4)
    assert worker.handler.refused == 1  # the POSITION beyond the sequence
    # A signed POSITION of a configured writer within the sequence is accepted (processed before the
    # rows that follow it on the stream).
    allocated = await main.id_generator("notes").get_max_allocated_token()
    await publish(
        redis_url, host_cluster.deployment, secret.sign(b"POSITION notes worker2 0 %d" % allocated, b"worker2")
    )
    more = await append_notes(main, 1)
    await until(lambda: received("worker1")[-1][2] == more[0])
    assert worker.handler.refused == 1 and worker.transport.unsigned == 4


async def test_with_a_secret_redis_replicates_as_before_and_ignores_a_publisher_without_it(host_cluster, redis_url):
    host_cluster.configure(transport="redis")
    main = await host_cluster("main", replication={"secret": SECRET})
    worker = await host_cluster("worker1", replication={"secret": SECRET})
    await host_cluster.following(worker, "notes")

    ids = await append_notes(main, 30)

    await until(lambda: [t for _, _, t, _ in received("worker1")] == ids)
    # A publisher without the secret is ignored, whatever it sends.
    await publish(redis_url, host_cluster.deployment, b"REPLICATE ", b'RDATA notes main %d ["eve"]' % FORGED_TOKEN)
    # (main drops the RDATA under its own name as its echo, before any check)
    await until(lambda: main.transport.unsigned == 1 and worker.transport.unsigned == 2)
    more = await append_notes(main, 2)
    await until(lambda: [t for _, _, t, _ in received("worker1")] == ids + more)
