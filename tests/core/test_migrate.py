"""Per-plugin migration branches: upgrade, downgrade, status, new revisions, uninstalled plugins."""

from __future__ import annotations

import os
import re
from pathlib import Path

import psycopg
import pytest

from factstream.db.engine import libpq_url
from factstream.errors import MigrationError
from factstream.migrate import Migrator
from factstream.plugin.manager import CORE_PLUGIN, load_plugins
from factstream.testing import PluginInstaller

#: The core branch's newest revision (plugins depend on CORE_BASE_REVISION, the first).
CORE_HEAD = "fs_core_0005"


def tables(url: str) -> set[str]:
    with psycopg.connect(libpq_url(url)) as conn:
        rows = conn.execute("SELECT tablename FROM pg_tables WHERE schemaname = 'public'").fetchall()
    return {r[0] for r in rows}


def status(migrator: Migrator) -> dict[str, tuple[str | None, str | None, bool]]:
    return {s.branch: (s.current, s.head, s.installed) for s in migrator.status()}


#: A plugin whose one revision creates the table ``memos``: a second plugin beside notes.
MEMOS_PLUGIN = """
import factstream
from factstream import MigrationSpec

@factstream.hookimpl
def register_migrations(register):
    register(MigrationSpec.from_package("factstream_memos.migrations"))
"""


def one_table_files(name: str, depends_on: str) -> dict[str, str]:
    """A migrations package whose one revision ``<name>_0001`` creates the table ``name``."""
    return {
        "migrations/__init__.py": "",
        f"migrations/{name}_0001.py": f"""
            from alembic import op
            import sqlalchemy as sa
            revision = "{name}_0001"
            down_revision = None
            branch_labels = ("{name}",)
            depends_on = "{depends_on}"

            def upgrade():
                op.create_table("{name}", sa.Column("id", sa.BigInteger))

            def downgrade():
                op.drop_table("{name}")
        """,
    }


MEMOS_FILES = one_table_files("memos", "fs_core_0001")


def blocking(*names: str) -> str:
    """``FACTSTREAM_BLOCK_PLUGINS`` blocking ``names`` too (tests/core already blocks the bundled plugins)."""
    return ",".join(n for n in [os.environ.get("FACTSTREAM_BLOCK_PLUGINS", ""), *names] if n)


def flat(text: str) -> str:
    """``text`` with its line breaks and runs of spaces made single spaces (rich wraps stderr)."""
    return " ".join(text.split())


@pytest.fixture
def notes(plugin_installer: PluginInstaller, notes_project):
    return plugin_installer.from_project(notes_project)


@pytest.fixture
def migrator(notes, fresh_database):
    m = Migrator(fresh_database, load_plugins())
    yield m
    m.close()


def test_core_revision_creates_positions_and_instance_map(fresh_database, plugin_host):
    Migrator(fresh_database, plugin_host).upgrade()

    with psycopg.connect(libpq_url(fresh_database)) as conn:
        conn.execute("INSERT INTO stream_positions VALUES ('events', 'main', 5)")
        with pytest.raises(psycopg.errors.UniqueViolation):
            conn.execute("INSERT INTO stream_positions VALUES ('events', 'main', 6)")
        conn.rollback()
        conn.execute("INSERT INTO instance_map (instance_name) VALUES ('main'), ('worker1')")
        ids = conn.execute("SELECT instance_id, instance_name FROM instance_map ORDER BY instance_id").fetchall()
    assert [name for _, name in ids] == ["main", "worker1"]
    assert ids[0][0] < ids[1][0]


def test_upgrade_applies_every_branch(migrator, fresh_database):
    migrator.upgrade()

    assert {"stream_positions", "instance_map", "notes"} <= tables(fresh_database)
    assert status(migrator) == {
        "factstream": (CORE_HEAD, CORE_HEAD, True),
        "notes": ("notes_0001", "notes_0001", True),
    }


def test_new_stream_sequence_hands_out_2_first(migrator, fresh_database):
    migrator.upgrade()

    with psycopg.connect(libpq_url(fresh_database)) as conn:
        assert conn.execute("SELECT nextval('notes_seq')").fetchone() == (2,)


def test_plugin_branch_downgrades_and_upgrades_without_touching_the_core(migrator, fresh_database):
    migrator.upgrade()
    with psycopg.connect(libpq_url(fresh_database), autocommit=True) as conn:
        conn.execute("INSERT INTO stream_positions VALUES ('notes', 'main', 7)")

    migrator.downgrade_to_base("notes")
    assert "notes" not in tables(fresh_database)
    assert status(migrator)["notes"] == (None, "notes_0001", True)
    assert status(migrator)["factstream"] == (CORE_HEAD, CORE_HEAD, True)

    migrator.upgrade("notes")
    assert "notes" in tables(fresh_database)
    with psycopg.connect(libpq_url(fresh_database)) as conn:
        assert conn.execute("SELECT stream_id FROM stream_positions").fetchall() == [(7,)]


def test_upgrading_one_plugin_brings_the_core_but_not_other_plugins(plugin_installer, notes, fresh_database):
    plugin_installer.from_source("memos", MEMOS_PLUGIN, files=MEMOS_FILES)
    migrator = Migrator(fresh_database, load_plugins())

    migrator.upgrade("memos")

    assert {"memos", "stream_positions"} <= tables(fresh_database)
    assert "notes" not in tables(fresh_database)
    assert status(migrator)["notes"][0] is None


def test_new_revision_extends_the_plugin_branch(migrator, notes, fresh_database):
    path = migrator.new_revision("notes", "add a title column")

    assert path.parent == notes.package_dir / "migrations"
    source = path.read_text()
    assert 'down_revision: str | Sequence[str] | None = "notes_0001"' in source
    path.write_text(
        source.replace(
            "def upgrade() -> None:\n    pass",
            "def upgrade() -> None:\n    op.add_column('notes', sa.Column('title', sa.Text))",
        ).replace(
            "def downgrade() -> None:\n    pass", "def downgrade() -> None:\n    op.drop_column('notes', 'title')"
        )
    )
    migrator = Migrator(fresh_database, load_plugins())
    migrator.upgrade()

    new_id = re.search(r'revision: str = "(\w+)"', source).group(1)
    assert status(migrator)["notes"] == (new_id, new_id, True)
    with psycopg.connect(libpq_url(fresh_database)) as conn:
        conn.execute("SELECT title FROM notes")


def test_first_revision_of_a_new_plugin_starts_its_branch_on_the_core(plugin_installer, fresh_database):
    plugin = plugin_installer.from_source(
        "fresh",
        """
        import factstream
        from factstream import MigrationSpec

        @factstream.hookimpl
        def register_migrations(register):
            register(MigrationSpec.from_package("factstream_fresh.migrations"))
        """,
        files={"migrations/__init__.py": ""},
    )
    migrator = Migrator(fresh_database, load_plugins())

    path = migrator.new_revision("fresh", "create fresh tables")

    source = path.read_text()
    assert 'branch_labels: str | Sequence[str] | None = ("fresh",)' in source
    assert f'depends_on: str | Sequence[str] | None = "{CORE_HEAD}"' in source
    assert path.parent == plugin.package_dir / "migrations"
    Migrator(fresh_database, load_plugins()).upgrade()


def test_unknown_branch_is_a_clear_error(migrator):
    with pytest.raises(MigrationError, match=r"plugin 'nope' is not a loaded plugin; branches: factstream, notes"):
        migrator.upgrade("nope")


def test_uninstalled_plugin_is_reported_by_name_with_the_detach_command(
    plugin_installer, notes, migrator, fresh_database
):
    migrator.upgrade()
    plugin_installer.uninstall(notes)
    after = Migrator(fresh_database, load_plugins())

    with pytest.raises(MigrationError) as info:
        after.upgrade()

    assert "revision 'notes_0001' belongs to plugin 'notes', which is not installed" in str(info.value)
    assert "factstream migrate detach notes" in str(info.value)
    assert status(after) == {
        "factstream": (CORE_HEAD, CORE_HEAD, True),
        "notes": ("notes_0001", None, False),
    }


def test_detach_forgets_the_plugin_keeps_its_tables_and_the_core_revision(
    plugin_installer, notes, migrator, fresh_database
):
    migrator.upgrade()
    plugin_installer.uninstall(notes)
    after = Migrator(fresh_database, load_plugins())

    assert after.detach("notes") == "notes_0001"
    after.upgrade()

    assert status(after) == {"factstream": (CORE_HEAD, CORE_HEAD, True)}
    assert "notes" in tables(fresh_database)


def test_cli_migrate_status_down_and_new(plugin_installer, notes, fresh_database, cli):
    env = dict(plugin_installer.env(), FACTSTREAM_DATABASE__URL=fresh_database)

    up = cli("migrate", env=env)
    assert up.returncode == 0, up.stderr
    assert re.search(r"notes\s+│\s+notes_0001\s+│\s+notes_0001\s+│\s+up to date", up.stdout)

    down = cli("migrate", "down", "--plugin", "notes", "--yes", env=env)
    assert down.returncode == 0, down.stderr
    assert re.search(r"notes\s+│\s+-\s+│\s+notes_0001\s+│\s+needs upgrade", down.stdout)
    assert re.search(r"factstream\s+│\s+fs_core_0005\s+│\s+fs_core_0005\s+│\s+up to date", down.stdout)

    new = cli("migrate", "new", "--plugin", "notes", "-m", "add index", env=dict(env, COLUMNS="40"))
    assert new.returncode == 0, new.stderr
    created = Path(re.search(r"^created (\S+\.py)$", new.stdout, re.MULTILINE).group(1))  # one line at 40 columns
    assert created.parent == notes.package_dir / "migrations"

    status_run = cli("migrate", "status", env=env)
    assert re.search(r"notes\s+│\s+-\s+│\s+\w+\s+│\s+needs upgrade", status_run.stdout)


def test_cli_reports_an_uninstalled_plugin_and_detaches_it(plugin_installer, notes, migrator, fresh_database, cli):
    migrator.upgrade()
    plugin_installer.uninstall(notes)
    env = dict(plugin_installer.env(), FACTSTREAM_DATABASE__URL=fresh_database)

    failed = cli("migrate", env=env)
    assert failed.returncode == 2
    assert "Traceback" not in failed.stderr
    assert "belongs to plugin 'notes', which is not installed" in " ".join(failed.stderr.split())

    detached = cli("migrate", "detach", "notes", env=env)
    assert detached.returncode == 0, detached.stderr
    assert cli("migrate", env=env).returncode == 0


def test_blocking_a_migrated_plugin_shows_it_blocked_and_migrate_refuses_saying_unblock_or_detach(
    notes, migrator, fresh_database, cli, plugin_installer
):
    migrator.upgrade()
    env = dict(
        plugin_installer.env(), FACTSTREAM_DATABASE__URL=fresh_database, FACTSTREAM_BLOCK_PLUGINS=blocking("notes")
    )

    status_run = cli("migrate", "status", env=env)
    refused = cli("migrate", env=env)

    assert status_run.returncode == 0, status_run.stderr
    assert re.search(r"notes\s+│\s+notes_0001\s+│\s+-\s+│\s+blocked by FACTSTREAM_BLOCK_PLUGINS", status_run.stdout)
    assert refused.returncode == 2 and "Traceback" not in refused.stderr
    assert (
        "revision 'notes_0001' belongs to plugin 'notes', which is installed but blocked by FACTSTREAM_BLOCK_PLUGINS. "
        "Unblock it (take notes out of FACTSTREAM_BLOCK_PLUGINS), or detach its migrations with "
        "`factstream migrate detach notes` (its tables are kept)."
    ) in flat(refused.stderr)


def test_a_plugin_left_out_by_load_plugins_is_reported_as_such_and_not_as_uninstalled(
    notes, migrator, fresh_database, cli, plugin_installer
):
    migrator.upgrade()
    env = dict(plugin_installer.env(), FACTSTREAM_DATABASE__URL=fresh_database, FACTSTREAM_LOAD_PLUGINS="")

    status_run = cli("migrate", "status", env=env)
    refused = cli("migrate", env=env)

    assert re.search(r"notes\s+│\s+notes_0001\s+│\s+-\s+│\s+not named in FACTSTREAM_LOAD_PLUGINS", status_run.stdout)
    assert refused.returncode == 2
    assert (
        "which is installed but not named in FACTSTREAM_LOAD_PLUGINS. Load it (add notes to FACTSTREAM_LOAD_PLUGINS), "
        "or detach its migrations with `factstream migrate detach notes`"
    ) in flat(refused.stderr)


# -- factstream run refuses a database it cannot work on, saying what to do ---------------------------


def run_refused(run_cli, env: dict[str, str]) -> str:
    """``factstream run`` on ``env``'s database, which must refuse to start: its error, one line."""
    result = run_cli("run", "--http-port", "0", env=env)
    assert result.returncode == 2, result.stdout + result.stderr
    assert "Traceback" not in result.stderr
    return flat(result.stderr)


def test_run_on_a_database_behind_says_to_run_migrate_first(notes, fresh_database, run_cli, plugin_installer):
    Migrator(fresh_database, load_plugins()).upgrade(CORE_PLUGIN)
    env = dict(plugin_installer.env(), FACTSTREAM_DATABASE__URL=fresh_database)

    message = run_refused(run_cli, env)

    assert "error: the database is not migrated: notes (base -> notes_0001); run `factstream migrate` first" in message


def test_run_with_a_migrated_plugin_uninstalled_says_reinstall_or_detach_not_migrate(
    plugin_installer, notes, migrator, fresh_database, run_cli
):
    migrator.upgrade()
    plugin_installer.uninstall(notes)
    env = dict(plugin_installer.env(), FACTSTREAM_DATABASE__URL=fresh_database)

    message = run_refused(run_cli, env)

    assert (
        "error: the database has migrations of a plugin that is not loaded: revision 'notes_0001' belongs to plugin "
        "'notes', which is not installed. Reinstall it, or detach its migrations with "
        "`factstream migrate detach notes` (its tables are kept)."
    ) in message
    assert "not migrated" not in message and "run `factstream migrate` first" not in message


def test_run_with_a_migrated_plugin_blocked_and_another_behind_says_both_unblock_first(
    plugin_installer, notes, migrator, fresh_database, run_cli
):
    migrator.upgrade()
    plugin_installer.from_source("memos", MEMOS_PLUGIN, files=MEMOS_FILES)
    env = dict(
        plugin_installer.env(), FACTSTREAM_DATABASE__URL=fresh_database, FACTSTREAM_BLOCK_PLUGINS=blocking("notes")
    )

    message = run_refused(run_cli, env)

    assert (
        "belongs to plugin 'notes', which is installed but blocked by FACTSTREAM_BLOCK_PLUGINS. Unblock it" in message
    )
    assert "`factstream migrate detach notes` (its tables are kept)." in message
    assert (
        "The database is also not migrated: memos (base -> memos_0001); run `factstream migrate` after that."
    ) in message
    assert "notes (" not in message and "run `factstream migrate` first" not in message


def test_concurrent_migrations_from_two_processes_both_succeed(notes, fresh_database, run_cli, plugin_installer):
    import subprocess
    import sys

    env = dict(plugin_installer.env(), FACTSTREAM_DATABASE__URL=fresh_database, NO_COLOR="1")
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "factstream", "migrate"],
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=os.getcwd(),
        )
        for _ in range(2)
    ]
    results = [p.communicate(timeout=120) for p in procs]

    assert [p.returncode for p in procs] == [0, 0], results
    assert "notes" in tables(fresh_database)


def test_generated_revision_passes_the_linters(migrator):
    import subprocess
    import sys

    path = migrator.new_revision("notes", "nothing yet")

    for args in (["check", "--no-cache"], ["format", "--check", "--no-cache"]):
        done = subprocess.run([sys.executable, "-m", "ruff", *args, str(path)], capture_output=True, text=True)
        assert done.returncode == 0, done.stdout + done.stderr


def test_failing_revision_is_a_migration_error_and_applies_nothing(plugin_installer, fresh_database, cli):
    plugin_installer.from_source(
        "faulty",
        """
        import factstream
        from factstream import MigrationSpec

        @factstream.hookimpl
        def register_migrations(register):
            register(MigrationSpec.from_package("factstream_faulty.migrations"))
        """,
        files={
            "migrations/__init__.py": "",
            "migrations/faulty_0001.py": """
                from alembic import op
                import sqlalchemy as sa
                revision = "faulty_0001"
                down_revision = None
                branch_labels = ("faulty",)
                depends_on = "fs_core_0001"

                def upgrade():
                    op.create_table("faulty_things", sa.Column("id", sa.BigInteger))
                    op.execute("SELECT * FROM no_such_table")

                def downgrade():
                    pass
            """,
        },
    )

    result = cli("migrate", env=dict(plugin_installer.env(), FACTSTREAM_DATABASE__URL=fresh_database))

    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    message = " ".join(result.stderr.split())
    assert "failed (psycopg.errors.UndefinedTable" in message and "Nothing was applied" in message
    assert tables(fresh_database) == set()


# -- factstream.testing's database_with: install, then migrate ------------------------------------------

#: A one-module plugin without tables, installed from source text.
BARE_PLUGIN = """
import factstream
"""


def test_database_with_installs_the_projects_and_the_sources_then_migrates(
    database_with, notes_project, plugin_installer
):
    url = database_with(notes_project, sources={"bare": BARE_PLUGIN})

    assert [p.name for p in plugin_installer.installed] == ["notes", "bare"]
    assert {"notes", "stream_positions", "instance_map"} <= tables(url)
    assert status(Migrator(url, load_plugins()))["notes"][:2] == ("notes_0001", "notes_0001")


@pytest.mark.parametrize("only_installed", [False, True])
def test_database_with_only_installed_leaves_the_environments_plugins_out(
    database_with, notes_project, tmp_path, only_installed
):
    # A plugin installed beside the test's, as the bundled plugins are in the development environment
    # (tests/core blocks those through FACTSTREAM_BLOCK_PLUGINS; a second installer stands for one here).
    environment = PluginInstaller(tmp_path / "environment")
    try:
        environment.from_project(Path(notes_project).parent / "inbox")
        url = database_with(notes_project, only_installed=only_installed)
    finally:
        environment.cleanup()

    assert "notes" in tables(url)
    assert ("inbox" in tables(url)) is not only_installed


#: A plugin whose first revision depends on the core's head, as ``factstream new-stream`` writes it: alembic
#: then folds the core's head into this plugin's head in the version table.
LATE_FILES = one_table_files("late", CORE_HEAD)


def test_status_after_a_plugin_holding_the_core_head_is_uninstalled_says_where_each_branch_is(
    plugin_installer, notes, fresh_database, cli
):
    late = plugin_installer.from_source("late", MEMOS_PLUGIN.replace("memos", "late"), files=LATE_FILES)
    migrator = Migrator(fresh_database, load_plugins())
    try:
        migrator.upgrade()
    finally:
        migrator.close()
    plugin_installer.uninstall(late)

    after = Migrator(fresh_database, load_plugins())
    try:
        # notes' head reaches only fs_core_0001; the core is at its head all the same
        assert status(after) == {
            "factstream": (CORE_HEAD, CORE_HEAD, True),
            "notes": ("notes_0001", "notes_0001", True),
            "late": ("late_0001", None, False),
        }
    finally:
        after.close()
    shown = cli("migrate", "status", env=dict(plugin_installer.env(), FACTSTREAM_DATABASE__URL=fresh_database))
    assert shown.returncode == 0, shown.stderr
    text = flat(shown.stdout)
    assert f"factstream │ {CORE_HEAD} │ {CORE_HEAD} │ up to date" in text, text
    assert "late │ late_0001 │ - │ plugin not installed" in text, text
    assert (
        "late: revision 'late_0001' belongs to plugin 'late', which is not installed. Reinstall it, or detach its "
        "migrations with `factstream migrate detach late` (its tables are kept)."
    ) in text
