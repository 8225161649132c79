"""The typing stream's wire row (docs/plugins/typing.md, The stream): an ``RDATA typing`` line, captured by
a raw replication client from main's TCP port, holds exactly the two fields of the reference's
``TypingStreamRow`` (``room_id, user_ids``), the list sorted, ``[]`` once nobody types; its position is
of the writer's run (above the epoch, the writer's clock in microseconds); and a worker parses it back
into the typed row."""

from __future__ import annotations

import asyncio
import json
import time

import pytest
from factstream_typing import TypingRow, TypingView, TypingWriter

from factstream.errors import PluginError
from factstream.host.app import Host
from factstream.plugin.manager import load_plugins
from factstream.testing import HostCluster
from tests.bundled.events.conftest import store_of, token_of
from tests.bundled.typing.conftest import ALICE, BOB, TYPING_TOKENS, Clients, put_typing


async def rdata_lines(reader: asyncio.StreamReader, count: int) -> list[bytes]:
    """The next ``count`` ``RDATA typing`` lines main sends."""
    lines: list[bytes] = []
    deadline = time.monotonic() + 10
    while len(lines) < count:
        line = await asyncio.wait_for(reader.readline(), max(0.0, deadline - time.monotonic()))
        assert line, "main closed the replication connection"
        if line.startswith(b"RDATA typing "):
            lines.append(line)
    return lines


async def room_of_alice_and_bob(main: Host) -> str:
    store = store_of(main)
    room = await store.create_room(ALICE, preset="public_chat")
    await store.change_membership(room, BOB, BOB, "join")
    return room


async def test_an_rdata_line_holds_the_references_two_fields_the_list_sorted(main: Host, client: Clients) -> None:
    room = await room_of_alice_and_bob(main)
    started_us = time.time_ns() // 1000
    reader, writer = await asyncio.open_connection("127.0.0.1", main.transport.endpoint.port)
    try:
        writer.write(b"NAME rawclient\nREPLICATE\n")
        await writer.drain()
        await asyncio.sleep(0.3)
        alice, bob = client(ALICE), client(BOB)
        lines = []
        # one change at a time: changes of a room made faster than the streamer sends them are one
        # row on the wire, the room's list after the last of them (the keeper holds lists, not changes)
        for http, user, typing in ((bob, BOB, True), (alice, ALICE, True), (alice, ALICE, False), (bob, BOB, False)):
            response = await put_typing(http, room, user, {"typing": typing, "timeout": 60_000})
            assert response.status_code == 200 and response.json() == {}, response.text
            lines += await rdata_lines(reader, 1)
        print(*(line.decode() for line in lines), sep="", end="")  # shown with -s
    finally:
        writer.close()
    expected = [[BOB], [ALICE, BOB], [BOB], []]  # bob typed first: the list is sorted, not in typing order
    positions = []
    for line, users in zip(lines, expected, strict=True):
        command, stream, instance, token, row_json = line.rstrip(b"\n").split(b" ", 4)
        assert (command, stream, instance) == (b"RDATA", b"typing", b"main")
        assert json.loads(row_json) == [room, users], line
        assert row_json == json.dumps([room, users], separators=(",", ":")).encode(), line
        positions.append(int(token))
    epoch = main.api.state(TypingWriter).stream.epoch
    assert started_us - 600_000_000 < epoch <= started_us  # the writer's clock when its run started
    assert positions == list(range(positions[0], positions[0] + 4)) and positions[0] > epoch
    assert list(TypingRow.__struct_fields__) == ["room_id", "user_ids"]


async def test_a_worker_parses_the_row_back_into_its_view(host_cluster: HostCluster) -> None:
    host_cluster.configure(http={"tokens": TYPING_TOKENS})
    main = await host_cluster("main")
    worker = await host_cluster("worker1")
    await host_cluster.following(worker, "typing")
    room = await room_of_alice_and_bob(main)
    bob = host_cluster.client(main, token_of(BOB))
    assert (await put_typing(bob, room, BOB)).status_code == 200
    position = main.api.state(TypingView).rooms[room].position
    assert await worker.api.wait_for_stream_position("main", "typing", position, timeout=10)
    seen = worker.api.state(TypingView).rooms[room]
    assert (seen.position, seen.users) == (position, (BOB,))


def test_the_plugin_needs_the_events_plugin_and_says_why() -> None:
    host = load_plugins(environ={"FACTSTREAM_BLOCK_PLUGINS": "events,receipts,presence"})
    with pytest.raises(PluginError) as refused:
        _ = host.registry
    assert str(refused.value) == (
        "plugin 'typing' needs plugin 'events' (typing notifications go to a room's joined members),"
        " which is blocked by FACTSTREAM_BLOCK_PLUGINS: unblock it, or block 'typing' too"
    )
