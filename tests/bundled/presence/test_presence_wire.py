"""The presence stream's wire row (docs/plugins/presence.md, The stream): an ``RDATA presence`` line,
captured by a raw replication client from main's TCP port, holds exactly the seven fields of the
reference's ``PresenceStreamRow`` in its order (``user_id, state, last_active_ts,
last_federation_update_ts, last_user_sync_ts, status_msg, currently_active``), ``null`` for a missing
status message and JSON booleans; and a worker parses it back into the typed row."""

from __future__ import annotations

import asyncio
import json

import pytest
from factstream_presence import PresenceRow, PresenceStore

from factstream.errors import PluginError
from factstream.host.app import Host
from factstream.plugin.manager import load_plugins
from factstream.testing import HostCluster
from tests.bundled.events.conftest import TOKENS
from tests.bundled.presence.conftest import FAST, Clients, put_status

ALICE, BOB = "@alice:hs", "@bob:hs"
FIELDS = [
    "user_id",
    "state",
    "last_active_ts",
    "last_federation_update_ts",
    "last_user_sync_ts",
    "status_msg",
    "currently_active",
]


async def rdata_lines(reader: asyncio.StreamReader, count: int) -> list[bytes]:
    """The next ``count`` ``RDATA presence`` lines main sends (within 10 s: PINGs do not count)."""
    lines: list[bytes] = []
    deadline = asyncio.get_running_loop().time() + 10
    while len(lines) < count:
        line = await asyncio.wait_for(reader.readline(), deadline - asyncio.get_running_loop().time())
        assert line, "main closed the replication connection"
        if line.startswith(b"RDATA presence "):
            lines.append(line)
    return lines


async def test_an_rdata_line_holds_the_references_seven_fields_in_order(main: Host, client: Clients) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", main.transport.endpoint.port)
    try:
        writer.write(b"NAME rawclient\nREPLICATE\n")
        await writer.drain()
        await asyncio.sleep(0.3)
        bob = client(BOB)
        assert (await put_status(bob, BOB, {"presence": "online"})).status_code == 200
        assert (await put_status(bob, BOB, {"presence": "unavailable", "status_msg": "lunch"})).status_code == 200
        online, away = await rdata_lines(reader, 2)
        print(online.decode(), away.decode(), sep="", end="")  # shown with -s
    finally:
        writer.close()
    rows = []
    for line in (online, away):
        command, stream, instance, token, row_json = line.rstrip(b"\n").split(b" ", 4)
        assert (command, stream, instance) == (b"RDATA", b"presence", b"main")
        assert int(token) > 1
        row = json.loads(row_json)
        assert isinstance(row, list) and len(row) == 7, line
        assert row[0] == BOB and all(type(row[i]) is int for i in (2, 3, 4)), line
        assert row[3] == 0, line  # no federation: never updated over it
        rows.append(row)
    assert rows[0][1] == "online" and rows[0][5] is None and rows[0][6] is True
    assert rows[1][1] == "unavailable" and rows[1][5] == "lunch" and rows[1][6] is False
    assert b",null,true]" in online  # no message: null; booleans as JSON's, as the reference sends them
    assert b',"lunch",false]' in away
    assert rows[1][2] == rows[0][2]  # unavailable is no activity: last_active_ts stays
    assert list(PresenceRow.__struct_fields__) == FIELDS


async def test_a_worker_parses_the_row_back_and_drops_its_cached_presence(host_cluster: HostCluster) -> None:
    host_cluster.configure(http={"tokens": TOKENS}, plugins={"presence": FAST})
    main = await host_cluster("main")
    worker = await host_cluster("worker1")
    await host_cluster.following(worker, "presence")
    on_worker = worker.api.state(PresenceStore)
    assert await on_worker.latest(ALICE) is None  # cached on the worker now
    alice = host_cluster.client(main, "tok-alice-hs")
    assert (await put_status(alice, ALICE, {"presence": "online", "status_msg": "hi"})).status_code == 200
    position = main.id_generator("presence").get_current_token()
    assert await worker.api.wait_for_stream_position("main", "presence", position, timeout=10)
    row = await on_worker.latest(ALICE)
    assert row is not None and (row.user_id, row.state, row.status_msg, row.currently_active) == (
        ALICE,
        "online",
        "hi",
        True,
    )


def test_the_plugin_needs_the_events_plugin_and_says_why() -> None:
    host = load_plugins(environ={"FACTSTREAM_BLOCK_PLUGINS": "events"})
    with pytest.raises(PluginError) as refused:
        _ = host.registry
    assert (
        "plugin 'presence' needs plugin 'events' (presence is shown to the users who share a room),"
        " which is blocked by FACTSTREAM_BLOCK_PLUGINS: unblock it, or block 'presence' too"
    ) in str(refused.value)
