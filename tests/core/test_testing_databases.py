"""The test databases of ``factstream.testing``: a migrated database is a copy of a template made ahead,
renamed to the test's name; what must not change is what a test finds in it."""

from __future__ import annotations

import psycopg

from factstream.db.engine import libpq_url
from factstream.migrate import Migrator
from factstream.testing import _Databases, _migrate, connect, create_database, drop_database


def schema(url: str) -> list[tuple[str, ...]]:
    """Every column of every table of the public schema, and the alembic revisions the database is at."""
    with connect(url) as conn:
        columns = conn.execute(
            "SELECT table_name, column_name, data_type, is_nullable, coalesce(column_default, '')"
            " FROM information_schema.columns WHERE table_schema = 'public' ORDER BY 1, 2"
        ).fetchall()
        versions = conn.execute("SELECT version_num FROM alembic_version ORDER BY 1").fetchall()
    return [tuple(map(str, row)) for row in columns] + [("alembic_version", v) for (v,) in versions]


def exists(server_url: str, name: str) -> bool:
    with connect(server_url) as conn:
        return conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone() is not None


def test_a_migrated_copy_is_what_alembic_makes_and_each_test_gets_its_own(factstream_server_url, plugin_host):
    by_alembic = create_database(factstream_server_url)
    try:
        migrator = Migrator(by_alembic, plugin_host)
        try:
            migrator.upgrade()
        finally:
            migrator.close()
        expected = schema(by_alembic)
        work = _Databases()
        copies = [_migrate(work.empty(factstream_server_url), plugin_host) for _ in range(3)]
        try:
            assert len(expected) > 10
            for url in copies:  # the first made in the foreground, the next ones ahead
                assert schema(url) == expected
            with connect(copies[0]) as conn:  # a copy of its own: writing to one leaves the others alone
                conn.execute("CREATE TABLE only_here (x int)")
            assert schema(copies[1]) == expected
        finally:
            for url in copies:
                work.drop(url)
            work.wait()
        assert work.failed == []
        assert not any(
            exists(factstream_server_url, psycopg.conninfo.conninfo_to_dict(libpq_url(u))["dbname"]) for u in copies
        )
    finally:
        drop_database(by_alembic)


def test_what_was_made_ahead_and_never_used_is_dropped_at_the_end(factstream_server_url):
    work = _Databases()
    url = work.empty(factstream_server_url)
    ahead = [future.result(timeout=60) for future in work._ready.values()]
    assert ahead and all(exists(factstream_server_url, name) for name in ahead)
    work.drop(url)
    work.wait()
    assert work.failed == []
    assert not any(exists(factstream_server_url, name) for name in ahead)


def test_a_database_someone_is_connected_to_is_migrated_in_place(fresh_database, plugin_host):
    with connect(fresh_database) as held:
        held.execute("CREATE TABLE mine (x int)")
        assert _migrate(fresh_database, plugin_host) == fresh_database
        tables = {name for (name,) in held.execute("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")}
    assert {"mine", "alembic_version", "stream_positions"} <= tables
