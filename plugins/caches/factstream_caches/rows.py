"""The ``caches`` stream: its row type and spec."""

from __future__ import annotations

from typing import Any

import msgspec

from factstream import StreamSpec, StreamTable

TABLE = "cache_invalidation_stream_by_instance"
SEQUENCE = "cache_invalidation_stream_seq"


class CacheInvalidationRow(msgspec.Struct, frozen=True):
    """One invalidation as replication sends it: ``[cache_func, keys, invalidation_ts]``.

    ``keys`` holds one key's components (text in the table), or ``None`` to clear the whole cache;
    for ``cs_cache_fake`` it is ``[room_id, *members_changed]``. It is typed loosely on purpose: a
    key of the wrong shape must reach the cache registry, which logs the row and skips it, rather
    than being dropped unexplained by the wire decoder.
    """

    cache_func: str
    keys: list[Any] | None
    invalidation_ts: int | None


CACHES_STREAM = StreamSpec(
    name="caches",
    row_type=CacheInvalidationRow,
    tables=(StreamTable(TABLE, "instance_name", "stream_id"),),
    sequence=SEQUENCE,
    writers="any",
    description="cache invalidations: every instance writes its own; every other instance applies them",
)
