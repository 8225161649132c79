"""The receipts stream's wire row (docs/plugins/receipts.md, The stream): an ``RDATA receipts`` line,
captured by a raw replication client from main's TCP port, holds exactly the six fields of the
reference's ``ReceiptsStreamRow`` in its order (``room_id, receipt_type, user_id, event_id, thread_id,
data``), ``null`` for a receipt without a thread; and a worker parses it back into the typed row."""

from __future__ import annotations

import asyncio
import json

import pytest
from factstream_receipts import ReceiptsRow, ReceiptsStore

from factstream.errors import PluginError
from factstream.host.app import Host
from factstream.plugin.manager import load_plugins
from factstream.testing import HostCluster
from tests.bundled.events.conftest import store_of
from tests.bundled.receipts.conftest import RECEIPT_TOKENS, Clients, send_receipt

ALICE, BOB = "@alice:hs", "@bob:hs"


async def rdata_lines(reader: asyncio.StreamReader, count: int) -> list[bytes]:
    """The next ``count`` ``RDATA receipts`` lines main sends."""
    lines: list[bytes] = []
    while len(lines) < count:
        line = await asyncio.wait_for(reader.readline(), 10)
        assert line, "main closed the replication connection"
        if line.startswith(b"RDATA receipts "):
            lines.append(line)
    return lines


async def test_an_rdata_line_holds_the_references_six_fields_in_order(main: Host, client: Clients) -> None:
    store = store_of(main)
    room = await store.create_room(ALICE, preset="public_chat")
    await store.change_membership(room, BOB, BOB, "join")
    message = await store.send(room, ALICE, "m.room.message", {"msgtype": "m.text", "body": "hi"})
    reader, writer = await asyncio.open_connection("127.0.0.1", main.transport.endpoint.port)
    try:
        writer.write(b"NAME rawclient\nREPLICATE\n")
        await writer.drain()
        await asyncio.sleep(0.3)
        bob = client(BOB)
        assert (await send_receipt(bob, room, message)).status_code == 200
        assert (await send_receipt(bob, room, message, "m.read.private", {"thread_id": "main"})).status_code == 200
        unthreaded, threaded = await rdata_lines(reader, 2)
        print(unthreaded.decode(), threaded.decode(), sep="", end="")  # shown with -s
    finally:
        writer.close()
    for line, receipt_type, thread in ((unthreaded, "m.read", None), (threaded, "m.read.private", "main")):
        command, stream, instance, token, row_json = line.rstrip(b"\n").split(b" ", 4)
        assert (command, stream, instance) == (b"RDATA", b"receipts", b"main")
        assert int(token) > 1
        row = json.loads(row_json)
        assert isinstance(row, list) and len(row) == 6, line
        assert row[:5] == [room, receipt_type, BOB, message, thread], line
        assert set(row[5]) == {"ts"} and isinstance(row[5]["ts"], int), line
    assert f'"{message}",null,{{"ts":'.encode() in unthreaded  # no thread: null, as the reference sends it
    assert f'"{message}","main",{{"ts":'.encode() in threaded
    assert list(ReceiptsRow.__struct_fields__) == [
        "room_id",
        "receipt_type",
        "user_id",
        "event_id",
        "thread_id",
        "data",
    ]


async def test_a_worker_parses_the_row_back_and_drops_its_cached_receipts(host_cluster: HostCluster) -> None:
    host_cluster.configure(http={"tokens": RECEIPT_TOKENS})
    main = await host_cluster("main")
    worker = await host_cluster("worker1")
    await host_cluster.following(worker, "receipts")
    store = store_of(main)
    room = await store.create_room(ALICE, preset="public_chat")
    await store.change_membership(room, BOB, BOB, "join")
    message = await store.send(room, ALICE, "m.room.message", {"msgtype": "m.text", "body": "hi"})
    on_worker = worker.api.state(ReceiptsStore)
    assert await on_worker.room_receipts(room) == ()  # cached on the worker now
    bob = host_cluster.client(main, "tok-bob-hs")
    assert (await send_receipt(bob, room, message)).status_code == 200
    position = main.id_generator("receipts").get_current_token()
    assert await worker.api.wait_for_stream_position("main", "receipts", position, timeout=10)
    (receipt,) = await on_worker.room_receipts(room)
    assert receipt.row.room_id == room and receipt.row.user_id == BOB and receipt.row.thread_id is None
    assert receipt.stream_id == position and receipt.instance == "main"


def test_the_plugin_needs_the_events_plugin_and_says_why() -> None:
    host = load_plugins(environ={"FACTSTREAM_BLOCK_PLUGINS": "events,typing"})  # typing needs events too
    with pytest.raises(PluginError) as refused:
        _ = host.registry
    assert (
        "plugin 'receipts' needs plugin 'events' (receipts go to a room's joined members and point at its events),"
        " which is blocked by FACTSTREAM_BLOCK_PLUGINS" in str(refused.value)
    )
