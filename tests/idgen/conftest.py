"""Fixtures for the ID generator tests: a migrated database with stream tables and sequences."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable

import psycopg
import pytest

from factstream.db.database import Database
from factstream.db.engine import libpq_url
from factstream.idgen.generator import MultiWriterIdGenerator
from factstream.idgen.leases import WriterLeases
from factstream.idgen.sequence import create_sequence_sql


def create_stream_schema(url: str, *tables: str, sequence: str = "facts_seq") -> None:
    """Backing tables ``(stream_id, instance_name, payload)`` and a new stream sequence."""
    with psycopg.connect(libpq_url(url), autocommit=True) as conn:
        for table in tables:
            conn.execute(f"CREATE TABLE {table} (stream_id BIGINT NOT NULL, instance_name TEXT NOT NULL, payload TEXT)")
        for statement in create_sequence_sql(sequence):
            conn.execute(statement)


@pytest.fixture
def stream_db(migrated_database: str) -> str:
    """A database migrated to the core with stream ``facts`` (tables ``facts``, ``facts_extra``)."""
    create_stream_schema(migrated_database, "facts", "facts_extra")
    return migrated_database


@pytest.fixture
async def db(stream_db: str) -> AsyncIterator[Database]:
    database = Database.from_url(stream_db, instance_name="tests")
    yield database
    await database.close()


GeneratorFactory = Callable[..., Awaitable[MultiWriterIdGenerator]]


@pytest.fixture
async def make_gen(db: Database) -> AsyncIterator[GeneratorFactory]:
    """Start generators of stream ``facts`` (defaults: writers main, leases on); closed after the test."""
    made: list[MultiWriterIdGenerator] = []
    leases_made: list[WriterLeases] = []

    async def make(
        instance: str = "main",
        writers: list[str] | None = None,
        *,
        positive: bool = True,
        leases: bool = True,
        tables: tuple[str, ...] = ("facts",),
        **kwargs: object,
    ) -> MultiWriterIdGenerator:
        lease = WriterLeases(db) if leases else None
        if lease is not None:
            leases_made.append(lease)
        gen = MultiWriterIdGenerator(
            db,
            stream_name="facts",
            sequence_name="facts_seq",
            tables=[(t, "instance_name", "stream_id") for t in tables],
            writers=["main"] if writers is None else writers,
            instance_name=instance,
            positive=positive,
            leases=lease,
            **kwargs,  # type: ignore[arg-type]
        )
        await gen.start()
        made.append(gen)
        return gen

    yield make
    for gen in made:
        await gen.close()
    for lease in leases_made:
        await lease.close()
