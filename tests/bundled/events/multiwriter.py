"""Helpers of the several-writers tests (issue 35): a cluster with two writers of ``events`` and a worker,
rooms sharded between the writers by ``writer_for``, and a writer stalled inside an open transaction
that holds a reserved stream ID.

The stall: a test transaction inserts the ``event_txn_ids`` row (the key ``(sender, "send/<txn>")``)
that the writer's persist of ``PUT /send/.../<txn>`` will insert, and keeps it uncommitted. The writer
reserves its stream ID, sends its statement and waits on the unique index until the test rolls back;
then its insert goes through and it commits. Meanwhile the writer's position cannot pass that ID.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

import psycopg
from factstream_events.shared.sharding import writer_for

from factstream.db.engine import libpq_url
from factstream.host.app import Host
from factstream.testing import HostCluster
from tests.bundled.events.conftest import TOKENS, store_of

WRITERS = ("w1", "w2")
INSTANCES = ("w1", "w2", "worker1")
ALICE, BOB = "@alice:hs", "@bob:hs"

#: Someone waits on a lock: the stalled writer's statement (any other backend of the test's database).
WAITING = """
SELECT count(*) FROM pg_stat_activity
WHERE datname = current_database() AND wait_event_type = 'Lock' AND pid <> pg_backend_pid()
"""


async def two_writers(host_cluster: HostCluster, transport: str) -> dict[str, Host]:
    """``w1`` and ``w2`` writing ``events``, ``worker1`` reading it, each following the stream."""
    host_cluster.configure(
        transport=transport,
        instances=INSTANCES,
        stream_writers={"events": list(WRITERS), "backfill": list(WRITERS)},
        http={"tokens": TOKENS},
    )
    hosts = {name: await host_cluster(name) for name in INSTANCES}
    for host in hosts.values():
        await host_cluster.following(host, "events")
    return hosts


async def owned_rooms(hosts: dict[str, Host], per_writer: int, *members: str) -> dict[str, list[str]]:
    """Public rooms, ``per_writer`` of each writer, each created by the writer that owns it (``writer_for``),
    with ``members`` joined there."""
    owned: dict[str, list[str]] = {w: [] for w in WRITERS}
    while any(len(rooms) < per_writer for rooms in owned.values()):
        for writer in WRITERS:
            if len(owned[writer]) >= per_writer:
                continue
            store = store_of(hosts[writer])
            room = await store.create_room(ALICE, preset="public_chat")
            if writer_for(room, WRITERS) != writer:
                continue  # another writer's room: left alone
            for member in members:
                await store.change_membership(room, member, member, "join")
            owned[writer].append(room)
    return owned


#: The last stream ID each writer committed to a table of the ``events`` stream.
LAST_WRITTEN = """
SELECT instance_name, max(stream_ordering) FROM events WHERE stream_ordering > 0 GROUP BY instance_name
UNION ALL SELECT instance_name, max(stream_id) FROM current_state_delta_stream GROUP BY instance_name
UNION ALL SELECT instance_name, max(stream_id) FROM ex_outlier_stream GROUP BY instance_name
"""


async def caught_up(hosts: dict[str, Host], *readers: str) -> None:
    """Wait until every reader (default: every host) has what each writer committed, as far as the writer's
    own position goes (a stalled writer's stops short of its reserved ID: what it committed after that
    waits too). Not the writer's position alone: an idle writer's moves up with the others' IDs, with
    nothing of its own to send."""
    last: dict[str, int] = {}
    for writer, at in await hosts[WRITERS[0]].api.database().fetchall(LAST_WRITTEN):
        last[str(writer)] = max(int(at), last.get(str(writer), 0))
    for writer in WRITERS:
        own = hosts[writer].id_generator("events").get_current_token_for_writer(writer)
        position = min(own, last.get(writer, 0))
        for reader in readers or tuple(hosts):
            if position > 0:
                assert await hosts[reader].api.wait_for_stream_position(writer, "events", position, timeout=30)


class Stall:
    """A writer stalled inside its transaction (module docstring): :meth:`start`, then :meth:`release`."""

    def __init__(self, database_url: str) -> None:
        self.url = libpq_url(database_url)
        self.conn: psycopg.AsyncConnection[Any] | None = None
        self.task: asyncio.Task[str] | None = None

    async def start(self, host: Host, room: str, sender: str, txn_id: str, body: str) -> None:
        """Hold the ``event_txn_ids`` key ``host``'s send will write, start the send and wait until it blocks."""
        self.conn = await psycopg.AsyncConnection.connect(self.url)
        await self.conn.execute(
            "INSERT INTO event_txn_ids (user_id, txn_id, request_hash, event_id, inserted_ts)"
            " VALUES (%s, %s, 'held by the test', '$held', 0)",
            (sender, f"send/{txn_id}"),
        )
        content = {"msgtype": "m.text", "body": body}
        self.task = asyncio.ensure_future(store_of(host).send(room, sender, "m.room.message", content, txn_id=txn_id))
        await waiting_on_a_lock(self.url)

    async def release(self) -> str:
        """Roll the test's transaction back: the writer's insert goes through, it commits; its event ID."""
        assert self.conn is not None and self.task is not None
        assert not self.task.done(), "the stalled send finished while the test held its key"
        await self.conn.rollback()
        await self.conn.close()
        return await asyncio.wait_for(self.task, 10)


async def waiting_on_a_lock(url: str, timeout: float = 10.0) -> None:
    """Wait until a backend of the database waits on a lock (``pg_stat_activity``)."""
    deadline = time.monotonic() + timeout
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        while True:
            cur = await conn.execute(WAITING)
            row = await cur.fetchone()
            if row is not None and int(row[0]) > 0:
                return
            assert time.monotonic() < deadline, "the writer never blocked on the held key"
            await asyncio.sleep(0.02)
