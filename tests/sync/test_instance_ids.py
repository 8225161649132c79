"""Instance IDs recorded in the real ``instance_map`` table."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest

from factstream.db.database import Database
from factstream.sync import DatabaseInstanceIds, MemoryInstanceIds, MultiWriterStreamToken, TokenError


@pytest.fixture
async def db(migrated_database: str) -> AsyncIterator[Database]:
    database = Database.from_url(migrated_database, instance_name="tests")
    yield database
    await database.close()


async def test_an_id_is_assigned_once_and_stays_the_same_for_a_new_resolver(db):
    first = DatabaseInstanceIds(db)
    a, b = await first.get_id("w1"), await first.get_id("w2")
    assert a != b
    assert await first.get_id("w1") == a

    restarted = DatabaseInstanceIds(db)
    assert await restarted.get_name(b) == "w2"
    assert await restarted.get_id("w1") == a


async def test_looking_up_a_known_name_burns_no_serial_values(db):
    ids = DatabaseInstanceIds(db)
    first = await ids.get_id("w1")
    for _ in range(5):
        assert await DatabaseInstanceIds(db).get_id("w1") == first
    assert await ids.get_id("w2") == first + 1


async def test_two_resolvers_racing_on_new_names_agree(migrated_database):
    dbs = [Database.from_url(migrated_database, instance_name=f"p{i}") for i in range(2)]
    try:
        resolvers = [DatabaseInstanceIds(d) for d in dbs]
        names = [f"writer-{i}" for i in range(20)]
        left, right = await asyncio.gather(
            asyncio.gather(*(resolvers[0].get_id(n) for n in names)),
            asyncio.gather(*(resolvers[1].get_id(n) for n in reversed(names))),
        )
        assert list(left) == list(reversed(right))
        assert len(set(left)) == 20
        rows = await dbs[0].fetchall("SELECT instance_name, instance_id FROM instance_map")
        assert dict(rows) == dict(zip(names, left, strict=True))
    finally:
        for d in dbs:
            await d.close()


async def test_tokens_round_trip_through_the_table_across_processes(db):
    token = MultiWriterStreamToken(stream=5, instance_map={"persister-1": 9, "persister-2": 7})
    text = await token.to_string(DatabaseInstanceIds(db))
    assert await MultiWriterStreamToken.parse(text, DatabaseInstanceIds(db)) == token


async def test_an_unknown_id_is_a_token_error(db):
    ids = DatabaseInstanceIds(db)
    with pytest.raises(LookupError):
        await ids.get_name(42)
    with pytest.raises(TokenError, match="unknown instance id 42"):
        await MultiWriterStreamToken.parse("m5~42.6", ids)


async def test_load_fills_the_cache_from_the_table(db):
    await DatabaseInstanceIds(db).get_id("w1")
    ids = DatabaseInstanceIds(db)
    await ids.load()
    lookup = await ids.name_lookup([])
    assert lookup(await ids.get_id("w1")) == "w1"


def test_the_memory_resolver_assigns_ids_in_order_of_first_use():
    ids = MemoryInstanceIds({"known": 4})
    assert ids.id_for("a") == 5
    assert ids.id_for("b") == 6
    assert ids.id_for("a") == 5
    assert ids.name_for(4) == "known"
