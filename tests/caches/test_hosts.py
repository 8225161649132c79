"""Invalidation between real hosts in one event loop (main and worker1 over TCP, one database).

The demo store (tests/plugin_projects/cachedemo) reads values through caches; main writes values and
invalidates; worker1's caches must follow, before its caches-stream position says so.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import pytest

from factstream.host.app import Host
from factstream.testing import HostCluster


def demo_store(host: Host) -> Any:
    """The demo store of ``host`` (the plugin is installed per test, so it is imported here)."""
    from factstream_cachedemo import DemoStore

    return host.api.state(DemoStore)


async def pair(host_cluster: HostCluster) -> tuple[Host, Host]:
    main = await host_cluster("main")
    worker = await host_cluster("worker1")
    await host_cluster.following(worker, "caches", "notes")
    return main, worker


async def seed(main: Host, worker: Host, values: dict[str, str]) -> None:
    """Write ``values`` (clearing the values cache) and wait until worker1 has applied that."""
    [stream_id] = await demo_store(main).set_values_clearing_all(values)
    assert await worker.wait_for_stream_position("main", "caches", stream_id, timeout=5)


async def test_a_key_cached_on_the_worker_is_invalidated_when_main_writes(host_cluster):
    main, worker = await pair(host_cluster)
    await seed(main, worker, {"k": "v1", "other": "o1"})
    store = demo_store(worker)
    assert await store.get_value("k") == "v1"
    assert await store.get_value("other") == "o1"

    [stream_id] = await demo_store(main).set_value("k", "v2")

    assert await worker.wait_for_stream_position("main", "caches", stream_id, timeout=5)
    cache = worker.caches.get("demo_values")
    assert ("k",) not in cache
    assert ("other",) in cache, "a per-key invalidation must leave the other keys"
    assert await store.get_value("k") == "v2"


async def test_whole_cache_invalidation_reaches_the_worker(host_cluster):
    main, worker = await pair(host_cluster)
    await seed(main, worker, {"a": "1", "b": "2"})
    store = demo_store(worker)
    await store.get_value("a")
    await store.get_value("b")
    await store.get_room_members("!r:hs")

    [stream_id] = await demo_store(main).set_values_clearing_all({"a": "10", "b": "20"})

    assert await worker.wait_for_stream_position("main", "caches", stream_id, timeout=5)
    assert len(worker.caches.get("demo_values")) == 0
    assert len(worker.caches.get("demo_room_members")) == 1
    assert [await store.get_value("a"), await store.get_value("b")] == ["10", "20"]


async def test_a_room_state_change_of_120_members_clears_that_rooms_state_caches_on_the_worker_only(host_cluster):
    main, worker = await pair(host_cluster)
    members = [f"@u{i}:hs" for i in range(120)]
    store = demo_store(worker)
    for room in ("!r:hs", "!other:hs"):
        await store.get_room_members(room)
    for member in [*members, "@bystander:hs"]:
        await store.get_member_rooms(member)
        await store.get_member_profile("!r:hs", member)
        await store.get_member_profile("!other:hs", member)
    await store.get_value("!r:hs")

    ids = await demo_store(main).change_room_state("!r:hs", members, {"members:!r:hs": "120 joined"})

    assert len(ids) == 3
    assert await worker.wait_for_stream_position("main", "caches", ids[-1], timeout=5)
    assert worker.caches.get("demo_room_members").keys() == [("!other:hs",)]
    assert worker.caches.get("demo_member_rooms").keys() == [("@bystander:hs",)]
    profiles = set(worker.caches.get("demo_member_profile").keys())
    assert profiles == {("!r:hs", "@bystander:hs")} | {("!other:hs", m) for m in [*members, "@bystander:hs"]}
    assert ("!r:hs",) in worker.caches.get("demo_values"), "caches that do not depend on room state are kept"
    assert await store.get_room_members("!r:hs") == "120 joined"


async def test_a_reader_that_waits_for_the_new_position_never_reads_the_stale_value(host_cluster):
    main, worker = await pair(host_cluster)
    await seed(main, worker, {"k": "0"})
    store = demo_store(worker)
    cache = worker.caches.get("demo_values")
    stream = worker.streams["caches"]
    written: list[tuple[int, int]] = []  # (stream ID, value)
    stale: list[str] = []
    stop = asyncio.Event()

    async def observe() -> None:
        # Whenever worker1's position covers a write, the cache must not hold an older value.
        while not stop.is_set():
            position = stream.current_token("main")
            newest = max((v for sid, v in list(written) if sid <= position), default=None)
            held = cache._data.get(("k",))
            if newest is not None and held is not None and int(held) < newest:
                stale.append(f"position {position} covers value {newest} but the cache holds {held}")
            await asyncio.sleep(0)

    observer = asyncio.create_task(observe())
    try:
        for i in range(1, 101):
            assert await store.get_value("k") is not None  # (re)fill the cache before each write
            [stream_id] = await demo_store(main).set_value("k", str(i))
            written.append((stream_id, i))
            assert await worker.wait_for_stream_position("main", "caches", stream_id, timeout=5)
            assert await store.get_value("k") == str(i), f"stale read after waiting for {stream_id}"
    finally:
        stop.set()
        await observer
    assert stale == []


async def test_rows_of_a_plugin_stream_invalidate_through_its_invalidation_spec(host_cluster):
    main, worker = await pair(host_cluster)
    cache = worker.caches.get("demo_notes_by_author")
    cache.set(("ada",), ["old"])
    cache.set(("bob",), ["old"])

    async with main.database().transaction() as txn:
        note_id = await main.id_generator("notes").append_txn(txn, "notes", {"author": "ada", "body": "hi"})

    assert await worker.wait_for_stream_position("main", "notes", note_id, timeout=5)
    assert cache.keys() == [("bob",)]


async def test_the_worker_writes_its_own_invalidations_and_main_applies_them(host_cluster):
    main, worker = await pair(host_cluster)
    await host_cluster.following(main, "caches")  # main follows worker1's caches-stream writes
    await seed(main, worker, {"k": "v1"})
    await demo_store(main).get_value("k")

    [stream_id] = await demo_store(worker).set_value("k", "from the worker")

    assert await main.wait_for_stream_position("worker1", "caches", stream_id, timeout=5)
    assert await demo_store(main).get_value("k") == "from the worker"


async def test_bad_rows_are_logged_with_the_row_and_skipped_and_the_stream_keeps_flowing(host_cluster, caplog):
    main, worker = await pair(host_cluster)
    await seed(main, worker, {"k": "v1"})
    store = demo_store(worker)
    await store.get_value("k")
    gen = main.id_generator("caches")
    bad = [
        {"cache_func": "no_such_cache", "keys": ["x"]},
        {"cache_func": "demo_values", "keys": ["too", "many"]},
        {"cache_func": "demo_member_profile", "keys": ["!r:hs"]},
    ]

    with caplog.at_level(logging.WARNING, logger="factstream.caches.apply"):
        async with main.database().transaction() as txn:
            for values in bad:
                await gen.append_txn(txn, "cache_invalidation_stream_by_instance", {**values, "invalidation_ts": 0})
        [stream_id] = await demo_store(main).set_value("k", "v2")
        assert await worker.wait_for_stream_position("main", "caches", stream_id, timeout=5)

    assert await store.get_value("k") == "v2"
    messages = [r.getMessage() for r in caplog.records if "skipped a caches-stream row" in r.getMessage()]
    assert len(messages) == 3
    assert "cache_func='no_such_cache'" in messages[0] and "no cache named 'no_such_cache'" in messages[0]
    assert "keys=['too', 'many']" in messages[1]
    assert "demo_member_profile" in messages[2]


@pytest.mark.parametrize("rows_behind", [250])
async def test_a_worker_that_was_away_applies_the_invalidations_it_missed_when_it_catches_up(host_cluster, rows_behind):
    main, worker = await pair(host_cluster)
    await seed(main, worker, {f"k{i}": "old" for i in range(rows_behind)})
    store = demo_store(worker)
    for i in range(rows_behind):
        await store.get_value(f"k{i}")
    await worker.disconnect_replication()

    ids = []
    for i in range(rows_behind):
        ids += await demo_store(main).set_value(f"k{i}", "new")
    assert len(worker.caches.get("demo_values")) == rows_behind, "nothing may arrive while disconnected"

    await worker.connect_replication()

    assert await worker.wait_for_stream_position("main", "caches", ids[-1], timeout=10)
    assert len(worker.caches.get("demo_values")) == 0
