"""``factstream tokens``: issue, list and revoke the HTTP API's table tokens, stored as SHA-256 hashes."""

from __future__ import annotations

import hashlib
import os
import re

import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from factstream.db.engine import libpq_url
from factstream.errors import FactstreamError
from factstream.migrate import Migrator
from factstream.plugin.manager import load_plugins
from factstream.tokens import TokenStore, token_hash


@pytest.fixture
def env(migrated_database: str) -> dict[str, str]:
    return dict(os.environ, FACTSTREAM_DATABASE__URL=migrated_database)


def rows(url: str) -> list[tuple[object, ...]]:
    with psycopg.connect(libpq_url(url)) as conn:
        return conn.execute(
            "SELECT token_hash, user_id, can_write, created_at FROM access_tokens ORDER BY created_at"
        ).fetchall()


def test_create_prints_the_token_once_and_stores_only_its_hash(cli, env):
    created = cli("tokens", "create", "@alice:example.org", env=env)

    assert created.returncode == 0, created.stderr
    token = created.stdout.strip()
    assert created.stdout == token + "\n"  # T=$(factstream tokens create ...) gets exactly the token
    assert len(token) >= 40 and re.fullmatch(r"[A-Za-z0-9_-]+", token)
    assert "shown only now and cannot be shown again" in created.stderr
    assert token not in created.stderr
    [row] = rows(env["FACTSTREAM_DATABASE__URL"])
    assert row[0] == hashlib.sha256(token.encode()).hexdigest()
    assert token not in repr(row)
    assert row[1:3] == ("@alice:example.org", False)

    listed = cli("tokens", "list", env=env)
    assert listed.returncode == 0, listed.stderr
    assert token not in listed.stdout
    assert re.search(rf"{token_hash(token)[:8]}\s+│\s+@alice:example.org\s+│\s+user\s+│\s+\d{{4}}-", listed.stdout)


def test_two_created_tokens_differ_and_a_writer_token_is_a_writer(migrated_database):
    store = TokenStore(migrated_database)
    first, writer = store.create("@bob:hs", can_write=True)
    second, user = store.create("@bob:hs")

    assert first != second
    assert (writer.kind, user.kind) == ("writer", "user")
    assert [t.id for t in store.all("@bob:hs")] == [token_hash(first)[:8], token_hash(second)[:8]]
    assert store.all("@nobody:hs") == []


def test_a_given_token_is_stored_and_a_duplicate_or_bad_one_is_refused(migrated_database):
    store = TokenStore(migrated_database)
    assert store.create("@carol:hs", token="carol-s3cret-token")[0] == "carol-s3cret-token"

    with pytest.raises(FactstreamError, match="already in the table"):
        store.create("@dave:hs", token="carol-s3cret-token")
    for bad in ("two words", "", "tab\tbed", "naïve"):
        with pytest.raises(FactstreamError, match="invalid token"):
            store.create("@dave:hs", token=bad)
    for bad_user in ("", "@a b:hs"):
        with pytest.raises(FactstreamError, match="invalid user"):
            store.create(bad_user)
    assert len(rows(migrated_database)) == 1


def test_revoke_by_id_by_token_and_by_user(migrated_database):
    store = TokenStore(migrated_database)
    by_id, by_value, *of_erin = (store.create(user)[0] for user in ("@a:hs", "@b:hs", "@erin:hs", "@erin:hs"))

    assert store.revoke(token_hash(by_id)[:8]).user == "@a:hs"
    assert store.revoke(by_value).user == "@b:hs"
    assert sorted(t.id for t in store.revoke_user("@erin:hs")) == sorted(token_hash(t)[:8] for t in of_erin)
    assert store.revoke_user("@erin:hs") == []
    assert rows(migrated_database) == []
    with pytest.raises(FactstreamError, match="no token with id"):
        store.revoke(by_value)


def test_revoke_in_the_cli_says_what_it_revoked_and_an_unknown_id_exits_2(cli, env):
    token, _ = TokenStore(env["FACTSTREAM_DATABASE__URL"]).create("@a:hs", can_write=True)

    revoked = cli("tokens", "revoke", token_hash(token)[:8], env=env)
    assert revoked.returncode == 0, revoked.stderr
    assert revoked.stdout.startswith(f"revoked {token_hash(token)[:8]} (writer token of @a:hs, created ")
    assert token not in revoked.stdout

    unknown = cli("tokens", "revoke", token_hash(token)[:8], env=env)
    assert unknown.returncode == 2
    assert unknown.stderr.startswith(f"error: no token with id '{token_hash(token)[:8]}'")
    assert "Traceback" not in unknown.stderr


def test_tokens_on_an_unmigrated_database_say_to_migrate(cli, fresh_database):
    result = cli("tokens", "list", env=dict(os.environ, FACTSTREAM_DATABASE__URL=fresh_database))

    assert result.returncode == 2
    assert "run `factstream migrate` first" in result.stderr
    assert "Traceback" not in result.stderr


def test_the_migration_hashes_existing_tokens_in_place(fresh_database):
    migrator = Migrator(fresh_database, load_plugins())
    try:
        migrator._run("upgrade", "fs_core_0003")  # the table as it was, with plaintext tokens
        with psycopg.connect(libpq_url(fresh_database)) as conn:
            conn.execute("INSERT INTO access_tokens (token, user_id, can_write) VALUES ('old-tøken', '@old:hs', true)")
        migrator.upgrade()
    finally:
        migrator.close()

    [row] = rows(fresh_database)
    assert row[:3] == (token_hash("old-tøken"), "@old:hs", True)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(token=st.text(st.characters(exclude_categories=("Cs",), exclude_characters="\x00"), min_size=1))
def test_postgresql_hashes_a_token_as_the_lookup_does(factstream_server_url, token):
    # The migration hashes old rows with PostgreSQL's sha256(); hosts hash what a client sends in Python.
    with psycopg.connect(libpq_url(factstream_server_url)) as conn:
        [(hashed,)] = conn.execute("SELECT encode(sha256(convert_to(%s, 'UTF8')), 'hex')", (token,)).fetchall()

    assert hashed == token_hash(token)
