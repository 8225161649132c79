"""Every ``factstream`` command's ``--help`` at 80 columns (issue 44, item 10): its description is wrapped
by the terminal's width only, never broken in the middle of a sentence by a docstring's own line breaks."""

from __future__ import annotations

import itertools
import re

import click
import pytest
import typer

from factstream import cli as cli_module


def command_paths() -> list[tuple[str, ...]]:
    """Every command and group, as the arguments that name it (plugins' commands included)."""
    cli_module._add_plugin_commands()
    root = typer.main.get_command(cli_module.app)

    def walk(command: click.Command, path: tuple[str, ...]) -> list[tuple[str, ...]]:
        found = [path]
        for name, sub in sorted(getattr(command, "commands", {}).items()):  # a group: its commands
            found += walk(sub, (*path, name))
        return found

    return walk(root, ())


def description(help_text: str) -> list[str]:
    """The lines of the description: after ``Usage:``, before the first box."""
    lines = help_text.splitlines()
    start = next(i for i, line in enumerate(lines) if "Usage:" in line) + 1
    end = next((i for i, line in enumerate(lines) if line.lstrip().startswith("╭")), len(lines))
    return [line.rstrip() for line in lines[start:end]]


@pytest.mark.parametrize("path", command_paths(), ids=lambda p: " ".join(p) or "factstream")
def test_help_at_80_columns_breaks_lines_only_where_the_width_does(cli, path):
    result = cli(*path, "--help", env={"PATH": "/usr/bin:/bin"}, columns=80)
    assert result.returncode == 0, result.stderr
    lines = description(result.stdout)
    assert any(lines), result.stdout
    early = [
        f"{line!r} then {following!r}"
        for line, following in itertools.pairwise(lines)
        if line.strip() and following.strip() and not re.match(r"\s*[-*] ", following)
        and len(line) + 1 + len(following.split()[0]) <= 79  # the next word would have fit
    ]  # fmt: skip
    assert early == [], "\n".join(early)


def test_the_root_help_points_at_the_guides_and_migrate_says_what_it_does_alone(cli):
    root = " ".join(cli("--help", env={"PATH": "/usr/bin:/bin"}, columns=200).stdout.split())
    assert "See docs/ for the guides" not in root
    assert "docs/ in factstream's source repository" in root
    migrate = " ".join(cli("migrate", "--help", env={"PATH": "/usr/bin:/bin"}, columns=200).stdout.split())
    assert "`factstream migrate` alone upgrades every migration branch to its head" in migrate
