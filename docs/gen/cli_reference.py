"""The CLI reference (docs/reference/cli.md), generated from the ``factstream`` command itself.

The CLI is a typer app: ``typer.main.get_command(app)`` is the click group it runs as, with every command,
argument and option it registers and their help texts. :func:`cli_reference` walks it and writes one
section per command: its help, its usage line, its arguments and options.
"""

from __future__ import annotations

import html
from collections.abc import Iterator
from typing import Any

import typer

from factstream.cli import app, plain_metavars


def root_command() -> Any:
    """The click group ``factstream`` runs, with the metavars its ``--help`` shows (TEXT, INTEGER)."""
    command = typer.main.get_command(app)
    plain_metavars(command, command.context_class(command, info_name="factstream"))
    return command


def command_paths(command: Any | None = None, prefix: str = "factstream") -> list[str]:
    """Every command's full name (``factstream migrate status``), the root first, subcommands in order."""
    command = command or root_command()
    paths = [prefix]
    for name in sorted(getattr(command, "commands", {})):
        paths += command_paths(command.commands[name], f"{prefix} {name}")
    return paths


def cli_reference() -> str:
    """The markdown of every command's section."""
    command = root_command()
    return "\n".join(_sections(command, command.context_class(command, info_name="factstream"), 2))


def _text(value: str) -> str:
    """Help text as markdown that shows it as written (no HTML, no emphasis)."""
    escaped = html.escape(value, quote=False)
    for char in "*_`[]|":
        escaped = escaped.replace(char, "\\" + char)
    return escaped


def _sections(command: Any, ctx: Any, level: int) -> Iterator[str]:
    yield f"{'#' * min(level, 4)} `{ctx.command_path}`\n"
    for paragraph in (command.help or "").strip().split("\n\n"):
        if paragraph.strip():
            yield _text(" ".join(line.strip() for line in paragraph.splitlines())) + "\n"
    usage = " ".join([ctx.command_path, *command.collect_usage_pieces(ctx)])
    yield f"```\n{usage}\n```\n"
    params = [p for p in command.get_params(ctx) if not getattr(p, "hidden", False)]
    if params:
        yield "| Argument or option | Help | Default |\n|---|---|---|"
        for param in params:
            yield _param_row(param, ctx)
        yield ""
    subcommands = getattr(command, "commands", {})
    if subcommands:
        yield "Commands: " + ", ".join(f"`{name}`" for name in sorted(subcommands)) + ".\n"
    for name in sorted(subcommands):
        sub = subcommands[name]
        yield from _sections(sub, sub.context_class(sub, info_name=name, parent=ctx), level + 1)


def _param_row(param: Any, ctx: Any) -> str:
    if param.param_type_name == "argument":
        names = f"`{param.metavar or param.name.upper()}`"
    else:
        flags = [*param.opts, *param.secondary_opts]
        names = ", ".join(f"`{flag}`" for flag in flags)
        if param.metavar and not param.is_flag:
            names += f" `{param.metavar}`"
    default = param.default
    shown = (
        f"`{default}`"
        if default not in (None, False, (), []) and not callable(default) and param.show_default is not False
        else ""
    )
    required = " (required)" if param.required else ""
    return f"| {names}{required} | {_text(' '.join((param.help or '').split()))} | {shown} |"
