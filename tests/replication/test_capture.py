"""A writer sends the rows it appended from memory (captured with ``INSERT ... RETURNING``).

What a reader receives must not depend on whether the writer captured a row or read it back: the
lines on the wire are compared with those the update function's rows encode to, for a table whose
stored values differ from what was inserted (column defaults, a trigger, jsonb, numeric, arrays).
Facts the capture cannot hold (reserved with ``get_next_txn``, rolled back, over the capture's limit)
are read back, and nothing is lost or sent twice.
"""

from __future__ import annotations

import psycopg
import pytest

from factstream.db.engine import libpq_url
from factstream.host.app import Host
from factstream.replication import stream as stream_module
from factstream.replication import wire
from factstream.testing import HostCluster, until

TYPED = """
    import datetime
    import decimal

    import msgspec

    import factstream
    from factstream import StreamSpec, StreamTable

    class TypedRow(msgspec.Struct, frozen=True):
        author: str
        shout: str
        amount: decimal.Decimal
        meta: dict
        tags: list
        at: datetime.datetime

    @factstream.hookimpl
    def register_streams(register):
        table = StreamTable("typed", "instance_name", "stream_id")
        register(StreamSpec(name="typed", row_type=TypedRow, tables=(table,)))
"""

SCHEMA = [
    "DROP TABLE IF EXISTS typed",
    "DROP SEQUENCE IF EXISTS typed_seq",
    "CREATE SEQUENCE typed_seq",
    "SELECT nextval('typed_seq')",
    """CREATE TABLE typed (
        stream_id bigint PRIMARY KEY, instance_name text NOT NULL,
        author text NOT NULL, shout text, amount numeric(10, 2) NOT NULL DEFAULT 1.5,
        meta jsonb NOT NULL DEFAULT '{"z": 1, "a": [1.0, "x"]}', tags text[] NOT NULL DEFAULT '{a,b}',
        at timestamptz NOT NULL DEFAULT now())""",
    # The stored row differs from the inserted one: a capture that kept the inserted values would show.
    """CREATE FUNCTION typed_shout() RETURNS trigger LANGUAGE plpgsql AS $$
        BEGIN NEW.shout := upper(NEW.author) || '!'; RETURN NEW; END $$""",
    "CREATE TRIGGER typed_shout BEFORE INSERT ON typed FOR EACH ROW EXECUTE FUNCTION typed_shout()",
]


@pytest.fixture
def typed_db(notes_db, plugin_installer) -> str:
    plugin_installer.from_source("typed", TYPED)
    with psycopg.connect(libpq_url(notes_db), autocommit=True) as conn:
        for statement in SCHEMA:
            conn.execute(statement)
    return notes_db


class Wire:
    """Records the RDATA lines a host's streamer sends, and counts its reads of the stream's table."""

    def __init__(self, host: Host, stream: str) -> None:
        self.lines: list[bytes] = []
        self.reads = 0
        assert host.streamer is not None and host.transport is not None
        send_lines = host.transport.send_lines

        def record(lines: list[bytes]) -> None:
            self.lines += [line for line in lines if line.startswith(f"RDATA {stream} ".encode())]
            send_lines(lines)

        host.streamer.send_lines = record
        replicated = host.streams[stream]
        update = replicated.update

        async def counted(*args):
            self.reads += 1
            return await update(*args)

        replicated.update = counted


async def connected_pair(host_cluster: HostCluster) -> tuple[Host, Host]:
    main = await host_cluster("main")
    worker = await host_cluster("worker1")
    await host_cluster.following(worker, "typed")
    return main, worker


async def read_back_lines(host: Host, upto: int) -> list[bytes]:
    """The lines the update function's rows encode to: what a writer reading back would send."""
    stream = host.streams["typed"]
    updates, _, limited = await stream.get_updates_since("main", 0, upto, limit=100_000)
    assert not limited
    return wire.encode_rdata_lines("typed", "main", [(t, stream.encode_row(r)) for t, r in updates])


def tokens(lines: list[bytes]) -> list[int]:
    return [int(line.split(b" ", 4)[3]) for line in lines]


async def test_captured_rows_go_out_exactly_as_read_back_rows_would(typed_db, host_cluster):
    main, worker = await connected_pair(host_cluster)
    wire = Wire(main, "typed")
    gen = main.id_generator("typed")

    ids: list[int] = []
    for i in range(20):
        async with main.database().transaction() as txn:
            ids += await gen.append_many_txn(txn, "typed", [{"author": f"ada{i}.{j}"} for j in range(5)])
        async with main.database().transaction() as txn:
            ids.append(await gen.append_txn(txn, "typed", {"author": f"bob{i}", "amount": 2}))

    await until(lambda: worker.id_generator("typed").get_current_token_for_writer("main") == ids[-1])
    assert wire.reads == 0, "appended rows were read back instead of being sent from memory"
    assert tokens(wire.lines) == sorted(ids)
    assert wire.lines == await read_back_lines(main, ids[-1])
    assert b'"ADA0.0!"' in wire.lines[0] and b'"2.00"' in wire.lines[5]  # trigger and numeric as stored


async def test_facts_the_capture_lacks_are_read_back_in_order(typed_db, host_cluster, row_recorder):
    main, worker = await connected_pair(host_cluster)
    wire = Wire(main, "typed")
    gen = main.id_generator("typed")
    db = main.database()

    committed: list[int] = []
    async with db.transaction() as txn:
        committed += await gen.append_many_txn(txn, "typed", [{"author": "a"}, {"author": "b"}])
    # A fact whose ID was reserved on its own and written by hand.
    async with db.transaction() as txn:
        own = await gen.get_next_txn(txn)
        await txn.execute(
            "INSERT INTO typed (stream_id, instance_name, author) VALUES (%(i)s, 'main', 'by hand')", {"i": own}
        )
    committed.append(own)
    # A rolled-back append leaves a hole that nobody must fill.
    with pytest.raises(RuntimeError):
        async with db.transaction() as txn:
            await gen.append_txn(txn, "typed", {"author": "never"})
            raise RuntimeError("changed my mind")
    async with db.transaction() as txn:
        committed += await gen.append_many_txn(txn, "typed", [{"author": "c"}, {"author": "d"}])

    await until(lambda: worker.id_generator("typed").get_current_token_for_writer("main") == committed[-1])
    assert tokens(wire.lines) == committed
    assert wire.lines == await read_back_lines(main, committed[-1])
    assert b'"by hand"' in wire.lines[2]
    received = [(r.token, r.row.author) for r in row_recorder.rows(worker.instance_name, "typed")]
    assert received == [(t, a) for t, a in zip(committed, ["a", "b", "by hand", "c", "d"], strict=True)]


async def test_past_its_limit_the_capture_gives_way_to_reading_back(typed_db, host_cluster, monkeypatch):
    monkeypatch.setattr(stream_module, "CAPTURE_LIMIT_ROWS", 10)
    main, worker = await connected_pair(host_cluster)
    wire = Wire(main, "typed")
    gen = main.id_generator("typed")

    ids: list[int] = []
    async with main.database().transaction() as txn:
        ids += await gen.append_many_txn(txn, "typed", [{"author": f"x{j}"} for j in range(25)])
    async with main.database().transaction() as txn:
        ids += await gen.append_many_txn(txn, "typed", [{"author": "y"}])

    await until(lambda: worker.id_generator("typed").get_current_token_for_writer("main") == ids[-1])
    assert wire.reads >= 1, "25 rows over a limit of 10 must be read back"
    assert tokens(wire.lines) == ids
    assert wire.lines == await read_back_lines(main, ids[-1])
