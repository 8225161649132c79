"""Caches: named LRU caches, ``@cached``, invalidation inside writes, and applying replicated ones.

* :mod:`~factstream.caches.lru`: one bounded cache of async lookups;
* :mod:`~factstream.caches.registry`: the process's caches (``host.caches``) and the write-side API;
* :mod:`~factstream.caches.cached`: the ``@cached`` method decorator;
* :mod:`~factstream.caches.invalidate`: rows of the caches stream (the contract with its plugin);
* :mod:`~factstream.caches.apply`: applying replicated rows, including the ``cs_cache_fake`` fan-out;
* :mod:`~factstream.caches.keys`: checking keys and their text form on the stream.

This package's ``__init__`` imports nothing up front: ``HostApi`` names
:class:`~factstream.caches.lru.LruCache`, and importing the container must not load the registry, the
stream contract and the ID generator behind them (see "Layers" in docs/architecture.md). The names above
are imported from their modules at first use (``from factstream.caches import LruCache`` works).
"""

from __future__ import annotations

from factstream.lazy import lazy_names

#: The names this package offers (name -> the module defining it), each imported at first use. Not the
#: ``@cached`` decorator: its module has its name, and Python binds the module on the package once it is
#: imported (``import factstream`` does); the decorator is ``factstream.cached``.
_LAZY = {
    "BoundCachedMethod": "cached",
    "CachedMethod": "cached",
    "cached_specs": "cached",
    "CACHES_STREAM": "invalidate",
    "MEMBERS_PER_ROW": "invalidate",
    "InvalidationStream": "invalidate",
    "room_state_rows": "invalidate",
    "BadKey": "keys",
    "LruCache": "lru",
    "CacheRegistry": "registry",
    "UnknownCacheError": "registry",
}

__all__ = sorted(_LAZY)
__getattr__, __dir__ = lazy_names(__name__, _LAZY)
