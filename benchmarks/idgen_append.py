"""Facts per second appending one-row facts to a stream table, against a baseline measured in the same run.

Baseline: plain psycopg doing ``SELECT nextval``, ``INSERT``, ``COMMIT`` per fact on one connection
(N writers = N threads, one connection each). factstream, per fact, in ``Database.transaction()``
(N writers = N asyncio tasks sharing one generator): ``append_txn`` (the ID is reserved by the
INSERT itself) and ``get_next_txn`` followed by an ``INSERT``. Batched, 100 facts per transaction:
``append_many_txn`` (one statement) and ``get_next_mult_txn(100)`` + one ``COPY``.
Measurements of one comparison alternate in short rounds so that drift in the disk's sync latency
hits the baseline and factstream alike.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass

import psycopg
from sqlalchemy import text

from factstream.db.database import Database
from factstream.db.engine import libpq_url
from factstream.idgen.generator import MultiWriterIdGenerator
from factstream.idgen.leases import WriterLeases
from factstream.idgen.sequence import create_sequence_sql


@dataclass
class Result:
    name: str
    facts: int
    seconds: float

    @property
    def rate(self) -> float:
        return self.facts / self.seconds


def prepare(url: str) -> None:
    with psycopg.connect(libpq_url(url), autocommit=True) as conn:
        for table in ("bench_facts", "bench_baseline"):
            conn.execute(f"DROP TABLE IF EXISTS {table}")
            conn.execute(f"CREATE TABLE {table} (stream_id BIGINT NOT NULL, instance_name TEXT NOT NULL, payload TEXT)")
        for seq in ("bench_facts_seq", "bench_baseline_seq"):
            conn.execute(f"DROP SEQUENCE IF EXISTS {seq}")
            for statement in create_sequence_sql(seq):
                conn.execute(statement)
        conn.execute("DELETE FROM stream_positions WHERE stream_name = 'bench_facts'")


def baseline(url: str, writers: int, seconds: float) -> Result:
    counts = [0] * writers
    stop = time.monotonic() + seconds

    def run(i: int) -> None:
        with psycopg.connect(libpq_url(url)) as conn:
            while time.monotonic() < stop:
                (stream_id,) = conn.execute("SELECT nextval('bench_baseline_seq')").fetchone()  # type: ignore[misc]
                conn.execute(
                    "INSERT INTO bench_baseline (stream_id, instance_name, payload) VALUES (%s, %s, %s)",
                    (stream_id, "main", "fact"),
                )
                conn.commit()
                counts[i] += 1

    start = time.monotonic()
    threads = [threading.Thread(target=run, args=(i,)) for i in range(writers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return Result(f"baseline psycopg, {writers} writer(s)", sum(counts), time.monotonic() - start)


@asynccontextmanager
async def appender(url: str, pool_size: int) -> AsyncIterator[tuple[Database, MultiWriterIdGenerator]]:
    """A database and a started generator for stream ``bench_facts``, closed afterwards."""
    db = Database.from_url(url, instance_name="main", pool_size=pool_size)
    leases = WriterLeases(db)
    gen = MultiWriterIdGenerator(
        db,
        stream_name="bench_facts",
        sequence_name="bench_facts_seq",
        tables=[("bench_facts", "instance_name", "stream_id")],
        writers=["main"],
        instance_name="main",
        leases=leases,
    )
    await gen.start()
    try:
        yield db, gen
    finally:
        await gen.close()
        await leases.close()
        await db.close()


async def single_fact(url: str, writers: int, seconds: float, *, append: bool = True) -> Result:
    insert = text("INSERT INTO bench_facts (stream_id, instance_name, payload) VALUES (:id, 'main', 'fact')")
    counts = [0] * writers
    async with appender(url, writers + 2) as (db, gen):
        loop = asyncio.get_running_loop()
        stop = loop.time() + seconds

        async def run(i: int) -> None:
            while loop.time() < stop:
                async with db.transaction() as txn:
                    if append:
                        await gen.append_txn(txn, "bench_facts", {"payload": "fact"})
                    else:
                        stream_id = await gen.get_next_txn(txn)
                        await txn.execute(insert, {"id": stream_id})
                counts[i] += 1

        start = loop.time()
        await asyncio.gather(*(run(i) for i in range(writers)))
        elapsed = loop.time() - start
        assert gen.get_current_token() >= sum(counts) + 1, "the watermark must cover every appended fact"
    how = "append_txn" if append else "get_next_txn + INSERT"
    return Result(f"factstream {how}, {writers} writer(s)", sum(counts), elapsed)


async def batched(url: str, seconds: float, batch: int = 100) -> Result:
    """``get_next_mult_txn(batch)`` and one ``COPY`` of the rows per transaction."""
    count = 0
    async with appender(url, 4) as (db, gen):
        loop = asyncio.get_running_loop()
        stop = loop.time() + seconds
        start = loop.time()
        while loop.time() < stop:
            async with db.transaction() as txn:
                ids = await gen.get_next_mult_txn(txn, batch)
                async with (
                    txn.conn.cursor() as cur,
                    cur.copy("COPY bench_facts (stream_id, instance_name, payload) FROM STDIN") as copy,
                ):
                    await copy.write("".join(f"{stream_id}\tmain\tfact\n" for stream_id in ids))
            count += batch
        elapsed = loop.time() - start
    return Result(f"factstream batched get_next_mult({batch}) + COPY", count, elapsed)


def interleaved(rounds: int, seconds: float, *runs: Callable[[float], Result]) -> list[Result]:
    """Run each measurement ``rounds`` times, alternating, and add them up.

    The disk's sync latency drifts by tens of percent within a minute on these machines;
    alternating short rounds exposes the baseline and factstream to the same drift.
    """
    totals: list[Result] = []
    for r in range(rounds):
        for i, fn in enumerate(runs):
            result = fn(seconds / rounds)
            if r == 0:
                totals.append(result)
            else:
                totals[i].facts += result.facts
                totals[i].seconds += result.seconds
    return totals


def run(url: str, seconds: float = 3.0, rounds: int = 4) -> list[str]:
    """Run every measurement; return report lines with the ratios against the baseline."""
    prepare(url)
    lines = []
    base1, ours1, split1 = interleaved(
        rounds,
        seconds,
        lambda s: baseline(url, 1, s),
        lambda s: asyncio.run(single_fact(url, 1, s)),
        lambda s: asyncio.run(single_fact(url, 1, s, append=False)),
    )
    base4, ours4, split4 = interleaved(
        rounds,
        seconds,
        lambda s: baseline(url, 4, s),
        lambda s: asyncio.run(single_fact(url, 4, s)),
        lambda s: asyncio.run(single_fact(url, 4, s, append=False)),
    )
    bulk_append, bulk = interleaved(
        rounds, seconds, lambda s: asyncio.run(batched_append(url, s)), lambda s: asyncio.run(batched(url, s))
    )
    pairs = ((base1, None), (ours1, base1), (split1, base1), (base4, None), (ours4, base4), (split4, base4))
    for result, against in pairs:
        ratio = f"  {result.rate / against.rate:5.2f}x baseline (target >= 0.8x)" if against else ""
        lines.append(f"{result.name:48s} {result.rate:10,.0f} facts/s{ratio}")
    for result in (bulk_append, bulk):
        lines.append(
            f"{result.name:48s} {result.rate:10,.0f} facts/s  {result.rate / base1.rate:5.1f}x baseline "
            "(target >= 100,000 facts/s)"
        )
    return lines


async def batched_append(url: str, seconds: float, batch: int = 100) -> Result:
    """``append_many_txn``: a batch of facts reserved and inserted by one statement."""
    rows = [{"payload": "fact"}] * batch
    count = 0
    async with appender(url, 4) as (db, gen):
        loop = asyncio.get_running_loop()
        stop = loop.time() + seconds
        start = loop.time()
        while loop.time() < stop:
            async with db.transaction() as txn:
                await gen.append_many_txn(txn, "bench_facts", rows)
            count += batch
        elapsed = loop.time() - start
    return Result(f"factstream batched append_many_txn({batch})", count, elapsed)
