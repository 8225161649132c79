"""The watermark read from the database: exports never pass a fact still in flight, and pick it up later.

The comparison with a naive ``max(stream_id)`` export shows why: with a writer holding an ID open
while another commits above it, the naive export moves past the open ID and loses that fact when it
commits; ours stops below it and exports it on the next run.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import psycopg

from factstream.db.engine import libpq_url
from factstream.export.plan import StreamPlan
from factstream.export.read import connect
from factstream.export.runner import ExportRunner
from factstream.export.watermark import persisted_upto
from tests.export.writers import Writer


def _watermark(url, plugins, stream="ledger"):
    with connect(url) as conn:
        return persisted_upto(conn, StreamPlan.from_spec(plugins.registry.streams.get(stream)))


def _row(i):
    return {"account": "acc", "amount": i, "memo": None}


def test_export_never_passes_a_fact_in_flight_and_picks_it_up_next_time(
    spark, export_db, export_plugins, loop_thread, tmp_path: Path
):
    spec = export_plugins.registry.streams.get("ledger")
    slow = loop_thread.run(Writer(export_db, spec, "slow").start())
    fast = loop_thread.run(Writer(export_db, spec, "fast").start())
    try:
        before = loop_thread.run(fast.append("ledger_credits", [_row(i) for i in range(3)]))
        held_id, release, held = loop_thread.run(slow.hold("ledger_credits", _row(100)))
        after = loop_thread.run(fast.append("ledger_credits", [_row(i) for i in range(3, 8)]))
        assert max(before) < held_id < min(after)

        out = tmp_path / "out"
        out.mkdir()
        runner = ExportRunner(spark, export_plugins, export_db, out.as_uri())
        job = export_plugins.registry.export_jobs.get("ledger_raw")
        first = runner.run(job)

        # Ours: up to just below the open ID. Naive: up to the highest committed ID.
        assert first.upto == held_id - 1
        with psycopg.connect(libpq_url(export_db)) as conn:
            naive_upto = conn.execute("SELECT max(stream_id) FROM ledger_credits").fetchone()[0]
        assert naive_upto == max(after)
        naive_first = _read(spark, export_db, export_plugins, 0, naive_upto)

        async def finish():
            release.set()
            await held
            await slow.gen.flush_position()

        loop_thread.run(finish())
        second = runner.run(job)
        with psycopg.connect(libpq_url(export_db)) as conn:
            naive_next = conn.execute("SELECT max(stream_id) FROM ledger_credits").fetchone()[0]
        naive_second = _read(spark, export_db, export_plugins, naive_upto, naive_next)
    finally:
        loop_thread.run(slow.close())
        loop_thread.run(fast.close())

    everything = sorted([*before, held_id, *after])
    assert second.upto == max(after)
    ours = sorted(r.stream_id for r in spark.read.parquet(str(out / "ledger_raw")).collect())
    assert ours == everything
    naive = sorted(naive_first + naive_second)
    assert held_id not in naive  # the naive export lost the fact that was in flight
    assert naive == [i for i in everything if i != held_id]


def _read(spark, url, plugins, lo, hi):
    from factstream.export.datasource import data_source_class
    from factstream.export.plan import plans_for

    spark.dataSource.register(data_source_class(plans_for([r.spec for r in plugins.registry.streams]), url))
    df = spark.read.format("factstream").option("stream", "ledger").option("from", lo).option("upto", hi).load()
    return [r.stream_id for r in df.collect()]


def test_a_rolled_back_id_holds_the_watermark_until_its_writer_moves_past_it(export_db, export_plugins, loop_thread):
    spec = export_plugins.registry.streams.get("ledger")
    w = loop_thread.run(Writer(export_db, spec, "w").start())
    try:
        ids = loop_thread.run(w.append("ledger_credits", [_row(1)]))

        async def rolled_back():
            try:
                async with w.db.transaction() as txn:
                    await w.gen.append_txn(txn, "ledger_credits", _row(2))
                    raise RuntimeError("abort")
            except RuntimeError:
                pass

        loop_thread.run(rolled_back())
        more = loop_thread.run(w.append("ledger_credits", [_row(3)]))
        # The writer's own position is past the gap and persisted: the watermark follows it.
        assert _watermark(export_db, export_plugins) == max(more)

        # Seen by rows alone (the stored position lags), the gap stops the watermark.
        with psycopg.connect(libpq_url(export_db), autocommit=True) as conn:
            conn.execute("UPDATE stream_positions SET stream_id = %s WHERE instance_name = 'w'", (ids[0],))
        assert _watermark(export_db, export_plugins) == ids[0]
    finally:
        loop_thread.run(w.close())


def test_a_writer_that_is_gone_does_not_hold_the_watermark_back(export_db, export_plugins, loop_thread):
    spec = export_plugins.registry.streams.get("ledger")
    w = loop_thread.run(Writer(export_db, spec, "w").start())
    loop_thread.run(w.append("ledger_credits", [_row(1)]))
    with psycopg.connect(libpq_url(export_db), autocommit=True) as conn:
        # an old writer whose row says 1 but has no session and no lease any more, and a gap at the head
        conn.execute("INSERT INTO stream_positions VALUES ('ledger', 'retired', 1)")
        gap = conn.execute("SELECT nextval('ledger_seq')").fetchone()[0]
    try:
        # w is alive at its position; retired is gone; the gap is below w's next ID
        assert _watermark(export_db, export_plugins) < gap
        loop_thread.run(w.append("ledger_credits", [_row(2)]))
        assert _watermark(export_db, export_plugins) > gap
    finally:
        loop_thread.run(w.close())
    # with every writer gone, the sequence head is the watermark
    with psycopg.connect(libpq_url(export_db), autocommit=True) as conn:
        head = conn.execute("SELECT nextval('ledger_seq')").fetchone()[0]
    assert _watermark(export_db, export_plugins) == head


def test_backwards_stream_watermark_is_a_positive_position(export_db, export_plugins, loop_thread):
    spec = export_plugins.registry.streams.get("rewind")
    w = loop_thread.run(Writer(export_db, spec, "bf").start())
    try:
        ids = loop_thread.run(w.append("rewind", [{"note": "x", "ok": True, "score": 1.0, "tags": ["t"]}]))
        assert _watermark(export_db, export_plugins, "rewind") == -ids[0]
    finally:
        loop_thread.run(w.close())


def test_in_flight_id_of_a_live_writer_bounds_the_watermark(export_db, export_plugins, loop_thread):
    spec = export_plugins.registry.streams.get("ledger")
    w = loop_thread.run(Writer(export_db, spec, "w").start())
    try:
        done = loop_thread.run(w.append("ledger_credits", [_row(1)]))
        held_id, release, task = loop_thread.run(w.hold("ledger_credits", _row(2)))
        assert _watermark(export_db, export_plugins) == max(done) < held_id

        async def finish():
            release.set()
            await task
            await asyncio.sleep(0)
            await w.gen.flush_position()

        loop_thread.run(finish())
        assert _watermark(export_db, export_plugins) == held_id
    finally:
        loop_thread.run(w.close())
