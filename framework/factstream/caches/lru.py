"""``LruCache``: one named, size-bounded, least-recently-used cache of async lookups.

Keys are tuples (one component per argument of the cached lookup). Besides get/set it offers
``get_or_load``, which shares one in-flight load between concurrent callers of the same key and,
crucially, never stores the result of a load that an invalidation overtook:

    a reader starts loading key K from the database (reads the old value) ...
    ... a writer commits a new value and K is invalidated ...
    ... the reader's load finishes.

Storing that result would make the cache stale after the invalidation that was meant to clear it.
An invalidation therefore also forgets K's in-flight load: the load's caller still gets its value
(it asked before the change), but it is not cached, and the next caller loads afresh.

Counters (hits, misses, evictions, invalidations) are plain integers read by the metrics collector
at scrape time, so a lookup costs no Prometheus call. Not thread-safe: use it from one event loop.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Hashable
from typing import Any, Generic, TypeVar

V = TypeVar("V")
Key = tuple[Hashable, ...]

_MISSING: Any = object()


class LruCache(Generic[V]):
    """A bounded LRU map from key tuples to values (see the module docstring)."""

    __slots__ = ("_data", "_loading", "evictions", "hits", "invalidations", "max_size", "misses", "name")

    def __init__(self, name: str, max_size: int) -> None:
        if max_size < 1:
            raise ValueError(f"cache {name!r}: max_size must be at least 1")
        self.name = name
        self.max_size = max_size
        self._data: OrderedDict[Key, V] = OrderedDict()
        self._loading: dict[Key, asyncio.Future[V]] = {}
        self.hits = 0
        self.misses = 0
        self.evictions = 0
        self.invalidations = 0

    def __len__(self) -> int:
        return len(self._data)

    def __contains__(self, key: object) -> bool:
        return key in self._data

    def keys(self) -> list[Key]:
        """The cached keys, least recently used first."""
        return list(self._data)

    # -- reading -----------------------------------------------------------------------------------

    def get(self, key: Key, default: Any = None) -> V | Any:
        """The cached value (and mark it recently used), else ``default``; counts a hit or a miss."""
        value = self._data.get(key, _MISSING)
        if value is _MISSING:
            self.misses += 1
            return default
        self._data.move_to_end(key)
        self.hits += 1
        return value

    def set(self, key: Key, value: V) -> None:
        """Store ``value``; the least recently used entries beyond ``max_size`` are evicted."""
        data = self._data
        data[key] = value
        data.move_to_end(key)
        while len(data) > self.max_size:
            data.popitem(last=False)
            self.evictions += 1

    async def get_or_load(self, key: Key, load: Callable[[], Awaitable[V]]) -> V:
        """The cached value, else the result of ``load()`` (cached unless invalidated meanwhile).

        Concurrent callers of one key share one load. If the load raises, nothing is cached and every
        caller sharing it gets the exception.
        """
        while True:
            found = self._data.get(key, _MISSING)
            if found is not _MISSING:
                self._data.move_to_end(key)
                self.hits += 1
                return found  # type: ignore[no-any-return]
            pending = self._loading.get(key)
            if pending is None:
                break
            self.hits += 1
            try:
                return await asyncio.shield(pending)
            except asyncio.CancelledError:
                task = asyncio.current_task()
                if pending.cancelled() and task is not None and not task.cancelling():
                    continue  # the loader was cancelled, not us: load ourselves
                raise
        self.misses += 1
        future: asyncio.Future[V] = asyncio.get_running_loop().create_future()
        self._loading[key] = future
        try:
            value = await load()
        except BaseException as exc:
            if self._loading.get(key) is future:
                del self._loading[key]
            if isinstance(exc, asyncio.CancelledError):
                future.cancel()
            else:
                future.set_exception(exc)
                future.exception()  # retrieved: no "never retrieved" warning when nobody shared it
            raise
        if self._loading.get(key) is future:
            del self._loading[key]
            self.set(key, value)
        future.set_result(value)
        return value

    # -- invalidation ------------------------------------------------------------------------------

    def invalidate(self, key: Key) -> bool:
        """Forget ``key`` and any in-flight load of it; returns whether a value was cached."""
        self.invalidations += 1
        self._loading.pop(key, None)
        return self._data.pop(key, _MISSING) is not _MISSING

    def invalidate_all(self) -> int:
        """Forget everything, including in-flight loads; returns how many values were cached."""
        self.invalidations += 1
        count = len(self._data)
        self._data.clear()
        self._loading.clear()
        return count

    def __repr__(self) -> str:
        return f"<LruCache {self.name} {len(self._data)}/{self.max_size}>"
