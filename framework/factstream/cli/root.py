"""The root command, ``factstream`` itself: its typer ``app``, its options ``-c/--config`` and
``-v/--verbose`` (which may also follow the command) and its callback, which runs before every command."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Annotated, Any

import typer

from factstream.cli import session
from factstream.cli.helptext import plain_metavars
from factstream.cli.log_setup import setup_logging

#: The root's ``-c/--config`` spellings that may also follow the command.
CONFIG_FLAGS = ("-c", "--config")
#: The root's ``-v/--verbose``, which may also follow the command.
VERBOSE_FLAGS = ("-v", "--verbose")


def lift_config_option(args: list[str], command: Any = None) -> list[str]:
    """``args`` with every ``-c FILE``/``--config FILE``/``--config=FILE`` and ``-v``/``--verbose``
    moved to the front, in order (so the last file given wins), so that the root options may also
    follow the command (``factstream migrate -c x.yaml -v``). Nothing after ``--`` moves, and nothing
    moves for a command that has an option of these names of its own."""
    if command is not None and any(set(CONFIG_FLAGS + VERBOSE_FLAGS) & set(p.opts) for p in command.params):
        return args
    lifted: list[str] = []
    rest: list[str] = []
    i = 0
    while i < len(args):
        arg = args[i]
        if arg == "--":
            rest += args[i:]
            break
        if arg in CONFIG_FLAGS:
            lifted += args[i : i + 2]
            i += 2
            continue
        (lifted if arg.startswith("--config=") or arg in VERBOSE_FLAGS else rest).append(arg)
        i += 1
    return lifted + rest


class _RootGroup(typer.core.TyperGroup):
    """The root command: accepts ``-c/--config`` and ``-v`` after the command too
    (:func:`lift_config_option`), and gives every command's ``--help`` plain metavars
    (:func:`plain_metavars`)."""

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        plain_metavars(self, ctx)
        name = _command_name(args)
        command = self.get_command(ctx, name) if name else None
        return super().parse_args(ctx, lift_config_option(args, command))


def _command_name(args: list[str]) -> str | None:
    """The first argument that is not a root option or its value: the command's name."""
    i = 0
    while i < len(args):
        if args[i] == "--":
            return None
        if args[i] in CONFIG_FLAGS:
            i += 2
            continue
        if not args[i].startswith("-"):
            return args[i]
        i += 1
    return None


app = typer.Typer(
    name="factstream",
    cls=_RootGroup,
    help="Streams of facts in PostgreSQL, replicated between processes. The guides: docs/ in factstream's "
    "source repository (`./dev docs` there builds them into a site).",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode="rich",
)


@app.callback()
def _root(
    config: Annotated[
        Path | None,
        typer.Option(
            "--config",
            "-c",
            metavar="FILE",
            help="YAML config file (default: $FACTSTREAM_CONFIG or ./factstream.yaml); may also follow the command.",
        ),
    ] = None,
    verbose: Annotated[
        bool, typer.Option("--verbose", "-v", help="Log what happens (INFO level); may also follow the command.")
    ] = False,
) -> None:
    state = session.state
    state.config_path = config
    state.verbose = verbose
    setup_logging(logging.INFO if verbose else logging.WARNING)
    # A bad config file is an error for every command; a good one says how to write log lines.
    setup_logging(logging.INFO if verbose else logging.WARNING, state.settings.logging.format)
