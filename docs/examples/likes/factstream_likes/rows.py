"""The ``likes`` stream: its row, its table, and which cached counts a row makes stale."""

from __future__ import annotations

import msgspec

from factstream import InvalidationSpec, StreamSpec, StreamTable

STREAM = "likes"
#: The cache of likes per target, keyed ``(target,)`` (declared by ``LikesStore.count``).
COUNT_CACHE = "likes_per_target"


class LikeRow(msgspec.Struct, frozen=True):
    """One like: replication sends it as ``[user_id, target]``, the ``likes`` table has both columns."""

    user_id: str
    target: str


LIKES_STREAM = StreamSpec(
    name=STREAM,
    row_type=LikeRow,
    tables=(StreamTable(table="likes", instance_column="instance_name", id_column="stream_id"),),
    sync_key="likes_key",
    user_field="user_id",  # /sync shows a like to its user only, and wakes only that user
    description="who likes what: one fact per like",
)


def stale_counts(row: LikeRow) -> list[tuple[str]]:
    """A like changes the count of its target, and nothing else."""
    return [(row.target,)]


COUNT_INVALIDATION = InvalidationSpec(stream=STREAM, cache=COUNT_CACHE, keys=stale_counts)
