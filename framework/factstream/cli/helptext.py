"""How ``--help`` reads: click's plain metavars instead of typer's Python types, and docstrings as
paragraphs that the terminal wraps once."""

from __future__ import annotations

import inspect
from typing import Any

import typer

#: typer's type labels (``<str>``, ``<list[int]>``, ``<int range>``) as the plain words click uses.
PLAIN_TYPES = {"str": "TEXT", "int": "INTEGER", "float": "FLOAT", "bool": "", "Path": "PATH", "path": "PATH"}


def plain_type(label: str) -> str:
    """``TEXT`` for typer's ``<str>`` or ``<list[str]>``, ``INTEGER`` for ``<int range>``, ``[a|b]`` for a
    choice, nothing for ``<bool>``; other types upper-cased."""
    label = label.strip("<>")
    if label.startswith("list[") and label.endswith("]"):
        label = label[5:-1]
    label = label.removesuffix(" range")
    if "|" in label:
        return f"[{label}]"
    return PLAIN_TYPES.get(label, label.upper())


def plain_metavars(command: Any, ctx: Any) -> None:
    """Show click's plain metavars (``TEXT``, ``INTEGER``; none for a flag) in the ``--help`` of
    ``command`` and its subcommands, where typer would show Python types (``<list[str]>``, ``<bool>``).
    An option gets a metavar; an argument keeps its name (or metavar) and only its type column changes."""
    for param in command.get_params(ctx):
        if isinstance(param, typer.core.TyperOption) and param.metavar is None:
            param.metavar = plain_type(param.display_type(ctx))
        elif isinstance(param, typer.core.TyperArgument):
            label = plain_type(param.display_type(ctx))
            setattr(param, "display_type_rich", lambda ctx, label=label: label)  # noqa: B010 - an instance's own
    for sub in getattr(command, "commands", {}).values():
        plain_metavars(sub, ctx)


def reflow_help(typer_app: typer.Typer) -> None:
    """Give every command and group of ``typer_app`` (plugins' too) its help as paragraphs: Typer's rich
    help keeps a docstring's line breaks, which the terminal then wraps again, breaking sentences in the
    middle at 80 columns. Lines of a paragraph are joined; a blank line, and a line that starts a list
    item or is indented, start a new line. Idempotent."""
    for info in typer_app.registered_commands:
        text = info.help or inspect.getdoc(info.callback)
        if text:
            info.help = _paragraphs(text)
    for group in typer_app.registered_groups:
        sub = group.typer_instance
        if sub is None:
            continue
        if sub.info.help:
            sub.info.help = _paragraphs(str(sub.info.help))
        callback = sub.registered_callback
        if callback is not None and callback.callback is not None and not callback.help:
            doc = inspect.getdoc(callback.callback)
            callback.help = _paragraphs(doc) if doc else None
        reflow_help(sub)


def _paragraphs(text: str) -> str:
    out: list[str] = []
    for line in text.splitlines():
        stripped = line.strip()
        starts_own_line = not stripped or line[:1].isspace() or stripped[:2] in {"- ", "* "} or not out or not out[-1]
        if starts_own_line:
            out.append(line.rstrip())
        else:
            out[-1] = f"{out[-1]} {stripped}"
    return "\n".join(out)
