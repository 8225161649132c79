"""A writer that keeps running while its stream's sequence goes back (a database failover).

PostgreSQL logs sequence advances ahead, 32 at a time, and flushes them only with a commit: after a
failover the sequence can be up to 32 behind IDs already handed out and committed. Start-up repairs
that; these tests are about a process that runs through it. Writer ``b`` keeps appending while
writer ``a`` holds an ID in an open transaction, so ``b``'s watermark stays low and cannot catch a
re-issued ID; only the rule that every new ID lies above the highest one seen allocated can.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AsyncExitStack
from dataclasses import dataclass, field

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from prometheus_client import REGISTRY, generate_latest

from factstream.db.database import Database
from factstream.db.engine import libpq_url
from factstream.idgen.errors import IdGeneratorError
from factstream.idgen.generator import MultiWriterIdGenerator
from tests.idgen.conftest import GeneratorFactory

MARGIN = 100
WRITERS = ["a", "b"]


def sql(url: str, statement: str) -> list[tuple]:
    with psycopg.connect(libpq_url(url), autocommit=True) as conn:
        conn.execute("SET lock_timeout = '10s'")  # DDL on facts waits for a's open transaction
        cur = conn.execute(statement)
        return cur.fetchall() if cur.description else []


def set_back(url: str, by: int) -> None:
    """Move the sequence back by ``by`` IDs, as a failover to a replica that lacked its last advances."""
    if by:
        sql(url, f"SELECT setval('facts_seq', last_value - {by}) FROM facts_seq")


def counter(name: str) -> float:
    return REGISTRY.get_sample_value(name, {"stream": "facts"}) or 0.0


def duplicates(url: str) -> list[tuple]:
    return sql(url, "SELECT stream_id, count(*) FROM facts GROUP BY stream_id HAVING count(*) > 1")


# -- the four ways to reserve, each writing one row per ID it gets --------------------------------------

Append = Callable[[MultiWriterIdGenerator, Database, int], Awaitable[list[int]]]


async def by_get_next_mult(gen: MultiWriterIdGenerator, db: Database, n: int) -> list[int]:
    async with gen.get_next_mult(n) as ids, db.transaction() as txn:
        for stream_id in ids:
            await insert(txn.conn, stream_id, gen.instance_name)
    return ids


async def by_get_next_mult_txn(gen: MultiWriterIdGenerator, db: Database, n: int) -> list[int]:
    async with db.transaction() as txn:
        ids = await gen.get_next_mult_txn(txn, n)
        for stream_id in ids:
            await insert(txn.conn, stream_id, gen.instance_name)
    return ids


async def by_append_txn(gen: MultiWriterIdGenerator, db: Database, n: int) -> list[int]:
    async with db.transaction() as txn:
        return [await gen.append_txn(txn, "facts", {"payload": f"fact {i}"}) for i in range(n)]


async def by_append_many_txn(gen: MultiWriterIdGenerator, db: Database, n: int) -> list[int]:
    async with db.transaction() as txn:
        return await gen.append_many_txn(txn, "facts", [{"payload": f"fact {i}"} for i in range(n)])


async def insert(conn: psycopg.AsyncConnection, stream_id: int, instance: str) -> None:
    await conn.execute(
        "INSERT INTO facts (stream_id, instance_name, payload) VALUES (%s, %s, 'fact')", (stream_id, instance)
    )


PATHS: dict[str, Append] = {
    "get_next_mult": by_get_next_mult,
    "get_next_mult_txn": by_get_next_mult_txn,
    "append_txn": by_append_txn,
    "append_many_txn": by_append_many_txn,
}


@dataclass
class Failover:
    """Writers ``a`` and ``b``; ``a`` holds ID 2 in an open transaction until :meth:`finish`."""

    url: str
    db: Database
    a: MultiWriterIdGenerator
    b: MultiWriterIdGenerator
    held: int
    open_transaction: AsyncExitStack
    written: list[int] = field(default_factory=list)

    async def append(self, path: str, n: int) -> list[int]:
        """``b`` appends ``n`` facts; they must all be new, above everything ``b`` had seen."""
        seen = self.b.tracker.max_seen
        ids = await PATHS[path](self.b, self.db, n)
        assert len(ids) == n
        assert min(ids) > seen, (path, ids, seen)
        self.written += ids
        return ids

    async def finish(self) -> None:
        """``a`` commits, then both announce their positions to each other, as replication would."""
        await self.open_transaction.aclose()
        self.b.advance("a", self.a.get_current_token_for_writer("a"))
        self.a.advance("b", self.b.get_current_token_for_writer("b"))
        self.b.advance("a", self.a.get_current_token_for_writer("a"))


@pytest.fixture
async def failover(stream_db: str, db: Database, make_gen: GeneratorFactory) -> AsyncIterator[Failover]:
    a = await make_gen("a", writers=WRITERS, repair_margin=MARGIN)
    b = await make_gen("b", writers=WRITERS, repair_margin=MARGIN)
    async with AsyncExitStack() as stack:
        txn = await stack.enter_async_context(db.transaction())
        held = await a.get_next_txn(txn)
        await insert(txn.conn, held, "a")
        run = Failover(stream_db, db, a, b, held, stack.pop_all())
    yield run
    await run.open_transaction.aclose()  # if the test did not finish()


@pytest.mark.parametrize("path", sorted(PATHS))
async def test_a_writer_running_through_a_failover_never_reissues_used_ids(failover, path, caplog):
    for _ in range(8):
        await failover.append(path, 5)  # 40 facts, all committed
    assert failover.b.get_current_token() < failover.held  # held low by a's open transaction
    repairs, reissues = counter("factstream_sequence_repairs_total"), counter("factstream_sequence_reissues_total")

    set_back(failover.url, 32)
    with caplog.at_level(logging.WARNING, logger="factstream.idgen.generator"):
        after = [await failover.append(path, 5) for _ in range(3)]

    assert duplicates(failover.url) == []
    last = max(failover.written[:40])
    assert after[0][0] == last + MARGIN + 1  # the sequence jumped past everything known, by the margin
    assert after[1][0] > after[0][-1] and after[2][0] > after[1][-1]  # and appends went on from there
    assert counter("factstream_sequence_reissues_total") == reissues + 1
    assert counter("factstream_sequence_repairs_total") == repairs + 1
    [warning] = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warning.startswith("stream facts: sequence facts_seq is behind IDs already used (it handed out ")
    assert f" at or below ID {last}, which this process had already seen allocated)" in warning
    assert warning.endswith(f" to {last + MARGIN}")
    await failover.finish()
    assert failover.b.get_current_token() == max(failover.written)


async def test_the_reissue_counter_is_on_metrics_from_start(make_gen):
    await make_gen()

    assert 'factstream_sequence_reissues_total{stream="facts"}' in generate_latest(REGISTRY).decode()


async def test_the_refused_rows_of_an_append_are_never_written_even_uncommitted(failover):
    await failover.append("append_many_txn", 10)
    set_back(failover.url, 3)  # the next batch straddles: three IDs re-issued, the rest new

    async with failover.db.transaction() as txn:
        ids = await failover.b.append_many_txn(txn, "facts", [{"payload": p} for p in "abcdef"])
        cur = await txn.conn.execute("SELECT stream_id, payload FROM facts WHERE instance_name = 'b' ORDER BY 1")
        rows = await cur.fetchall()

    assert rows[10:] == list(zip(ids, "abcdef", strict=True))  # in the rows' order, nothing else written
    assert ids[0] == failover.written[-1] + MARGIN + 1
    assert duplicates(failover.url) == []


@pytest.fixture
def unique_ids(stream_db: str) -> None:
    sql(stream_db, "CREATE UNIQUE INDEX facts_stream_id ON facts (stream_id)")


@pytest.fixture
def rows_dropped(stream_db: str) -> None:
    """A trigger drops every row inserted into ``facts``: every append writes nothing."""
    sql(
        stream_db,
        "CREATE FUNCTION drop_row() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN RETURN NULL; END $$;"
        "CREATE TRIGGER drop_rows BEFORE INSERT ON facts FOR EACH ROW EXECUTE FUNCTION drop_row()",
    )


async def test_an_append_after_a_failover_succeeds_on_a_table_with_a_unique_id_index(unique_ids, failover):
    await failover.append("append_txn", 3)
    set_back(failover.url, 2)

    # Writing the re-issued ID and fixing it afterwards would have aborted the transaction here.
    [stream_id] = await failover.append("append_txn", 1)

    assert stream_id == failover.written[-2] + MARGIN + 1


async def test_an_append_that_keeps_writing_nothing_gives_up_after_a_few_repairs(rows_dropped, failover):
    # As if the sequence went back again after every repair.
    with pytest.raises(IdGeneratorError, match=r"still hands out IDs at or below \d+, .* after 3 repairs"):
        await failover.append("append_many_txn", 2)

    assert failover.b.tracker.in_flight == 0
    assert failover.b.tracker.unfinished == frozenset()


# -- the property: whatever the failovers, no stream ID lands twice ---------------------------------------

STEP = st.tuples(
    st.sampled_from(sorted(PATHS)),
    st.sampled_from([0, 0, 1, 2, 5, 31, 32, 40]),  # how far the sequence goes back before the step
    st.integers(min_value=1, max_value=6),  # facts appended
)


async def test_whatever_the_sequence_loses_no_stream_id_is_used_twice(failover):
    await failover.append("append_many_txn", 50)  # room to go back 40
    loop = asyncio.get_running_loop()
    before = counter("factstream_sequence_reissues_total")
    went_back = 0

    async def run(steps: list[tuple[str, int, int]]) -> None:
        nonlocal went_back
        for path, by, n in steps:
            set_back(failover.url, by)
            await failover.append(path, n)
            if by:
                went_back += 1
        assert duplicates(failover.url) == []

    @settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
    @given(st.lists(STEP, min_size=1, max_size=6))
    def check(steps: list[tuple[str, int, int]]) -> None:
        # hypothesis runs the body synchronously; run each example on this test's loop.
        asyncio.run_coroutine_threadsafe(run(steps), loop).result(60)

    await asyncio.to_thread(check)

    # b had taken the sequence's last ID before each step: going back by any amount re-issues it.
    assert counter("factstream_sequence_reissues_total") == before + went_back
    assert sorted(failover.written) == sorted(r[0] for r in sql(failover.url, "SELECT stream_id FROM facts"))
    await failover.finish()
    assert failover.b.get_current_token() == max(failover.written)
