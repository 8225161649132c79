"""Writing likes and counting them (``LikesStore``), and the likes a process saw last (``RecentLikes``).

Both are per host process: ``host.state(LikesStore)`` makes one on first use and returns it after.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence

from factstream import Caches, HostApi, cached
from factstream_likes.rows import COUNT_CACHE, STREAM, LikeRow
from factstream_likes.settings import LikesSettings

_COUNT = "SELECT count(*) FROM likes WHERE target = %(target)s"


class LikesStore:
    """Appends likes to the stream and counts a target's likes through a cache."""

    def __init__(self, host: HostApi) -> None:
        self.host = host
        self.writer = host.stream(STREAM, LikeRow)
        #: Where the ``@cached`` methods find their caches.
        self.caches: Caches = host.caches

    async def add(self, like: LikeRow) -> int:
        """Append one like and return its stream ID (only on a writer of the stream)."""
        async with self.host.database().transaction() as txn:
            return await self.writer.append(txn, like)

    @cached(name=COUNT_CACHE, max_size=100_000)
    async def count(self, target: str) -> int:
        """How many likes ``target`` has. Every like of it, written anywhere, invalidates the entry."""
        rows = await self.host.database().fetchall(_COUNT, {"target": target})
        return int(rows[0][0])


class RecentLikes:
    """The likes this process saw last, newest first, kept by ``remember_likes`` (in memory, from start-up)."""

    def __init__(self, host: HostApi) -> None:
        size = host.plugin_settings(LikesSettings).recent_likes
        self.likes: deque[dict[str, str | int]] = deque(maxlen=size)

    def add(self, instance: str, token: int, likes: Sequence[LikeRow]) -> None:
        for like in likes:
            self.likes.appendleft(
                {"stream_id": token, "instance": instance, "user_id": like.user_id, "target": like.target}
            )
