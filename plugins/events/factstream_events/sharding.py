"""Which writer of the ``events`` stream writes a room: rendezvous hashing of the room ID.

With ``stream_writers.events: [a, b, ...]`` each room belongs to exactly one writer, and every
process computes the same owner from the room ID and the configured writer names alone (no table,
no coordination): :func:`writer_for`. The owner is the writer whose hash of ``(writer name, room
ID)`` is highest ("highest random weight", or rendezvous, hashing).

Why rendezvous hashing and not ``hash(room) % len(writers)``: the owner does not depend on the
order of the list, and adding a writer moves only the rooms the new writer now wins (about ``1 /
(N + 1)`` of them, all to the new writer); removing a writer moves only its own rooms, each to the
writer that scored next. A modulo mapping would move almost every room on any change.

A room moves only when the writer list changes, which is a configuration change: the writers are
restarted with the new list, and a room's new owner then writes it from what the database holds
(docs/plugins/events.md, "Several writers"). The ``backfill`` stream is sharded the same way, by the
``events`` writers.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Sequence

__all__ = ["writer_for", "writers_score"]


def writers_score(writer: str, room_id: str) -> int:
    """The weight of ``writer`` for ``room_id``: the first 8 bytes of SHA-256 over both, as an integer."""
    digest = hashlib.sha256(
        b"%b\x00%b" % (writer.encode("utf-8", "surrogatepass"), room_id.encode("utf-8", "surrogatepass"))
    )
    return int.from_bytes(digest.digest()[:8], "big")


@functools.lru_cache(maxsize=65_536)
def _owner(room_id: str, writers: tuple[str, ...]) -> str:
    return max(writers, key=lambda w: (writers_score(w, room_id), w))


def writer_for(room_id: str, writers: Sequence[str]) -> str:
    """The writer of ``room_id`` among ``writers`` (order does not matter); ``ValueError`` if none."""
    if not writers:
        raise ValueError("the events stream has no writers to shard rooms between")
    if len(writers) == 1:
        return writers[0]
    return _owner(room_id, tuple(sorted(writers)))
