"""The types of ``factstream.caches``'s names, which ``__init__.py`` imports at first use (``_LAZY``)."""

from factstream.caches.cached import BoundCachedMethod, CachedMethod, cached_specs
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
    "cached_specs",
    "room_state_rows",
]
