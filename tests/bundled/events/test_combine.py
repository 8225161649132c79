"""Several writes as one statement (``factstream_events.write.combine``): what the write path relies on."""

from __future__ import annotations

from collections.abc import Iterator

import psycopg
import pytest
from factstream_events.write.combine import Writes
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from factstream.db.engine import libpq_url

ADD = "INSERT INTO kv (k, v) SELECT unnest(%(keys)b::text[]), %(value)s"
DROP = "DELETE FROM kv WHERE k = ANY(%(keys)b::text[])"
LOG = "INSERT INTO log (what) VALUES (%(value)s)"
COUNT = "SELECT count(*) FROM kv WHERE v <> %(value)s"


@pytest.fixture(scope="module")
def db(factstream_server_url: str) -> Iterator[psycopg.Connection]:
    from factstream.testing import create_database, drop_database

    url = create_database(factstream_server_url)
    with psycopg.connect(libpq_url(url), autocommit=True) as conn:
        conn.execute("CREATE TABLE kv (k text PRIMARY KEY, v text NOT NULL)")
        conn.execute("CREATE TABLE log (what text NOT NULL)")
        yield conn
    drop_database(url)


def reset(conn: psycopg.Connection, held: dict[str, str]) -> None:
    conn.execute("TRUNCATE kv, log")
    for k, v in held.items():
        conn.execute("INSERT INTO kv VALUES (%s, %s)", (k, v))


keys = st.lists(st.sampled_from("abcdef"), unique=True, max_size=4)


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(held=keys, dropped=keys, added=keys, value=st.text(max_size=5).filter(lambda t: "\x00" not in t and t != "none"))
def test_one_statement_does_what_the_writes_one_by_one_do(db, held, dropped, added, value):
    new = [k for k in added if k not in held]  # no unique violation here
    reset(db, dict.fromkeys(held, "old"))
    writes = Writes()
    writes.add(DROP, {"keys": dropped})
    writes.add(ADD, {"keys": new, "value": value})
    writes.add(LOG, {"value": value + "!"})
    sql, params = writes.statement(COUNT, {"value": "none"})
    (before,) = db.execute(sql, params).fetchone()
    # The query answers from the snapshot the statement starts with: neither the rows it drops nor
    # those it adds have changed it.
    assert before == len(held)
    expected = {k: "old" for k in held if k not in dropped}
    expected.update(dict.fromkeys(new, value))
    assert dict(db.execute("SELECT k, v FROM kv").fetchall()) == expected
    assert db.execute("SELECT what FROM log").fetchall() == [(value + "!",)]


def test_a_unique_violation_in_any_part_writes_nothing(db):
    reset(db, {"a": "old"})
    writes = Writes()
    writes.add(LOG, {"value": "logged"})
    writes.add(ADD, {"keys": ["b", "a"], "value": "new"})
    sql, params = writes.statement()
    with pytest.raises(psycopg.errors.UniqueViolation):
        db.execute(sql, params)
    assert db.execute("SELECT k, v FROM kv").fetchall() == [("a", "old")]
    assert db.execute("SELECT count(*) FROM log").fetchone() == (0,)
