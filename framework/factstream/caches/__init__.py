"""Caches: named LRU caches, ``@cached``, invalidation inside writes, and applying replicated ones.

* :mod:`~factstream.caches.lru`: one bounded cache of async lookups;
* :mod:`~factstream.caches.registry`: the process's caches (``host.caches``) and the write-side API;
* :mod:`~factstream.caches.cached`: the ``@cached`` method decorator;
* :mod:`~factstream.caches.invalidate`: rows of the caches stream (the contract with its plugin);
* :mod:`~factstream.caches.apply`: applying replicated rows, including the ``cs_cache_fake`` fan-out;
* :mod:`~factstream.caches.keys`: checking keys and their text form on the stream.
"""

from factstream.caches.cached import BoundCachedMethod, CachedMethod, cached, cached_specs
from factstream.caches.invalidate import CACHES_STREAM, MEMBERS_PER_ROW, InvalidationStream, room_state_rows
from factstream.caches.keys import BadKey
from factstream.caches.lru import LruCache
from factstream.caches.registry import CacheRegistry, UnknownCacheError

__all__ = [
    "CACHES_STREAM",
    "MEMBERS_PER_ROW",
    "BadKey",
    "BoundCachedMethod",
    "CacheRegistry",
    "CachedMethod",
    "InvalidationStream",
    "LruCache",
    "UnknownCacheError",
    "cached",
    "cached_specs",
    "room_state_rows",
]
