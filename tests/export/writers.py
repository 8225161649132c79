"""Writers for the export tests: real ``MultiWriterIdGenerator``s (with leases) appending facts."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping, Sequence
from typing import Any

from factstream import Database, StreamSpec
from factstream.idgen.generator import MultiWriterIdGenerator
from factstream.idgen.leases import WriterLeases


class Writer:
    """One writer instance of one stream (a process of its own, as far as PostgreSQL can tell)."""

    def __init__(self, url: str, spec: StreamSpec, instance: str) -> None:
        self.db = Database.from_url(url, instance_name=instance, pool_size=3)
        self.leases = WriterLeases(self.db)
        self.gen = MultiWriterIdGenerator(
            self.db,
            stream_name=spec.name,
            sequence_name=spec.sequence,
            tables=list(spec.tables),
            writers=[],
            instance_name=instance,
            positive=spec.positive,
            leases=self.leases,
            persist_interval=0.02,
        )
        self._held: list[asyncio.Event] = []

    async def start(self) -> Writer:
        await self.gen.start()
        return self

    async def append(self, table: str, rows: Sequence[Mapping[str, Any]]) -> list[int]:
        """Commit ``rows`` (one fact each) in one transaction; returns their stream IDs."""
        async with self.db.transaction() as txn:
            ids = await self.gen.append_many_txn(txn, table, rows)
        await self.gen.flush_position()
        return ids

    async def hold(self, table: str, row: Mapping[str, Any]) -> tuple[int, asyncio.Event, asyncio.Task[None]]:
        """Reserve an ID and write its row in a transaction left open until the event is set."""
        ready: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        release = asyncio.Event()

        async def txn_body() -> None:
            async with self.db.transaction() as txn:
                stream_id = await self.gen.append_txn(txn, table, row)
                ready.set_result(stream_id)
                await release.wait()

        task = asyncio.get_running_loop().create_task(txn_body())
        return await ready, release, task

    async def close(self) -> None:
        await self.gen.close()
        await self.leases.close()
        await self.db.close()
