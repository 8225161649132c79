"""The sync key layout: recorded in ``sync_token_keys`` (real PostgreSQL), stable across restarts."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

from factstream.db.database import Database
from factstream.plugin.streams import StreamSpec, StreamTable
from factstream.sync import (
    MemoryInstanceIds,
    StreamToken,
    SyncKey,
    SyncKeyKind,
    SyncKeyLayout,
    plan_layout,
    sync_keys_for_streams,
)


class Fact(msgspec.Struct):
    value: int


@pytest.fixture
async def db(migrated_database: str) -> AsyncIterator[Database]:
    database = Database.from_url(migrated_database, instance_name="tests")
    yield database
    await database.close()


async def recorded(db: Database) -> list[tuple[int, str]]:
    return [(int(p), str(k)) for p, k in await db.fetchall("SELECT position, sync_key FROM sync_token_keys ORDER BY 1")]


async def test_a_first_load_records_the_keys_in_the_order_given(db):
    layout = await SyncKeyLayout.load(db, [SyncKey("b_key"), SyncKey("a_key", SyncKeyKind.MULTI_WRITER)])
    assert layout.names == ("b_key", "a_key")
    assert await recorded(db) == [(0, "b_key"), (1, "a_key")]


async def test_the_order_survives_a_restart_whatever_order_plugins_register_in(db):
    first = await SyncKeyLayout.load(db, [SyncKey("b_key"), SyncKey("a_key")])
    again = await SyncKeyLayout.load(db, [SyncKey("a_key"), SyncKey("b_key")])
    assert again == first
    token = StreamToken.of(first, {"b_key": 3, "a_key": 7})
    text = token.serialize(MemoryInstanceIds().id_for)
    assert StreamToken.deserialize(text, again, MemoryInstanceIds().name_for) == token


async def test_a_new_key_is_appended_and_old_tokens_stay_valid(db):
    before = await SyncKeyLayout.load(db, [SyncKey("b_key"), SyncKey("a_key")])
    old_text = StreamToken.of(before, {"b_key": 3, "a_key": 7}).serialize(MemoryInstanceIds().id_for)

    after = await SyncKeyLayout.load(db, [SyncKey("new_key"), SyncKey("a_key"), SyncKey("b_key")])

    assert after.names == ("b_key", "a_key", "new_key")
    assert await recorded(db) == [(0, "b_key"), (1, "a_key"), (2, "new_key")]
    parsed = StreamToken.deserialize(old_text, after, MemoryInstanceIds().name_for)
    assert (parsed.get("b_key"), parsed.get("a_key"), parsed.get("new_key")) == (3, 7, 0)


async def test_a_key_whose_plugin_is_gone_keeps_its_slot_and_serialises_as_zero(db):
    await SyncKeyLayout.load(db, [SyncKey("b_key"), SyncKey("gone_key"), SyncKey("a_key")])
    layout = await SyncKeyLayout.load(db, [SyncKey("a_key"), SyncKey("b_key")])
    assert layout.names == ("b_key", "gone_key", "a_key")
    assert layout.key("gone_key").kind is SyncKeyKind.RETIRED
    assert [k.name for k in layout.active_keys] == ["b_key", "a_key"]
    parsed = StreamToken.deserialize("4_9_5", layout, MemoryInstanceIds().name_for)
    assert parsed.serialize(MemoryInstanceIds().id_for) == "4_0_5"


async def test_concurrent_first_loads_agree_on_one_order(migrated_database):
    dbs = [Database.from_url(migrated_database, instance_name=f"p{i}") for i in range(4)]
    try:
        keys = [[SyncKey(f"k{(i + j) % 4}") for j in range(4)] for i in range(4)]
        layouts = await asyncio.gather(*(SyncKeyLayout.load(d, k) for d, k in zip(dbs, keys, strict=True)))
        assert all(layout == layouts[0] for layout in layouts)
        assert sorted(layouts[0].names) == ["k0", "k1", "k2", "k3"]
        assert len(await recorded(dbs[0])) == 4
    finally:
        for d in dbs:
            await d.close()


def test_a_gap_in_recorded_positions_stays_a_retired_slot():
    layout, new = plan_layout([(0, "a"), (2, "c")], [SyncKey("c"), SyncKey("d"), SyncKey("a")])
    assert [k.kind for k in layout] == [SyncKeyKind.INT, SyncKeyKind.RETIRED, SyncKeyKind.INT, SyncKeyKind.INT]
    assert layout.names[3] == "d" and new == [(3, "d")]


@given(st.lists(st.lists(st.sampled_from("abcdefg"), unique=True), max_size=5))
def test_recorded_positions_never_move_over_any_sequence_of_plugin_sets(key_sets):
    rows: list[tuple[int, str]] = []
    for names in key_sets:
        before = dict((name, pos) for pos, name in rows)
        layout, new_rows = plan_layout(rows, [SyncKey(n) for n in names])
        rows += new_rows
        assert all(layout.index(name) == pos for name, pos in before.items())
        assert set(names) <= set(layout.names)


def test_sync_keys_follow_the_number_of_writers():
    tables = (StreamTable("facts", "instance_name", "stream_id"),)
    streams = [
        StreamSpec(name="one", row_type=Fact, tables=tables, sync_key="one_key"),
        StreamSpec(name="two", row_type=Fact, tables=tables, sync_key="two_key"),
        StreamSpec(name="anyone", row_type=Fact, tables=tables, writers="any", sync_key="any_key"),
        StreamSpec(name="unsynced", row_type=Fact, tables=tables),
    ]
    writers = {"one": ["main"], "two": ["w1", "w2"]}
    keys = sync_keys_for_streams(streams, lambda name: writers.get(name, []))
    assert keys == [
        SyncKey("one_key", SyncKeyKind.INT),
        SyncKey("two_key", SyncKeyKind.MULTI_WRITER),
        SyncKey("any_key", SyncKeyKind.MULTI_WRITER),
    ]
