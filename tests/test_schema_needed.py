"""Every command that needs the schema, on a database not migrated (or migrated for the core only),
says so and what to do, exit 2, as ``factstream run`` does (tests/core/test_migrate.py): never
"internal error". Here with the bundled plugins loaded (tests/core blocks them), the CLI in-process."""

from __future__ import annotations

import os

import pytest

from factstream.migrate import CORE_PLUGIN, Migrator
from factstream.plugin.manager import load_plugins


def export_commands() -> list[tuple[str, ...]]:
    job = next(iter(load_plugins().registry.export_jobs)).spec.name
    return [("export",), ("export", "--all"), ("export", job)]


@pytest.mark.parametrize("args", export_commands(), ids=" ".join)
@pytest.mark.parametrize("migrated", ["nothing", "the core only"])
def test_a_command_needing_the_schema_says_to_migrate_first(cli, fresh_database, args, migrated):
    if migrated == "the core only":
        migrator = Migrator(fresh_database, load_plugins())
        try:
            migrator.upgrade(CORE_PLUGIN)
        finally:
            migrator.close()
    result = cli(*args, env=dict(os.environ, FACTSTREAM_DATABASE__URL=fresh_database))

    message = " ".join(result.stderr.split())
    assert result.returncode == 2, result.stdout + result.stderr
    assert message.startswith("error: the database is not migrated: "), message
    assert message.endswith("run `factstream migrate` first"), message
    assert ("factstream (base -> " in message) == (migrated == "nothing"), message
    assert "events (base -> events_" in message, message
    assert "internal error" not in message and "Traceback" not in result.stderr
