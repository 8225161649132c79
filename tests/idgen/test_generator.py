"""MultiWriterIdGenerator against a real PostgreSQL."""

from __future__ import annotations

import logging

import psycopg
import pytest
from prometheus_client import REGISTRY, generate_latest
from sqlalchemy import text

from factstream.db.engine import libpq_url
from factstream.idgen.errors import IdGeneratorError
from tests.idgen.conftest import create_stream_schema

INSERT = text("INSERT INTO facts (stream_id, instance_name, payload) VALUES (:id, :inst, :p)")


def sql(url: str, statement: str, *params: object) -> list[tuple]:
    with psycopg.connect(libpq_url(url), autocommit=True) as conn:
        cur = conn.execute(statement, params or None)
        return cur.fetchall() if cur.description else []


async def test_first_id_of_a_new_stream_is_2(make_gen):
    gen = await make_gen()

    async with gen.get_next() as stream_id:
        assert gen.get_current_token() == 1

    assert stream_id == 2
    assert gen.get_current_token() == 2


async def test_get_next_completes_when_the_body_raises(make_gen):
    gen = await make_gen()

    with pytest.raises(RuntimeError):
        async with gen.get_next():
            raise RuntimeError("insert failed")
    async with gen.get_next() as stream_id:
        pass

    assert stream_id == 3
    assert gen.get_current_token() == 3


async def test_get_next_mult_reserves_ascending_ids_that_complete_together(make_gen):
    gen = await make_gen()

    async with gen.get_next_mult(5) as ids:
        assert gen.tracker.unfinished == frozenset(ids)

    assert ids == [2, 3, 4, 5, 6]
    assert gen.get_current_token() == 6


async def test_ids_reserved_in_a_transaction_complete_after_commit(db, make_gen, stream_db):
    gen = await make_gen()

    async with db.transaction() as txn:
        stream_id = await gen.get_next_txn(txn)
        await txn.execute(INSERT, {"id": stream_id, "inst": "main", "p": "x"})
        assert gen.get_current_token() == 1  # not before COMMIT

    assert gen.get_current_token() == stream_id == 2
    assert sql(stream_db, "SELECT stream_id FROM facts") == [(2,)]


async def test_ids_reserved_in_a_transaction_complete_on_rollback(db, make_gen, stream_db):
    gen = await make_gen()

    with pytest.raises(ValueError):
        async with db.transaction() as txn:
            ids = await gen.get_next_mult_txn(txn, 3)
            await txn.execute(INSERT, {"id": ids[0], "inst": "main", "p": "x"})
            raise ValueError("abort")

    assert gen.get_current_token() == 4
    assert sql(stream_db, "SELECT count(*) FROM facts") == [(0,)]


async def test_get_next_txn_needs_a_factstream_transaction(db, make_gen):
    gen = await make_gen()

    async with db.autocommit() as conn:
        with pytest.raises(IdGeneratorError, match=r"needs the Transaction from Database\.transaction\(\)"):
            await gen.get_next_txn(conn)


async def test_backwards_stream_hands_out_negative_ids(make_gen):
    gen = await make_gen(positive=False)

    async with gen.get_next_mult(2) as ids:
        pass
    async with gen.get_next() as one:
        pass

    assert ids == [-2, -3] and one == -4
    assert gen.get_current_token() == -4
    assert gen.get_current_token_for_writer("main") == -4
    assert gen.get_positions() == {"main": -4}
    assert await gen.get_max_allocated_token() == -4


async def test_backwards_stream_restarts_from_negative_rows_and_positions(db, make_gen, stream_db):
    first = await make_gen(positive=False, persist_interval=0.0)
    async with db.transaction() as txn:
        for stream_id in await first.get_next_mult_txn(txn, 3):
            await txn.execute(INSERT, {"id": stream_id, "inst": "main", "p": "old"})
    await first.close()
    await first.leases.close()

    again = await make_gen(positive=False)

    assert sql(stream_db, "SELECT stream_id FROM stream_positions") == [(-4,)]
    assert again.get_current_token() == -4
    async with again.get_next() as stream_id:
        assert stream_id == -5


async def test_non_writer_cannot_reserve(make_gen):
    gen = await make_gen("worker1", writers=["main", "persister"])

    with pytest.raises(IdGeneratorError) as info:
        async with gen.get_next():
            pass

    message = str(info.value)
    assert "instance 'worker1' tried to reserve an ID on stream 'facts'" in message
    assert "whose writers are 'main', 'persister'" in message


async def test_multi_table_stream_starts_from_the_highest_row_of_any_table(stream_db, make_gen):
    sql(stream_db, "SELECT setval('facts_seq', 30)")
    sql(stream_db, "INSERT INTO facts VALUES (12, 'main', 'a'), (20, 'main', 'b')")
    sql(stream_db, "INSERT INTO facts_extra VALUES (25, 'main', 'c'), (30, 'main', 'd')")

    gen = await make_gen("reader", writers=["main"], tables=("facts", "facts_extra"))

    assert gen.get_current_token() == 30


async def test_restart_with_rows_beyond_stream_positions(stream_db, make_gen):
    # first persisted 3 before crashing; its rows reach 6; second persisted 5.
    sql(stream_db, "SELECT setval('facts_seq', 6)")
    sql(stream_db, "INSERT INTO stream_positions VALUES ('facts', 'first', 3), ('facts', 'second', 5)")
    sql(stream_db, "INSERT INTO facts VALUES (4, 'first', ''), (5, 'second', ''), (6, 'first', '')")

    reader = await make_gen("reader", writers=["first", "second"])
    first = await make_gen("first", writers=["first", "second"])

    assert reader.get_current_token() == 6
    assert first.get_current_token_for_writer("first") == 6
    assert sql(stream_db, "SELECT stream_id FROM stream_positions WHERE instance_name = 'first'") == [(6,)]


async def test_any_writer_stream_counts_every_live_instance(db, make_gen):
    a = await make_gen("a", writers=[])
    b = await make_gen("b", writers=[])

    async with a.get_next() as held:
        async with b.get_next() as later:
            pass
        b_view = b.get_current_token()
        a.advance("b", b.get_current_token_for_writer("b"))
        assert a.get_current_token() < held  # b's later ID completed, a's is still open
    b.advance("a", a.get_current_token_for_writer("a"))

    assert (held, later) == (2, 3)
    assert b_view < held
    assert b.get_current_token() == 3


async def test_positions_are_persisted_lazily_in_few_writes(db, make_gen, stream_db):
    gen = await make_gen(persist_interval=0.05)

    for _ in range(300):
        async with gen.get_next():
            pass
    await gen.close()

    assert 1 <= gen.position_writes <= 10
    assert sql(stream_db, "SELECT stream_id FROM stream_positions WHERE instance_name = 'main'") == [(301,)]


async def test_a_crashed_writer_restarts_at_its_rows_without_the_lazy_write(db, make_gen, stream_db):
    gen = await make_gen(persist_interval=3600)  # never persisted before the "crash"
    for _ in range(5):
        async with db.transaction() as txn:
            stream_id = await gen.get_next_txn(txn)
            await txn.execute(INSERT, {"id": stream_id, "inst": "main", "p": ""})
    await gen.leases.close()  # the process dies: its lease goes, nothing is flushed

    assert sql(stream_db, "SELECT stream_id FROM stream_positions") == [(1,)]
    again = await make_gen()
    reader = await make_gen("reader")

    assert again.get_current_token() == 6
    assert reader.get_current_token() == 6
    async with again.get_next() as stream_id:
        assert stream_id == 7


@pytest.mark.parametrize(
    ("setup", "reason"),
    [
        ("INSERT INTO facts VALUES (50, 'main', '')", "the backing tables hold ID 50"),
        ("INSERT INTO stream_positions VALUES ('facts', 'main', 50)", "stream_positions holds 50 for writer 'main'"),
    ],
)
async def test_sequence_behind_used_ids_is_repaired_at_startup(stream_db, make_gen, caplog, setup, reason):
    sql(stream_db, setup)  # as after a failover: the sequence (at 1) lost its last advances
    before = REGISTRY.get_sample_value("factstream_sequence_repairs_total", {"stream": "facts"}) or 0

    with caplog.at_level(logging.WARNING, logger="factstream.idgen.generator"):
        gen = await make_gen(repair_margin=100)
        async with gen.get_next() as stream_id:
            pass

    assert stream_id == 151
    assert gen.repaired_from == 1
    assert f"sequence facts_seq is behind IDs already used ({reason}); moving it from 1 to 150" in caplog.text
    assert REGISTRY.get_sample_value("factstream_sequence_repairs_total", {"stream": "facts"}) == before + 1


async def test_second_process_with_the_same_instance_name_is_refused(make_gen):
    await make_gen("main")

    with pytest.raises(IdGeneratorError, match="another process is already running as instance 'main'"):
        await make_gen("main")


async def test_removed_writer_counts_until_its_lease_is_gone(db, make_gen, stream_db):
    old = await make_gen("old", writers=["old", "new"])
    new = await make_gen("new", writers=["old", "new"])
    async with old.get_next() as held:
        # A reader configured without "old" (it was removed) starts while "old" still runs.
        async with new.get_next() as later:
            pass
        await new.close()
        reader = await make_gen("reader", writers=["new"])
        reader.advance("new", later)
        assert reader.get_current_token() < held
    reader.advance("old", old.get_current_token_for_writer("old"))
    assert reader.get_current_token() == later
    assert await reader.check_retired_writers() == []  # still alive

    await old.close()
    await old.leases.close()
    assert await reader.check_retired_writers() == ["old"]
    assert "old" not in reader.get_positions()


async def test_dead_removed_writer_row_is_deleted_at_startup(stream_db, make_gen):
    sql(stream_db, "INSERT INTO stream_positions VALUES ('facts', 'gone', 1)")

    await make_gen("main", writers=["main"])

    assert sql(stream_db, "SELECT instance_name FROM stream_positions ORDER BY 1") == [("main",)]


async def test_advance_never_moves_a_position_backwards(make_gen):
    gen = await make_gen("reader", writers=["a", "b"])
    gen.advance("a", 9)
    gen.advance("a", 4)

    assert gen.get_positions()["a"] == 9
    with pytest.raises(ValueError, match="wrong side of zero"):
        gen.advance("a", -3)


async def test_generator_needs_its_sequence(db, stream_db):
    from factstream.idgen.generator import MultiWriterIdGenerator

    gen = MultiWriterIdGenerator(
        db,
        stream_name="facts",
        sequence_name="nope_seq",
        tables=[("facts", "instance_name", "stream_id")],
        writers=["main"],
        instance_name="main",
    )

    with pytest.raises(IdGeneratorError, match="sequence 'nope_seq' does not exist; run `factstream migrate`"):
        await gen.start()


async def test_metrics_report_positions_watermark_and_outstanding(make_gen):
    gen = await make_gen()
    async with gen.get_next_mult(3):
        text_during = generate_latest(REGISTRY).decode()
    text_after = generate_latest(REGISTRY).decode()

    assert 'factstream_stream_unfinished_ids{instance="main",stream="facts"} 3.0' in text_during
    assert 'factstream_stream_unfinished_ids{instance="main",stream="facts"} 0.0' in text_after
    assert 'factstream_stream_persisted_upto{instance="main",stream="facts"} 4.0' in text_after
    assert 'factstream_stream_position{instance="main",stream="facts",writer="main"} 4.0' in text_after
    assert 'factstream_stream_in_flight_fetches{instance="main",stream="facts"} 0.0' in text_after


def test_new_sequence_sql_never_uses_start_with(stream_db):
    create_stream_schema(stream_db, "others", sequence="others_seq")

    assert sql(stream_db, "SELECT last_value, is_called FROM others_seq") == [(1, True)]
    assert sql(stream_db, "SELECT nextval('others_seq')") == [(2,)]


async def test_append_txn_reserves_inside_the_insert(db, make_gen, stream_db):
    gen = await make_gen()

    async with db.transaction() as txn:
        first = await gen.append_txn(txn, "facts", {"payload": "a"})
        second = await gen.append_txn(txn, "facts", {"payload": "b"})
        assert gen.get_current_token() == 1

    assert (first, second) == (2, 3)
    assert gen.get_current_token() == 3
    assert sql(stream_db, "SELECT stream_id, instance_name, payload FROM facts ORDER BY 1") == [
        (2, "main", "a"),
        (3, "main", "b"),
    ]


async def test_append_many_txn_gives_ids_in_row_order_and_completes_on_rollback(db, make_gen, stream_db):
    gen = await make_gen()
    async with db.transaction() as txn:
        ids = await gen.append_many_txn(txn, "facts", [{"payload": p} for p in "xyz"])

    with pytest.raises(RuntimeError):
        async with db.transaction() as txn:
            await gen.append_many_txn(txn, "facts", [{"payload": "lost"}] * 4)
            raise RuntimeError("abort")

    assert ids == [2, 3, 4]
    assert sql(stream_db, "SELECT stream_id, payload FROM facts ORDER BY 1") == [(2, "x"), (3, "y"), (4, "z")]
    assert gen.get_current_token() == 8


async def test_append_on_a_backwards_stream_writes_negative_ids(db, make_gen, stream_db):
    gen = await make_gen(positive=False)

    async with db.transaction() as txn:
        one = await gen.append_txn(txn, "facts", {"payload": "old"})
        many = await gen.append_many_txn(txn, "facts", [{"payload": "older"}, {"payload": "oldest"}])

    assert (one, many) == (-2, [-3, -4])
    assert sql(stream_db, "SELECT stream_id FROM facts ORDER BY 1 DESC") == [(-2,), (-3,), (-4,)]
    assert gen.get_current_token() == -4


async def test_append_rejects_unknown_tables_columns_and_ragged_rows(db, make_gen):
    gen = await make_gen()

    async with db.transaction() as txn:
        with pytest.raises(IdGeneratorError, match=r"has no backing table 'nope' \(its tables: facts\)"):
            await gen.append_txn(txn, "nope", {"payload": "x"})
        with pytest.raises(IdGeneratorError, match=r"every appended row needs the columns \('payload',\)"):
            await gen.append_many_txn(txn, "facts", [{"payload": "x"}, {"other": 1}])
        with pytest.raises(IdGeneratorError, match=r"table 'facts' has no column\(s\) 'colour'"):
            await gen.append_many_txn(txn, "facts", [{"colour": "red"}, {"colour": "blue"}])
    assert gen.tracker.unfinished == frozenset()
    assert gen.tracker.in_flight == 0


async def test_readded_writer_never_drags_positions_back(db, make_gen, stream_db):
    # x writes, is removed (and stops), then is added back and starts again.
    x = await make_gen("x", writers=["x", "y"], persist_interval=0.0)
    y = await make_gen("y", writers=["x", "y"], persist_interval=0.0)
    for gen in (x, y, x):
        async with db.transaction() as txn:
            await gen.append_txn(txn, "facts", {"payload": gen.instance_name})
    await x.close()
    await x.leases.close()
    reader = await make_gen("reader", writers=["y"])  # x no longer configured, and gone: its row goes
    assert "x" not in {r[0] for r in sql(stream_db, "SELECT instance_name FROM stream_positions")}
    before = reader.get_current_token()

    again = await make_gen("x", writers=["x", "y"])
    reader.advance("x", again.get_current_token_for_writer("x"))

    assert again.get_current_token_for_writer("x") >= 4
    assert reader.get_current_token() >= before
    async with db.transaction() as txn:
        assert await again.append_txn(txn, "facts", {"payload": "x"}) == 5
