"""Over Redis, a writer packs its RDATA lines into few messages only while every other subscriber of
the channel has announced that it reads them; a subscriber that never did (a reference peer) gets one
command per message, as the reference publishes them, and misses nothing."""

from __future__ import annotations

import asyncio

import pytest

from factstream.host.app import Host
from factstream.replication.resp import RedisAddress, RespClient
from factstream.testing import until
from tests.replication.test_replication import received

pytestmark = pytest.mark.redis


async def append_bulk(host: Host, n: int, author: str = "bulk") -> list[int]:
    async with host.database().transaction() as txn:
        return await host.id_generator("notes").append_many_txn(
            txn, "notes", [{"author": f"{author}{i}", "body": "x"} for i in range(n)]
        )


async def _pair(host_cluster, deployment: str) -> tuple[Host, Host]:
    host_cluster.configure(transport="redis", deployment=deployment)
    main = await host_cluster("main")
    worker = await host_cluster("worker1")
    await host_cluster.following(worker, "notes")
    return main, worker


async def test_factstream_peers_get_packed_messages_and_every_fact_in_order(host_cluster):
    main, _worker = await _pair(host_cluster, "packing-all")
    await until(lambda: main.transport.packing, timeout=5)

    before = main.transport.published
    ids = await append_bulk(main, 600) + await append_bulk(main, 400, author="more")

    await until(lambda: [t for _, _, t, _ in received("worker1")] == ids)
    assert [r.author for *_, r in received("worker1")] == [f"bulk{i}" for i in range(600)] + [
        f"more{i}" for i in range(400)
    ]
    assert main.transport.published - before < 20, "1,000 facts should travel in a few packed messages"


async def test_a_subscriber_that_never_announced_gets_one_command_per_message(host_cluster, redis_url):
    main, _worker = await _pair(host_cluster, "packing-foreign")
    await until(lambda: main.transport.packing, timeout=5)

    # A peer that never says it reads packed messages (a reference peer publishes REPLICATE after
    # subscribing; this one does so late, to show the positions that cover a packed stretch).
    address = RedisAddress.from_url(redis_url)
    foreign = await RespClient.open(address)
    publisher = await RespClient.open(address)
    messages: list[bytes] = []
    try:
        await foreign.subscribe(b"packing-foreign", lambda read: messages.extend(m[2] for m in read))
        # Until the writer counts it, it may get packed messages it cannot read...
        early = await append_bulk(main, 100, author="early")
        await until(lambda: not main.transport.packing, timeout=5)  # the next count, with no REPLICATE
        # ...so when packing stops, every stream's position goes out: had it processed an earlier
        # POSITION, it would see it is behind and catch up what it could not read.
        await until(lambda: any(m.startswith(b"POSITION notes main") for m in messages))
        at = next(i for i, m in enumerate(messages) if m.startswith(b"POSITION notes main"))
        packed = [m for m in messages[:at] if m.startswith(b"RDATA notes main") and b"\n" in m]
        last_packed = max((int(m.rpartition(b"\n")[2].split()[3]) for m in packed), default=0)
        assert int(messages[at].split()[4]) >= last_packed, messages[at]
        await until(lambda: [t for _, _, t, _ in received("worker1")] == early)
        await publisher.command("PUBLISH", "packing-foreign", "REPLICATE")
        seen = len(messages)
        await asyncio.sleep(2.5)  # two subscriber counts later, still off
        assert not main.transport.packing

        ids = early + await append_bulk(main, 300)
        await until(lambda: [t for _, _, t, _ in received("worker1")] == ids)
        await until(lambda: sum(m.startswith(b"RDATA notes main ") for m in messages[seen:]) == 300)
        assert not [m for m in messages[seen:] if b"\n" in m]
    finally:
        await foreign.aclose()
        await publisher.aclose()

    # Once it has gone, the remaining subscribers all read packed messages again.
    await until(lambda: main.transport.packing, timeout=5)
    more = await append_bulk(main, 200, author="after")
    await until(lambda: [t for _, _, t, _ in received("worker1")] == ids + more)


async def test_packing_can_be_turned_off(host_cluster):
    host_cluster.configure(transport="redis", deployment="packing-off")
    main = await host_cluster("main", replication={"redis_packing": False})
    worker = await host_cluster("worker1")
    await host_cluster.following(worker, "notes")
    await asyncio.sleep(2.5)  # two subscriber counts: every subscriber has announced by now

    before = main.transport.published
    ids = await append_bulk(main, 300)
    await until(lambda: [t for _, _, t, _ in received("worker1")] == ids)
    assert not main.transport.packing
    assert main.transport.published - before >= 300, "one message per command"
