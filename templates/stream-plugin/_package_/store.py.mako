"""Appending facts and reading them through a cache: one ``${camel}Store`` per host process.

``host.state(${camel}Store)`` makes it on first use and returns the same one after.
"""

from __future__ import annotations

from factstream import Caches, HostApi, cached

from ${package}.rows import COUNT_CACHE, STREAM, ${camel}Row

_COUNT = "SELECT count(*) FROM ${name} WHERE key = %(key)s"


class ${camel}Store:
    """Appends facts to the stream and counts a key's facts through a cache."""

    def __init__(self, host: HostApi) -> None:
        self.host = host
        self.writer = host.stream(STREAM, ${camel}Row)
        #: Where the ``@cached`` methods find their caches.
        self.caches: Caches = host.caches

    async def append(self, row: ${camel}Row) -> int:
        """Append one fact and return its stream ID (only on a writer of the stream)."""
        async with self.host.database().transaction() as txn:
            return await self.writer.append(txn, row)

    @cached(name=COUNT_CACHE, max_size=100_000)
    async def count(self, key: str) -> int:
        """How many facts ``key`` has. Every new fact of that key, written anywhere, invalidates the entry."""
        rows = await self.host.database().fetchall(_COUNT, {"key": key})
        return int(rows[0][0])
