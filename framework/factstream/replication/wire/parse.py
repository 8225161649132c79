"""Parsing a received line into its command.

Parsing follows Synapse exactly where a line is well-formed:

* the line is split at the **first** space into name and body (no space: the body is ``""``);
* the name is looked up among the built-in commands (unknown names fail);
* the command parses its body (see :mod:`factstream.replication.wire.command` for the field rules).

We are stricter than Synapse in one more place: a line handed to :func:`parse_command` may not contain
a newline other than one trailing line terminator. A malformed line raises
:class:`~factstream.replication.wire.command.CommandParseError` whose message starts with the command
name.

Blank lines. The protocol says blank (whitespace-only) lines are ignored. :func:`parse_command`
signals them by raising :class:`BlankLineError`, a subclass of :class:`CommandParseError`: a transport
that wants the documented behaviour catches that subclass and carries on, and a caller that treats
every failure alike (the Redis transport only logs) needs no special case. Raising costs nothing on
the normal path, because blankness is only checked after the name lookup failed.

The commands are the built-in ones only: plugins cannot define replication commands (decision 18 in
docs/decisions.md).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Final

from factstream.replication.wire.builtin import BUILTIN_COMMANDS
from factstream.replication.wire.command import (
    EXCERPT_LENGTH,
    BlankLineError,
    Command,
    CommandParseError,
    excerpt,
)

__all__ = ["parse_command"]

#: Wire name -> the command's bound ``from_body``: what :func:`parse_command` looks up once per line.
_PARSERS: Final[dict[str, Callable[[str], Command]]] = {cls.NAME: cls.from_body for cls in BUILTIN_COMMANDS}


def _decode_line(line: bytes) -> str:
    try:
        return line.decode("utf-8")
    except UnicodeDecodeError as error:
        name = line[:EXCERPT_LENGTH].partition(b" ")[0].decode("utf-8", "replace")
        raise CommandParseError(f"{name}: line is not valid UTF-8: {error}") from None


def parse_command(line: str | bytes) -> Command:
    """Parse one received line into its command (see the module docstring for the rules).

    ``line`` may end in one ``"\\n"`` or ``"\\r\\n"``, which is removed; bytes must be UTF-8. Raises
    :class:`BlankLineError` for an empty or whitespace-only line (to be ignored) and
    :class:`CommandParseError` for anything else that is not a valid command.
    """
    text = line if isinstance(line, str) else _decode_line(line)
    if "\n" in text:
        if text[-2:] == "\r\n":
            text = text[:-2]
        elif text[-1] == "\n":
            text = text[:-1]
        if "\n" in text:
            raise CommandParseError(f"{text.partition(' ')[0]}: a line cannot contain a newline")
    name, _, body = text.partition(" ")
    parser = _PARSERS.get(name)
    if parser is None:
        if not text.strip():
            raise BlankLineError("blank line")
        raise CommandParseError(f"unknown command {excerpt(name)}")
    try:
        return parser(body)
    except CommandParseError:
        raise
    except ValueError as error:  # from_body may raise plain ValueError (Command.from_body allows it)
        raise CommandParseError(f"{name}: {error}") from error
