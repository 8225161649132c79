"""Invalidation inside a write, against PostgreSQL: the caches-stream row is part of the transaction,
the local invalidation follows the commit; and the caches plugin's retention."""

from __future__ import annotations

import asyncio
import logging
import time

import psycopg
import pytest

from factstream import CacheSpec, Database
from factstream.caches.apply import InvalidationApplier
from factstream.caches.registry import CacheRegistry
from factstream.db.engine import libpq_url
from factstream.errors import FactstreamError

TABLE = "cache_invalidation_stream_by_instance"


def rows_in(url: str) -> list[tuple]:
    with psycopg.connect(libpq_url(url), autocommit=True) as conn:
        return conn.execute(
            f"SELECT stream_id, instance_name, cache_func, keys, invalidation_ts FROM {TABLE} ORDER BY stream_id"
        ).fetchall()


async def test_an_invalidation_writes_its_row_in_the_transaction_and_clears_the_local_key_after_commit(
    host_cluster, cache_db
):
    main = await host_cluster("main")
    cache = main.caches.get("demo_values")
    cache.set(("k",), "old")
    before = int(time.time() * 1000)

    async with main.database().transaction() as txn:
        ids = await main.caches.invalidate(txn, "demo_values", ("k",))
        assert ("k",) in cache, "the local cache must not change before the commit"

    assert ("k",) not in cache
    [(stream_id, instance, cache_func, keys, ts)] = rows_in(cache_db)
    assert (stream_id, instance, cache_func, keys) == (ids[0], "main", "demo_values", ["k"])
    assert before <= ts <= int(time.time() * 1000)
    assert main.id_generator("caches").get_current_token() == ids[0]


async def test_a_rolled_back_write_leaves_no_row_and_the_local_cache_untouched(host_cluster, cache_db):
    main = await host_cluster("main")
    cache = main.caches.get("demo_values")
    cache.set(("k",), "old")

    with pytest.raises(RuntimeError):
        async with main.database().transaction() as txn:
            await main.caches.invalidate(txn, "demo_values", ("k",))
            raise RuntimeError("the write failed")

    assert rows_in(cache_db) == []
    assert cache.get(("k",)) == "old"


async def test_invalidate_all_writes_a_row_with_null_keys(host_cluster, cache_db):
    main = await host_cluster("main")
    cache = main.caches.get("demo_values")
    cache.set(("a",), "1")
    cache.set(("b",), "2")

    async with main.database().transaction() as txn:
        await main.caches.invalidate_all(txn, "demo_values")

    assert [r[2:4] for r in rows_in(cache_db)] == [("demo_values", None)]
    assert len(cache) == 0


@pytest.mark.parametrize("name", ["cs_cache_fake", "ph_cache_fake", "dr_cache_fake"])
async def test_special_names_cannot_be_invalidated_wholesale(host_cluster, cache_db, name):
    main = await host_cluster("main")

    with pytest.raises(FactstreamError, match="cannot be invalidated wholesale"):
        async with main.database().transaction() as txn:
            await main.caches.invalidate_all(txn, name)
    assert rows_in(cache_db) == []


async def test_a_room_state_change_of_120_members_is_three_rows_of_one_transaction(host_cluster, cache_db):
    main = await host_cluster("main")
    members = [f"@u{i}:hs" for i in range(120)]
    profiles = main.caches.get("demo_member_profile")
    profiles.set(("!r:hs", "@u7:hs"), "p")

    async with main.database().transaction() as txn:
        ids = await main.caches.invalidate_room_state(txn, "!r:hs", members)

    rows = rows_in(cache_db)
    assert [r[0] for r in rows] == ids and len(ids) == 3
    assert [r[2] for r in rows] == ["cs_cache_fake"] * 3
    assert [r[3][0] for r in rows] == ["!r:hs"] * 3
    assert [m for r in rows for m in r[3][1:]] == members
    assert len(profiles) == 0  # the local fan-out ran after the commit


async def test_invalidating_a_key_of_the_wrong_shape_fails_the_write(host_cluster, cache_db):
    main = await host_cluster("main")

    with pytest.raises(ValueError, match="has 2 component"):
        async with main.database().transaction() as txn:
            await main.caches.invalidate(txn, "demo_values", ("a", "b"))
    with pytest.raises(FactstreamError, match="no cache named 'nope'"):
        async with main.database().transaction() as txn:
            await main.caches.invalidate(txn, "nope", ("a",))
    assert rows_in(cache_db) == []


async def test_rows_read_back_by_the_streams_update_function_apply_on_another_registry(host_cluster, cache_db):
    main = await host_cluster("main")
    async with main.database().transaction() as txn:
        await main.caches.invalidate(txn, "demo_values", ("k",))
        await main.caches.invalidate_room_state(txn, "!r:hs", ["@a:hs"])
    other = CacheRegistry([main.caches.spec(n) for n in main.caches.names()])
    applier = InvalidationApplier(other, caches_stream="caches")
    other.get("demo_values").set(("k",), "v")
    other.get("demo_member_rooms").set(("@a:hs",), "v")
    other.get("demo_member_rooms").set(("@b:hs",), "v")

    stream = main.streams["caches"]
    updates, _, limited = await stream.get_updates_since("main", 0, stream.current_token("main"))
    applier.apply("caches", [row for _, row in updates])

    assert not limited and len(updates) == 2
    assert ("k",) not in other.get("demo_values")
    assert other.get("demo_member_rooms").keys() == [("@b:hs",)]


async def test_without_a_caches_stream_invalidation_is_local_only(cache_db, caplog):
    caches = CacheRegistry([CacheSpec("solo")])
    caches.get("solo").set(("k",), "v")
    db = Database(cache_db, instance_name="solo")
    try:
        with caplog.at_level(logging.WARNING, logger="factstream.caches.registry"):
            async with db.transaction() as txn:
                assert await caches.invalidate(txn, "solo", ("k",)) == []
    finally:
        await db.close()

    assert len(caches.get("solo")) == 0
    assert "no caches stream is registered" in caplog.text
    assert rows_in(cache_db) == []


# -- retention -----------------------------------------------------------------------------------------


def insert_rows(url: str, ids: range, ts: int) -> None:
    with psycopg.connect(libpq_url(url), autocommit=True) as conn:
        conn.execute(
            f"INSERT INTO {TABLE} (stream_id, instance_name, cache_func, keys, invalidation_ts) "
            "SELECT i, 'main', 'demo_values', ARRAY['k'], %(ts)s "
            "FROM generate_series(%(lo)s::bigint, %(hi)s::bigint) AS i",
            {"ts": ts, "lo": ids.start, "hi": ids.stop - 1},
        )


async def test_retention_deletes_old_rows_in_batches_of_at_most_batch_ids_and_keeps_recent_ones(cache_db):
    from factstream_caches import delete_old_invalidations

    now = int(time.time() * 1000)
    week = 7 * 24 * 3600 * 1000
    insert_rows(cache_db, range(2, 50_002), now - week - 60_000)  # 50,000 old rows
    insert_rows(cache_db, range(50_002, 50_102), now)  # 100 recent rows
    db = Database(cache_db, instance_name="main")
    try:
        runs = []
        more = True
        while more:
            deleted, more = await delete_old_invalidations(db, older_than_ms=now - week, batch_ids=20_000)
            runs.append(deleted)
    finally:
        await db.close()

    assert runs == [20_000, 20_000, 10_000]
    remaining = rows_in(cache_db)
    assert [r[0] for r in remaining] == list(range(50_002, 50_102))


async def test_retention_runs_on_the_main_instance_and_stops_with_the_host(host_cluster, cache_db):
    now = int(time.time() * 1000)
    insert_rows(cache_db, range(2, 12), now - 10 * 24 * 3600 * 1000)
    insert_rows(cache_db, range(12, 14), now)
    main = await host_cluster("main", caches={"retention_interval_seconds": 0.05, "retention_batch_ids": 4})
    await host_cluster("worker1")
    # A task of main's (host.spawn), and of main's only: the worker runs no retention.
    [task] = [t for t in asyncio.all_tasks() if t.get_name() == "caches-retention"]

    deadline = time.monotonic() + 10
    while len(rows_in(cache_db)) > 2 and time.monotonic() < deadline:
        await asyncio.sleep(0.05)

    assert [r[0] for r in rows_in(cache_db)] == [12, 13]
    await main.stop()
    assert task.done()
    assert not [t for t in asyncio.all_tasks() if t.get_name() == "caches-retention"]
