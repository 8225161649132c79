"""Caches: named LRU caches, ``@cached``, invalidation inside writes, and applying replicated ones.

* :mod:`~factstream.caches.lru`: one bounded cache of async lookups;
* :mod:`~factstream.caches.registry`: the process's caches (``host.caches``) and the write-side API;
* :mod:`~factstream.caches.cached`: the ``@cached`` method decorator;
* :mod:`~factstream.caches.invalidate`: rows of the caches stream (the contract with its plugin);
* :mod:`~factstream.caches.apply`: applying replicated rows, including the ``cs_cache_fake`` fan-out;
* :mod:`~factstream.caches.keys`: checking keys and their text form on the stream.

This package's ``__init__`` imports nothing: ``HostApi`` names :class:`~factstream.caches.lru.LruCache`,
and importing the container must not load the registry, the stream contract and the ID generator
behind them (see "Layers" in docs/architecture.md).
"""
