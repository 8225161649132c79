"""The ``factstream`` command: plugins listing, plugin commands, errors without tracebacks."""

from __future__ import annotations

import re

from tests.core.test_plugins import NOTES_DUPLICATE


def test_plugins_lists_installed_plugins_with_version_streams_and_branch(plugin_installer, notes_project, cli):
    plugin_installer.from_project(notes_project)

    result = cli("plugins", env=plugin_installer.env())

    assert result.returncode == 0, result.stderr
    assert re.search(r"factstream \(core\)\s+│\s+[\d.]+\s+│.*│\s+-\s+│\s+factstream", result.stdout)
    assert re.search(r"notes\s+│\s+0\.3\.1\s+│\s+factstream_notes\s+│\s+notes\s+│\s+notes", result.stdout)


def test_blocking_a_plugin_through_the_environment_hides_it(plugin_installer, notes_project, cli):
    plugin_installer.from_project(notes_project)
    env = dict(plugin_installer.env(), FACTSTREAM_BLOCK_PLUGINS="notes")

    result = cli("plugins", env=env)

    assert result.returncode == 0, result.stderr
    assert "factstream_notes" not in result.stdout
    assert "factstream (core)" in result.stdout


def test_duplicate_stream_fails_at_startup_naming_both_plugins(plugin_installer, notes_project, cli):
    plugin_installer.from_project(notes_project)
    plugin_installer.from_source("copycat", NOTES_DUPLICATE)

    result = cli("plugins", env=plugin_installer.env())

    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    assert "duplicate stream 'notes': registered by both plugins 'copycat' and 'notes'" in " ".join(
        result.stderr.split()
    )


def test_plugins_add_commands_to_the_cli(plugin_installer, cli):
    plugin_installer.from_source(
        "greeter",
        """
        import typer
        import factstream
        from factstream import CommandSpec

        def hello(name: str = "world"):
            print(f"hello {name}")

        tools = typer.Typer()

        @tools.command()
        def count(n: int):
            print(list(range(n)))

        @factstream.hookimpl
        def register_commands(register):
            register(CommandSpec(name="hello", app=hello, help="Say hello."))
            register(CommandSpec(name="tools", app=tools, help="Greeter tools."))
        """,
    )
    env = plugin_installer.env()

    helped = cli("--help", env=env)
    assert "Say hello." in helped.stdout and "Greeter tools." in helped.stdout
    assert cli("hello", "--name", "ada", env=env).stdout.strip() == "hello ada"
    assert cli("tools", "count", "3", env=env).stdout.strip() == "[0, 1, 2]"


def test_plugin_command_shadowing_a_builtin_is_rejected(plugin_installer, cli):
    plugin_installer.from_source(
        "shadow",
        """
        import factstream
        from factstream import CommandSpec

        @factstream.hookimpl
        def register_commands(register):
            register(CommandSpec(name="migrate", app=lambda: None))
        """,
    )

    result = cli("plugins", env=plugin_installer.env())

    assert result.returncode == 2
    assert "plugin 'shadow' registers command 'migrate', which is built in" in result.stderr


def test_help_lists_every_builtin_command(cli):
    result = cli("--help")

    assert result.returncode == 0
    for command in ("plugins", "migrate", "demo"):
        assert re.search(rf"│ {command}\s", result.stdout), command
    migrate_help = cli("migrate", "--help").stdout
    for sub in ("status", "down", "new", "detach"):
        assert re.search(rf"│ {sub}\s", migrate_help), sub
