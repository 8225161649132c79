"""Several writers of the receipts stream (``stream_writers.receipts``): each writes receipts with IDs
of its own, every process's ``/sync`` brings both writers' receipts from their ranges, one key written
on one writer then on the other keeps one current row, and an instance that does not write the stream
refuses the route with 421 naming the writers."""

from __future__ import annotations

import asyncio

from factstream.host.app import Host
from factstream.testing import HostCluster
from tests.bundled.events.conftest import store_of, token_of
from tests.bundled.receipts.conftest import RECEIPT_TOKENS, receipts_in, send_receipt, sync

ALICE, BOB, CAROL = "@alice:hs", "@bob:hs", "@carol:hs"


async def caught_up(hosts: list[Host], stream: str) -> None:
    """Every host has reached every writer's position of ``stream``."""
    for writer in hosts:
        if not writer.api.writes(stream):
            continue
        position = writer.id_generator(stream).get_current_token_for_writer(writer.instance_name)
        for host in hosts:
            assert await host.api.wait_for_stream_position(writer.instance_name, stream, position, timeout=10)


async def test_two_writers_receipts_reach_every_process(host_cluster: HostCluster) -> None:
    host_cluster.configure(http={"tokens": RECEIPT_TOKENS}, stream_writers={"receipts": ["main", "worker1"]})
    main = await host_cluster("main")
    worker1 = await host_cluster("worker1")
    worker2 = await host_cluster("worker2")
    hosts = [main, worker1, worker2]
    for host in (worker1, worker2):
        await host_cluster.following(host, "events", "receipts")
    store = store_of(main)
    room = await store.create_room(ALICE, preset="public_chat")
    for user in (BOB, CAROL):
        await store.change_membership(room, user, user, "join")
    first = await store.send(room, ALICE, "m.room.message", {"msgtype": "m.text", "body": "1"})
    second = await store.send(room, ALICE, "m.room.message", {"msgtype": "m.text", "body": "2"})
    await caught_up(hosts, "events")
    clients = {host.instance_name: {u: host_cluster.client(host, token_of(u)) for u in (BOB, CAROL)} for host in hosts}
    since = {name: (await sync(by_user[CAROL]))["next_batch"] for name, by_user in clients.items()}

    assert (await send_receipt(clients["main"][BOB], room, first)).status_code == 200
    assert (await send_receipt(clients["worker1"][CAROL], room, first)).status_code == 200
    refused = await send_receipt(clients["worker2"][BOB], room, first, "m.read.private")
    assert refused.status_code == 421 and refused.json()["errcode"] == "M_MISDIRECTED"
    assert "main, worker1" in refused.json()["error"]
    assert main.id_generator("receipts").get_current_token_for_writer("worker1") > 1
    await caught_up(hosts, "receipts")
    for name, by_user in clients.items():
        content = receipts_in(await sync(by_user[CAROL], since[name]))[room]
        assert set(content[first]["m.read"]) == {BOB, CAROL}, name

    # bob's key written on worker1 after main: one current row, the newer receipt
    assert (await send_receipt(clients["worker1"][BOB], room, second)).status_code == 200
    await caught_up(hosts, "receipts")
    rows = await main.database().fetchall(
        "SELECT instance_name, event_id FROM receipts_linearized WHERE user_id = %(u)s", {"u": BOB}
    )
    assert [tuple(r) for r in rows] == [("worker1", second)]
    for name, by_user in clients.items():
        content = receipts_in(await sync(by_user[CAROL]))[room]
        assert content[second]["m.read"].keys() == {BOB} and content[first]["m.read"].keys() == {CAROL}, name
    await asyncio.gather(*(c.aclose() for by_user in clients.values() for c in by_user.values()))
