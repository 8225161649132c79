"""LruCache: bounded LRU, hits and misses, invalidation, and loads that an invalidation overtakes."""

from __future__ import annotations

import asyncio

import pytest

from factstream.caches.lru import LruCache


def test_the_least_recently_used_entry_is_evicted_beyond_max_size():
    cache: LruCache[str] = LruCache("c", max_size=2)
    cache.set(("a",), "A")
    cache.set(("b",), "B")
    assert cache.get(("a",)) == "A"  # a is now more recent than b

    cache.set(("c",), "C")

    assert cache.keys() == [("a",), ("c",)]
    assert cache.evictions == 1


def test_hits_misses_and_invalidations_are_counted():
    cache: LruCache[int] = LruCache("c", max_size=10)
    cache.set(("k",), 1)

    assert cache.get(("k",)) == 1
    assert cache.get(("other",), "default") == "default"
    assert cache.invalidate(("k",)) is True
    assert cache.invalidate(("k",)) is False
    cache.set(("x",), 2)
    cache.set(("y",), 3)
    assert cache.invalidate_all() == 2

    assert (cache.hits, cache.misses, cache.invalidations, len(cache)) == (1, 1, 3, 0)


async def test_concurrent_lookups_of_one_key_share_one_load():
    cache: LruCache[str] = LruCache("c", max_size=10)
    calls = 0
    release = asyncio.Event()

    async def load() -> str:
        nonlocal calls
        calls += 1
        await release.wait()
        return "value"

    tasks = [asyncio.create_task(cache.get_or_load(("k",), load)) for _ in range(5)]
    await asyncio.sleep(0)
    release.set()

    assert await asyncio.gather(*tasks) == ["value"] * 5
    assert calls == 1
    assert cache.get(("k",)) == "value"


async def test_a_load_overtaken_by_an_invalidation_is_returned_but_not_cached():
    cache: LruCache[str] = LruCache("c", max_size=10)
    release = asyncio.Event()

    async def slow_old_read() -> str:
        await release.wait()
        return "old"

    reader = asyncio.create_task(cache.get_or_load(("k",), slow_old_read))
    await asyncio.sleep(0)
    cache.invalidate(("k",))  # a write committed while the read was in flight
    release.set()

    assert await reader == "old"
    assert ("k",) not in cache

    async def fresh_read() -> str:
        return "new"

    assert await cache.get_or_load(("k",), fresh_read) == "new"


async def test_invalidate_all_also_forgets_loads_in_flight():
    cache: LruCache[str] = LruCache("c", max_size=10)
    release = asyncio.Event()

    async def slow() -> str:
        await release.wait()
        return "old"

    reader = asyncio.create_task(cache.get_or_load(("k",), slow))
    await asyncio.sleep(0)
    cache.invalidate_all()
    release.set()
    await reader

    assert len(cache) == 0


async def test_a_failed_load_caches_nothing_and_every_sharer_sees_the_error():
    cache: LruCache[str] = LruCache("c", max_size=10)
    release = asyncio.Event()

    async def broken() -> str:
        await release.wait()
        raise RuntimeError("database down")

    first = asyncio.create_task(cache.get_or_load(("k",), broken))
    await asyncio.sleep(0)
    second = asyncio.create_task(cache.get_or_load(("k",), broken))
    await asyncio.sleep(0)
    release.set()

    for task in (first, second):
        with pytest.raises(RuntimeError, match="database down"):
            await task
    assert ("k",) not in cache


async def test_when_the_loading_caller_is_cancelled_a_waiting_caller_loads_itself():
    cache: LruCache[str] = LruCache("c", max_size=10)
    never = asyncio.Event()

    async def hangs() -> str:
        await never.wait()
        return "never"

    async def quick() -> str:
        return "mine"

    loader = asyncio.create_task(cache.get_or_load(("k",), hangs))
    await asyncio.sleep(0)
    waiter = asyncio.create_task(cache.get_or_load(("k",), quick))
    await asyncio.sleep(0)
    loader.cancel()

    assert await waiter == "mine"
    with pytest.raises(asyncio.CancelledError):
        await loader
