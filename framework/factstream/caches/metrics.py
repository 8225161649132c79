"""Prometheus metrics of the caches, read from the live registries at scrape time.

Lookups only bump plain integers on the cache (see :mod:`factstream.caches.lru`); this collector
turns them into counters labelled by cache and instance when Prometheus scrapes. It is registered
when the first cache registry is made (:func:`track`) or a host starts (:func:`register`), not when
this module is imported (see :mod:`factstream.metrics`).
"""

from __future__ import annotations

import weakref
from collections.abc import Iterator
from typing import Any, Protocol

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from factstream import metrics
from factstream.caches.lru import LruCache


class MeteredCaches(Protocol):
    """What the collector reads of a live cache registry (:class:`~factstream.caches.CacheRegistry` is one).

    Defined here rather than importing the registry, which imports this module to be tracked.
    """

    instance_name: str

    def __iter__(self) -> Iterator[LruCache[Any]]: ...


_live: weakref.WeakSet[MeteredCaches] = weakref.WeakSet()


def track(registry: MeteredCaches) -> None:
    register()
    _live.add(registry)


def untrack(registry: MeteredCaches) -> None:
    _live.discard(registry)


class _CacheCollector(Collector):
    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        labels = ["cache", "instance"]
        hits = CounterMetricFamily("factstream_cache_hits", "Lookups answered from the cache", labels=labels)
        misses = CounterMetricFamily("factstream_cache_misses", "Lookups that had to load", labels=labels)
        evictions = CounterMetricFamily("factstream_cache_evictions", "Entries dropped for size", labels=labels)
        invalidations = CounterMetricFamily(
            "factstream_cache_invalidations", "Per-key and whole-cache invalidations applied", labels=labels
        )
        size = GaugeMetricFamily("factstream_cache_size", "Entries held", labels=labels)
        for registry in list(_live):
            for cache in registry:
                key = [cache.name, registry.instance_name]
                hits.add_metric(key, cache.hits)
                misses.add_metric(key, cache.misses)
                evictions.add_metric(key, cache.evictions)
                invalidations.add_metric(key, cache.invalidations)
                size.add_metric(key, len(cache))
        yield from (hits, misses, evictions, invalidations, size)


_COLLECTOR = _CacheCollector()


def register() -> None:
    """Register the caches' collector in the default registry (once per process)."""
    metrics.register(_COLLECTOR)
