"""The factstream data source reads exactly a stream's facts in a range, through its definition."""

from __future__ import annotations

import json

import pytest

from factstream.export.datasource import data_source_class
from factstream.export.plan import ExportError, StreamPlan, plans_for, split_range
from tests.export.writers import Writer


def _register(spark, plugins, url):
    spark.dataSource.register(data_source_class(plans_for([r.spec for r in plugins.registry.streams]), url))


def _ledger_facts(loop_thread, url, plugins, n_credits=5, n_debits=3):
    spec = plugins.registry.streams.get("ledger")

    async def write():
        w = await Writer(url, spec, "w1").start()
        try:
            credits = await w.append(
                "ledger_credits",
                [{"account": f"acc{i % 2}", "amount": 10 + i, "memo": f"memo {i}"} for i in range(n_credits)],
            )
            debits = await w.append(
                "ledger_debits", [{"account": "acc0", "amount": -i - 1, "reason": "fee"} for i in range(n_debits)]
            )
        finally:
            await w.close()
        return credits, debits

    return loop_thread.run(write())


def test_reads_every_table_of_a_stream_with_instance_and_kind(spark, export_db, export_plugins, loop_thread):
    credits, debits = _ledger_facts(loop_thread, export_db, export_plugins)
    _register(spark, export_plugins, export_db)

    rows = spark.read.format("factstream").option("stream", "ledger").load().orderBy("stream_id").collect()

    assert [r.stream_id for r in rows] == sorted(credits + debits)
    assert {r.instance_name for r in rows} == {"w1"}
    kinds = {r.stream_id: r.source_table for r in rows}
    assert all(kinds[i] == "ledger_credits" for i in credits)
    assert all(kinds[i] == "ledger_debits" for i in debits)
    assert rows[0].account == "acc0" and rows[0].amount == 10
    assert rows[0].asDict().keys() == {"stream_id", "instance_name", "source_table", "account", "amount"}


def test_from_and_upto_select_a_half_open_range(spark, export_db, export_plugins, loop_thread):
    credits, debits = _ledger_facts(loop_thread, export_db, export_plugins)
    ids = sorted(credits + debits)
    _register(spark, export_plugins, export_db)

    df = (
        spark.read.format("factstream")
        .option("stream", "ledger")
        .option("from", ids[1])
        .option("upto", ids[4])
        .option("partitions", 3)
        .load()
    )

    assert sorted(r.stream_id for r in df.collect()) == ids[2:5]
    assert df.rdd.getNumPartitions() == 3


def test_content_option_adds_the_whole_backing_row(spark, export_db, export_plugins, loop_thread):
    credits, debits = _ledger_facts(loop_thread, export_db, export_plugins, n_credits=1, n_debits=1)
    _register(spark, export_plugins, export_db)

    rows = spark.read.format("factstream").option("stream", "ledger").option("content", "true").load().collect()

    content = {r.stream_id: json.loads(r.content) for r in rows}
    assert content[credits[0]]["memo"] == "memo 0"
    assert content[debits[0]]["reason"] == "fee"


def test_backwards_stream_exports_positive_positions(spark, export_db, export_plugins, loop_thread):
    spec = export_plugins.registry.streams.get("rewind")

    async def write():
        w = await Writer(export_db, spec, "bf").start()
        try:
            rows = [
                {"note": "first", "ok": True, "score": 1.5, "tags": ["a", "b"]},
                {"note": "", "ok": False, "score": -2.0, "tags": []},
                {"note": None, "ok": True, "score": 0.0, "tags": ['c,d\n"e"']},
            ]
            # one fact per call: array columns cannot go through the multi-row (unnest) append
            return [(await w.append("rewind", [row]))[0] for row in rows]
        finally:
            await w.close()

    ids = loop_thread.run(write())
    assert all(i < 0 for i in ids)
    _register(spark, export_plugins, export_db)

    rows = spark.read.format("factstream").option("stream", "rewind").load().orderBy("stream_id").collect()

    assert [r.stream_id for r in rows] == sorted(-i for i in ids)
    assert [(r.note, r.ok, r.score) for r in rows] == [("first", True, 1.5), ("", False, -2.0), (None, True, 0.0)]
    assert [json.loads(r.tags) for r in rows] == [["a", "b"], [], ['c,d\n"e"']]
    # One backing table: its name is on every row, as for streams with several (though not sent per row).
    assert {r.source_table for r in rows} == {"rewind"}
    with_content = spark.read.format("factstream").option("stream", "rewind").option("content", "true").load()
    assert [(r.source_table, json.loads(r.content)["note"]) for r in with_content.orderBy("stream_id").collect()] == [
        ("rewind", "first"),
        ("rewind", ""),
        ("rewind", None),
    ]

    upto_first = rows[0].stream_id
    tail = spark.read.format("factstream").option("stream", "rewind").option("from", upto_first).load().collect()
    assert sorted(r.stream_id for r in tail) == [r.stream_id for r in rows[1:]]


def test_stream_with_its_own_update_function_is_read_through_it(spark, export_db, export_plugins, loop_thread):
    spec = export_plugins.registry.streams.get("shouty")

    async def write():
        a = await Writer(export_db, spec, "a").start()
        b = await Writer(export_db, spec, "b").start()
        try:
            ids = await a.append("shouty", [{"said": "hello"}, {"said": "there"}])
            ids += await b.append("shouty", [{"said": "hi"}])
            return ids
        finally:
            await a.close()
            await b.close()

    ids = loop_thread.run(write())
    _register(spark, export_plugins, export_db)

    rows = spark.read.format("factstream").option("stream", "shouty").load().orderBy("stream_id").collect()

    assert [(r.stream_id, r.instance_name, r.loud) for r in rows] == [
        (ids[0], "a", "HELLO"),
        (ids[1], "a", "THERE"),
        (ids[2], "b", "HI"),
    ]


def test_unknown_stream_is_an_error_naming_the_registered_ones(spark, export_db, export_plugins):
    _register(spark, export_plugins, export_db)
    with pytest.raises(Exception, match=r"unknown stream 'nope'.*ledger"):
        spark.read.format("factstream").option("stream", "nope").load()


def test_split_range_covers_the_range_exactly_once():
    assert split_range(0, 10, 3) == [(0, 4), (4, 7), (7, 10)]
    assert split_range(5, 7, 8) == [(5, 6), (6, 7)]
    assert split_range(7, 7, 2) == []


def test_a_row_field_named_like_an_export_column_is_refused(export_plugins):
    import msgspec

    from factstream import StreamSpec, StreamTable

    class Bad(msgspec.Struct):
        instance_name: str

    spec = StreamSpec(name="bad", row_type=Bad, tables=(StreamTable("bad", "instance_name", "stream_id"),))
    with pytest.raises(ExportError, match="clashes"):
        StreamPlan.from_spec(spec)


def test_an_empty_range_reads_no_rows(spark, export_db, export_plugins, loop_thread):
    credits, _ = _ledger_facts(loop_thread, export_db, export_plugins, n_credits=2, n_debits=0)
    _register(spark, export_plugins, export_db)
    df = spark.read.format("factstream").option("stream", "ledger").option("from", max(credits)).load()
    assert df.count() == 0
