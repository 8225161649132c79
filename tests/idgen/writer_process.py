"""A writer process for the concurrency test: appends facts to stream ``facts`` until told to stop.

Usage: python writer_process.py DB_URL INSTANCE WRITERS(comma) SECONDS SEED

Each fact is one transaction: reserve an ID, insert the row, hold the transaction open for a random
moment (so a SIGKILL is likely to land mid-transaction), then commit or, one time in five, roll back.
Prints ``ready`` once started, then ``commit N`` / ``rollback N`` lines.
"""

from __future__ import annotations

import asyncio
import random
import sys

from sqlalchemy import text

from factstream.db.database import Database
from factstream.idgen.generator import MultiWriterIdGenerator
from factstream.idgen.leases import WriterLeases


class Rollback(Exception):
    pass


async def main(url: str, instance: str, writers: list[str], seconds: float, seed: int) -> None:
    rng = random.Random(seed)
    db = Database.from_url(url, instance_name=instance, pool_size=4)
    leases = WriterLeases(db)
    gen = MultiWriterIdGenerator(
        db,
        stream_name="facts",
        sequence_name="facts_seq",
        tables=[("facts", "instance_name", "stream_id")],
        writers=writers,
        instance_name=instance,
        leases=leases,
        persist_interval=0.02,
    )
    await gen.start()
    print("ready", flush=True)
    insert = text("INSERT INTO facts (stream_id, instance_name, payload) VALUES (:id, :inst, 'x')")
    loop = asyncio.get_running_loop()
    deadline = loop.time() + seconds

    async def one_writer() -> None:
        while loop.time() < deadline:
            stream_id = None
            try:
                async with db.transaction() as txn:
                    stream_id = await gen.get_next_txn(txn)
                    await txn.execute(insert, {"id": stream_id, "inst": instance})
                    await asyncio.sleep(rng.random() * 0.02)
                    if rng.random() < 0.2:
                        raise Rollback
                print(f"commit {stream_id}", flush=True)
            except Rollback:
                print(f"rollback {stream_id}", flush=True)
            await asyncio.sleep(rng.random() * 0.005)

    await asyncio.gather(*(one_writer() for _ in range(3)))
    await gen.close()
    await leases.close()
    await db.close()


if __name__ == "__main__":
    url, instance, writers, seconds, seed = sys.argv[1:6]
    asyncio.run(main(url, instance, writers.split(","), float(seconds), int(seed)))
