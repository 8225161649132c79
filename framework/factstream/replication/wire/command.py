"""What a replication command is: a typed value that is one line of Synapse's TCP replication protocol.

Every message between factstream processes (over TCP or Redis pub/sub) is one *command*: a line of
UTF-8 text ``NAME + " " + body``. The body's shape belongs to the command; for example::

    RDATA caches master 54 ["get_user_by_id",["@a:hs"],1490197670513]
    POSITION events master 53 53

A command without a body still has the separator: ``"REPLICATE "`` ends in a space, as Synapse
writes it. We speak Synapse's wire protocol byte for byte, so that the reference implementation's tests,
tools and captured traffic apply to us unchanged and a mixed deployment is at least conceivable.

This module holds the base class, the errors, and the field helpers every command's ``to_body`` and
``from_body`` use. Each command parses its body with a *bounded* ``split(" ", k)``, so its final field
may contain spaces: JSON, free text (``ERROR server stopping``). We are stricter than Synapse in the
places where its leniency is accidental: integers must be plain ASCII decimals (Python's ``int()``
also takes ``"+1"``, ``" 1"``, ``"1_0"`` or Arabic-Indic digits), typed JSON bodies (``USER_IP``,
``LOCK_RELEASED``) are checked against their types here rather than failing later. A malformed body
raises :class:`CommandParseError` whose message starts with the command name, e.g. ``RDATA: token
'x' is not an integer or 'batch'``.

Serialising. :meth:`Command.to_line` returns the full line *without* the terminator, such that
``parse_command(cmd.to_line()) == cmd``; :func:`encode_line` adds ``"\\n"`` and encodes to bytes for
transports. Anything that would not survive the round trip raises :class:`CommandEncodeError` at the
sender instead of confusing the receiver: a newline anywhere in the line, a line ending in ``"\\r"``
(readers strip a ``"\\r\\n"`` terminator, so the ``"\\r"`` would be lost), a space inside a field that is
not the last one, a non-``int`` token, the device ID ``"None"`` in ``USER_SYNC`` (the wire uses that
word for "no device"), or a value JSON cannot represent (NaN, infinity, arbitrary objects).
"""

from __future__ import annotations

from typing import Any, ClassVar, Self

import msgspec

from factstream.errors import FactstreamError
from factstream.replication.wire.json import decode_json, encode_json

__all__ = [
    "BlankLineError",
    "Command",
    "CommandEncodeError",
    "CommandParseError",
    "ProtocolError",
    "check_text",
    "check_word",
    "encode_line",
    "excerpt",
    "int_text",
    "json_text",
    "parse_int",
    "parse_json",
    "parse_typed_json",
    "split_fields",
]


# --------------------------------------------------------------------------------------------------
# Errors


class CommandParseError(FactstreamError, ValueError):
    """A received line is not a valid command; the message starts with the command name and says why.

    Transports answer it as Synapse does: the TCP protocol sends ``ERROR failed to parse line: ...``
    and closes, the Redis transport logs and drops the message.
    """


class BlankLineError(CommandParseError):
    """The line is empty or whitespace only. The protocol ignores such lines: catch this and carry on."""


class CommandEncodeError(FactstreamError, ValueError):
    """A command cannot be put on the wire as it is (see the module docstring for the rules).

    Raised by the sender, so that a bad command fails where it was made instead of making the
    receiver drop the connection.
    """


#: Longest excerpt of a bad value quoted in an error message; lines may be up to 16 KiB long.
EXCERPT_LENGTH = 80


def excerpt(text: str) -> str:
    """``repr`` of a value for an error message, shortened so one bad line cannot flood the logs."""
    if len(text) > EXCERPT_LENGTH:
        return repr(text[:EXCERPT_LENGTH]) + f"... ({len(text)} characters)"
    return repr(text)


class ProtocolError(Exception):
    """A peer sent something this process cannot accept; TCP answers ``ERROR`` and closes."""


# --------------------------------------------------------------------------------------------------
# Field helpers shared by the built-in commands


def parse_int(command: str, field: str, text: str) -> int:
    """Parse a decimal integer field: ASCII digits with an optional leading ``-``, nothing else."""
    if text.isascii() and (text.isdigit() or (text[:1] == "-" and text[1:].isdigit())):
        try:
            return int(text)
        except ValueError:  # more digits than int() converts (sys.get_int_max_str_digits())
            pass
    raise CommandParseError(f"{command}: {field} {excerpt(text)} is not an integer")


def split_fields(command: str, body: str, count: int) -> list[str]:
    """Split ``body`` into ``count`` fields, the last of which keeps any further spaces."""
    parts = body.split(" ", count - 1)
    if len(parts) != count:
        raise CommandParseError(f"{command}: expected {count} fields, got {len(parts)}")
    return parts


def check_word(command: str, field: str, value: object) -> str:
    """A field that is followed by another one: a ``str`` without spaces."""
    if type(value) is not str:
        raise CommandEncodeError(f"{command}: {field} must be a str, got {type(value).__name__}")
    if " " in value:
        raise CommandEncodeError(f"{command}: {field} {excerpt(value)} contains a space")
    return value


def check_text(command: str, field: str, value: object) -> str:
    """A final free-text field: any ``str`` (line breaks are checked on the whole line)."""
    if type(value) is not str:
        raise CommandEncodeError(f"{command}: {field} must be a str, got {type(value).__name__}")
    return value


def int_text(command: str, field: str, value: object) -> str:
    """An integer field as decimal text; ``bool`` is refused although it is an ``int`` subclass."""
    if type(value) is not int:
        raise CommandEncodeError(f"{command}: {field} must be an int, got {type(value).__name__}")
    return str(value)


def json_text(command: str, field: str, value: object) -> str:
    try:
        return encode_json(value)
    except (TypeError, ValueError, RecursionError) as error:
        raise CommandEncodeError(f"{command}: {field} is not JSON-serialisable: {error}") from error


def parse_json(command: str, field: str, text: str) -> Any:
    try:
        return decode_json(text)
    except ValueError as error:
        raise CommandParseError(f"{command}: {field} is not valid JSON: {error}") from None


def parse_typed_json(command: str, what: str, text: str, kind: Any) -> Any:
    """Parse a JSON body and check it against ``kind`` (a fixed-length tuple type)."""
    value = parse_json(command, "body", text)
    try:
        return msgspec.convert(value, kind)
    except msgspec.ValidationError as error:
        raise CommandParseError(f"{command}: expected a JSON array {what}: {error}") from None


# --------------------------------------------------------------------------------------------------
# The command base class


class Command(msgspec.Struct, frozen=True):
    """One replication command: a frozen, typed value whose fields are in wire order.

    Subclasses set ``NAME`` (the first word of the line, unique among the commands) and implement
    :meth:`to_body` and :meth:`from_body` such that ``cls.from_body(cmd.to_body()) == cmd`` for every
    command ``to_body`` accepts. Construction does not validate: the parser already did on the receive
    path, which is hot, and :meth:`to_line` checks what the wire needs on the send path.
    """

    NAME: ClassVar[str]

    def to_body(self) -> str:
        """The line after ``NAME + " "``; raise :class:`CommandEncodeError` for unsendable values."""
        raise NotImplementedError

    @classmethod
    def from_body(cls, body: str) -> Self:
        """Parse the line after ``NAME + " "``; raise :class:`CommandParseError` (or ``ValueError``)."""
        raise NotImplementedError

    def to_line(self) -> str:
        """The complete line, without a terminator: ``NAME + " " + body``.

        Raises :class:`CommandEncodeError` if the line holds a newline or ends in ``"\\r"`` (which a
        reader would take for part of a ``"\\r\\n"`` terminator), or if ``to_body`` refuses a field.
        """
        line = self.NAME + " " + self.to_body()
        if "\n" in line:
            raise CommandEncodeError(f"{self.NAME}: a command cannot contain a newline")
        if line[-1] == "\r":
            raise CommandEncodeError(f"{self.NAME}: a command cannot end in a carriage return")
        return line

    @classmethod
    def redis_channel(cls, prefix: str) -> str:
        """The Redis channel this command is published on: ``prefix`` (the server name) by default."""
        return prefix


def encode_line(command: Command) -> bytes:
    """The command as a UTF-8 line terminated by ``"\\n"``, ready to write to a transport."""
    line = command.to_line() + "\n"
    try:
        return line.encode("utf-8")
    except UnicodeEncodeError as error:  # a lone surrogate in a text field
        raise CommandEncodeError(f"{command.NAME}: the line is not encodable as UTF-8: {error}") from None
