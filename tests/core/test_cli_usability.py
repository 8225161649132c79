"""What an operator reads from the CLI: options after the command, migrate's output and its question,
database errors with their fix, unwrapped paths, plain metavars, the stream name limit."""

from __future__ import annotations

import os
import pty
import re
import subprocess
import sys
import time

import pytest
from hypothesis import given
from hypothesis import strategies as st

from factstream.cli import lift_config_option, plain_type
from factstream.db.engine import check_database
from factstream.errors import DatabaseError
from factstream.migrate import Migrator
from factstream.plugin.manager import load_plugins
from factstream.scaffold import MAX_NAME_LENGTH, StreamPlugin
from tests.core.test_migrate import tables

# -- -c/--config and -v after the command ---------------------------------------------------------------

#: Words that are neither a root option nor an option value of the root.
plain_words = st.lists(st.text("abcxyz-=_.", min_size=1).filter(lambda w: w not in {"-v", "--"}), max_size=6).map(
    lambda ws: [w for w in ws if not w.startswith(("-c", "--c", "--v"))]
)


@given(before=plain_words, after=plain_words, path=st.text("abc/._", min_size=1))
def test_config_anywhere_before_dash_dash_moves_to_the_front_and_nothing_else_moves(before, after, path):
    assert lift_config_option([*before, *after]) == [*before, *after]
    for spelling in (["-c", path], ["--config", path], [f"--config={path}"]):
        assert lift_config_option([*before, *spelling, *after]) == [*spelling, *before, *after]
    # The last file given wins: order is kept; nothing after "--" moves.
    assert lift_config_option(["-c", "a", "migrate", "-c", "b", "--", "-c", "x"]) == [
        "-c",
        "a",
        "-c",
        "b",
        "migrate",
        "--",
        "-c",
        "x",
    ]


def test_plain_type_names_what_typer_shows_as_python_types():
    assert [plain_type(t) for t in ("<str>", "<list[str]>", "<int range>", "<bool>", "<Path>", "<a|b>")] == [
        "TEXT",
        "TEXT",
        "INTEGER",
        "",
        "PATH",
        "[a|b]",
    ]


def test_migrate_after_the_command_names_the_database_and_shows_one_line_per_revision(cli, fresh_database, tmp_path):
    secret_url = fresh_database.replace("postgresql://postgres@", "postgresql://postgres:s3cret@")
    config = tmp_path / "x.yaml"
    config.write_text(f"database:\n  url: {secret_url}\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("FACTSTREAM_DATABASE")}
    name = fresh_database.rsplit("/", 1)[1]

    result = cli("migrate", "-c", str(config), env=env)

    assert result.returncode == 0, result.stderr
    lines = result.stderr.splitlines()
    assert (
        lines[0] == f"migrating database {name} on 127.0.0.1:{fresh_database.split(':')[2].split('/')[0]} as postgres"
    )
    head = Migrator(fresh_database, load_plugins()).head_of("factstream")
    assert [line.split(",")[0] for line in lines[1:]] == [
        f"Running upgrade {'' if n == 1 else f'fs_core_000{n - 1}'} -> fs_core_000{n}"
        for n in range(1, int(head[-1]) + 1)
    ]
    assert "s3cret" not in result.stdout + result.stderr
    assert "Context impl" not in result.stderr and "transactional DDL" not in result.stderr

    verbose = cli("migrate", "status", "-v", "--config", str(config), env=env)
    assert verbose.returncode == 0, verbose.stderr
    assert "status of database" in verbose.stderr and "INFO" in verbose.stderr


def test_run_takes_its_config_after_the_command(run_cli):
    result = run_cli("run", "-c", "missing.yaml")

    assert result.returncode == 2
    assert "missing.yaml" in result.stderr and "Traceback" not in result.stderr


# -- migrate down asks first ---------------------------------------------------------------------------


@pytest.fixture
def notes_migrated(plugin_installer, notes_project, fresh_database) -> dict[str, str]:
    plugin_installer.from_project(notes_project)
    migrator = Migrator(fresh_database, load_plugins())
    try:
        migrator.upgrade()
    finally:
        migrator.close()
    return dict(plugin_installer.env(), FACTSTREAM_DATABASE__URL=fresh_database)


def test_migrate_down_without_a_terminal_or_yes_refuses_and_drops_nothing(run_cli, notes_migrated):
    result = run_cli("migrate", "down", "--plugin", "notes", env=notes_migrated)

    assert result.returncode == 2
    message = " ".join(result.stderr.split())
    assert "would downgrade plugin 'notes' to its base: undo notes_0001" in message
    assert "rerun with --yes" in message and "Traceback" not in message
    assert "notes" in tables(notes_migrated["FACTSTREAM_DATABASE__URL"])


def test_migrate_down_asks_on_a_terminal_and_no_keeps_the_tables(notes_migrated, tmp_path):
    primary, secondary = pty.openpty()
    proc = subprocess.Popen(
        [sys.executable, "-m", "factstream", "migrate", "down", "--plugin", "notes"],
        stdin=secondary,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=dict(notes_migrated, NO_COLOR="1", COLUMNS="200"),
        cwd=tmp_path,
    )
    os.close(secondary)
    try:
        os.write(primary, b"n\n")
        _, stderr = proc.communicate(timeout=120)
    finally:
        os.close(primary)

    assert proc.returncode == 1, stderr
    assert "Downgrade plugin 'notes' to its base: undo notes_0001" in " ".join(stderr.split())
    assert "nothing was dropped" in stderr
    assert "notes" in tables(notes_migrated["FACTSTREAM_DATABASE__URL"])


# -- permanent database errors fail fast with the fix ------------------------------------------------------


def test_a_missing_database_or_role_fails_at_once_with_the_fix(factstream_server_url):
    server = factstream_server_url.rsplit("/", 1)[0]
    port = server.rsplit(":", 1)[1]
    cases = {
        f"{server}/no_such_db_here": f"`createdb -h 127.0.0.1 -p {port} -U postgres no_such_db_here`",
        server.replace("postgres@", "no_such_role:pw@") + "/postgres": 'CREATE ROLE "no_such_role" LOGIN',
    }
    for url, fix in cases.items():
        started = time.monotonic()
        with pytest.raises(DatabaseError) as info:
            check_database(url, timeout=30)
        assert time.monotonic() - started < 5
        assert fix in str(info.value)
        assert "pw" not in str(info.value).replace("password", "")


def test_the_cli_shows_a_missing_database_with_createdb(cli, factstream_server_url):
    url = factstream_server_url.rsplit("/", 1)[0] + "/no_such_db_here"
    env = dict(os.environ, FACTSTREAM_DATABASE__URL=url, FACTSTREAM_DATABASE__CONNECT_TIMEOUT="60")

    result = cli("migrate", "status", env=env)

    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert re.search(r"To fix it, create it with\s+`createdb -h 127\.0\.0\.1 -p \d+ -U postgres", result.stderr)


# -- paths, help, names --------------------------------------------------------------------------------


def test_new_stream_takes_a_49_character_name_and_prints_a_long_path_whole_on_a_narrow_terminal(cli, tmp_path):
    name = "a" * MAX_NAME_LENGTH
    target = tmp_path / ("a-rather-long-directory-name-" * 3) / "plugin"

    result = cli("new-stream", name, str(target), env=dict(os.environ, COLUMNS="40"))

    assert result.returncode == 0, result.stderr
    shown = target.relative_to(tmp_path)  # printed relative to the working directory
    assert re.fullmatch(rf"created the {name} stream plugin in {shown} \(\d+ files\)", result.stdout.splitlines()[0])
    assert f"  cd {shown}" in result.stdout.splitlines()


@pytest.mark.parametrize("length", [MAX_NAME_LENGTH + 1, 63, 64])
def test_a_longer_stream_name_is_refused_saying_49(length):
    with pytest.raises(ValueError, match=f"too long for a new stream: at most 49 characters \\(it has {length}\\)"):
        StreamPlugin("b" * length)
    assert MAX_NAME_LENGTH + len("_stream_id_key") == 63


#: Runs ``--help`` for every command and subcommand in one process, the bundled plugins' included.
HELP_EVERYWHERE = """
import typer
from factstream import cli

cli._add_plugin_commands()
root = typer.main.get_command(cli.app)

def paths(command, prefix):
    yield prefix
    for name, sub in sorted(getattr(command, "commands", {}).items()):
        yield from paths(sub, [*prefix, name])

for path in paths(root, []):
    print("=== factstream", *path, flush=True)
    try:
        root.main([*path, "--help"], prog_name="factstream")
    except SystemExit:
        pass
"""


def test_help_shows_plain_metavars_for_every_command(tmp_path):
    env = dict(os.environ, COLUMNS="200", NO_COLOR="1", FACTSTREAM_BLOCK_PLUGINS="")
    done = subprocess.run(
        [sys.executable, "-c", HELP_EVERYWHERE], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=120
    )

    assert done.returncode == 0, done.stderr
    helps = done.stdout.split("=== ")[1:]
    commands = {h.splitlines()[0] for h in helps}
    assert {"factstream", "factstream tokens create", "factstream migrate down", "factstream export"} <= commands
    for text in helps:
        python_types = re.findall(r"<(?:str|int|float|bool|list\[\w+\]|Path|\w+ range)>", text)
        assert not python_types, text
    export = next(h for h in helps if h.startswith("factstream export\n"))
    assert re.search(r"--conf\s+TEXT", export) and re.search(r"jobs\.\.\.\s+TEXT", export)
