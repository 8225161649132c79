"""The database layer: async engine, unreachable servers, and the embedded PostgreSQL default."""

from __future__ import annotations

import os
import subprocess
import sys

import psycopg
import pytest
from sqlalchemy import text

from factstream.db.database import Database
from factstream.db.embedded import start_embedded, stop_embedded
from factstream.db.engine import check_database, libpq_url
from factstream.errors import DatabaseError
from factstream.testing import free_port


async def test_database_runs_core_statements_and_sql_in_transactions(fresh_database):
    db = Database(fresh_database, instance_name="tests")
    try:
        async with db.transaction() as txn:
            await txn.execute("CREATE TABLE t (x int)")
            await txn.execute(text("INSERT INTO t VALUES (:a), (:b)"), {"a": 1, "b": 2})
        with pytest.raises(RuntimeError):
            async with db.transaction() as txn:
                await txn.execute("INSERT INTO t VALUES (%(x)s)", {"x": 100})
                raise RuntimeError("roll back")
        assert await db.fetchall("SELECT sum(x) FROM t") == [(3,)]
        names = await db.fetchall("SELECT application_name FROM pg_stat_activity WHERE pid = pg_backend_pid()")
        assert names == [("factstream/tests",)]
    finally:
        await db.close()


def test_unreachable_database_is_one_clear_error():
    url = f"postgresql://postgres@127.0.0.1:{free_port()}/facts"

    with pytest.raises(DatabaseError) as info:
        check_database(url, timeout=1)

    message = str(info.value)
    assert (
        f"cannot connect to the database at postgresql://postgres@127.0.0.1:{url.split(':')[2].split('/')[0]}/facts"
        in message
    )
    assert "\n" not in message


def test_unreachable_database_in_the_cli_exits_2_without_traceback(cli):
    env = dict(
        os.environ,
        FACTSTREAM_DATABASE__URL=f"postgresql://postgres@127.0.0.1:{free_port()}/facts",
        FACTSTREAM_DATABASE__CONNECT_TIMEOUT="1",
    )

    result = cli("migrate", env=env)

    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    said, failed = result.stderr.splitlines()
    assert said.startswith("migrating database facts on 127.0.0.1:")
    assert failed.startswith("error: cannot connect to the database at")


def test_password_is_not_shown_in_connection_errors():
    with pytest.raises(DatabaseError) as info:
        check_database(f"postgresql://app:s3cret@127.0.0.1:{free_port()}/facts", timeout=1)

    assert "s3cret" not in str(info.value)


@pytest.mark.slow
def test_embedded_server_keeps_data_across_runs_and_stops_when_the_process_exits(tmp_path):
    state = tmp_path / "state"
    script = (
        "import sys, psycopg\n"
        "from factstream.db.embedded import start_embedded, stop_embedded\n"
        "url = start_embedded(__import__('pathlib').Path(sys.argv[1]))\n"
        "with psycopg.connect(url, autocommit=True) as c:\n"
        "    c.execute('CREATE TABLE IF NOT EXISTS runs (n int)')\n"
        "    c.execute('INSERT INTO runs VALUES (1)')\n"
        "    print(c.execute('SELECT count(*) FROM runs').fetchone()[0])\n"
    )
    counts = []
    for _ in range(2):
        done = subprocess.run([sys.executable, "-c", script, str(state)], capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        counts.append(int(done.stdout.strip()))
        # Stopped cleanly: the postmaster removed its pid file on shutdown.
        assert not (state / "postgres" / "postmaster.pid").exists()

    assert counts == [1, 2]


def test_embedded_server_is_shared_within_a_process(tmp_path):
    first = start_embedded(tmp_path)
    try:
        second = start_embedded(tmp_path)

        assert first == second
        with psycopg.connect(libpq_url(first)) as conn:
            assert conn.execute("SELECT current_database()").fetchone() == ("factstream",)
    finally:
        stop_embedded(tmp_path)
    assert not (tmp_path / "postgres" / "postmaster.pid").exists()


def test_embedded_server_failure_is_reported_with_the_log(tmp_path):
    """A data directory that looks complete but cannot run (garbage where PostgreSQL's files should be) is
    not rebuilt (it may hold data): the start fails naming the directory and the end of the server's log."""
    from factstream.db.embedded import COMPLETE_MARKERS

    state = tmp_path / "state"
    pgdata = state / "postgres"
    for marker in COMPLETE_MARKERS:
        path = pgdata / marker
        if "." in marker or marker == "PG_VERSION" or marker.endswith("pg_control"):
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text("not a data directory")
        else:
            path.mkdir(parents=True, exist_ok=True)

    with pytest.raises(DatabaseError, match=r"the embedded PostgreSQL could not start under .*(log|no log)"):
        start_embedded(state)
    assert (pgdata / "PG_VERSION").read_text() == "not a data directory"


async def test_execute_and_commit_commits_with_the_last_statement(fresh_database):
    """The statement and COMMIT go together: the rows are visible to others before the block ends; a
    failing statement (or one sent before it in the pipeline) commits nothing; completion callbacks
    get the real outcome, also when the block raises after the commit; nothing runs after it."""
    db = Database(fresh_database, instance_name="tests")
    other = await psycopg.AsyncConnection.connect(libpq_url(fresh_database), autocommit=True)

    async def held() -> list[int]:
        cur = await other.execute("SELECT x FROM t ORDER BY x")
        return [r[0] for r in await cur.fetchall()]

    try:
        await other.execute("CREATE TABLE t (x int PRIMARY KEY)")
        outcomes: list[bool] = []
        async with db.transaction() as txn:
            txn.on_complete(outcomes.append)
            await txn.execute("INSERT INTO t VALUES (1)")
            cur = await txn.execute_and_commit("INSERT INTO t VALUES (2) RETURNING x")
            assert await cur.fetchall() == [(2,)]
            assert await held() == [1, 2]  # committed before the block ends
            with pytest.raises(psycopg.ProgrammingError, match="has committed"):
                await txn.execute("INSERT INTO t VALUES (3)")
        assert outcomes == [True]

        outcomes.clear()
        with pytest.raises(psycopg.errors.UniqueViolation):
            async with db.transaction() as txn:
                txn.on_complete(outcomes.append)
                async with txn.conn.pipeline():
                    await txn.conn.execute("INSERT INTO t VALUES (4)")
                    await txn.execute_and_commit("INSERT INTO t VALUES (1)")
        assert outcomes == [False]
        assert await held() == [1, 2]

        outcomes.clear()
        with pytest.raises(RuntimeError):
            async with db.transaction() as txn:
                txn.on_complete(outcomes.append)
                await txn.execute_and_commit("INSERT INTO t VALUES (5)")
                raise RuntimeError("after the commit")
        assert outcomes == [True]
        assert await held() == [1, 2, 5]
        async with db.transaction() as txn:  # the pooled connection is usable again
            await txn.execute("INSERT INTO t VALUES (6)")
        assert await held() == [1, 2, 5, 6]
    finally:
        await other.close()
        await db.close()


def test_a_unix_socket_nobody_listens_on_is_named_without_the_embedded_advice(tmp_path):
    """The demo's configuration names its embedded server's socket directory, which exists only while the
    demo runs: the error says so, and does not advise removing database.url (that reaches another database)."""
    url = f"postgresql://postgres@/factstream_demo?host={tmp_path}"

    with pytest.raises(DatabaseError) as info:
        check_database(url, timeout=1)

    message = str(info.value)
    assert f"No PostgreSQL is listening in {tmp_path}" in message
    assert "./dev demo --keep-running" in message
    assert "remove database.url" not in message and "\n" not in message
