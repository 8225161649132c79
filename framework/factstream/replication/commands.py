"""The replication commands and their line codec, byte-compatible with Synapse's TCP replication.

Every message between factstream processes (over TCP or Redis pub/sub) is one *command*: a line of
UTF-8 text ``NAME + " " + body``. The body's shape belongs to the command; for example::

    RDATA caches master 54 ["get_user_by_id",["@a:hs"],1490197670513]
    POSITION events master 53 53

A command without a body still has the separator: ``"REPLICATE "`` ends in a space, as Synapse
writes it. We speak Synapse's wire protocol byte for byte, so that the reference implementation's tests,
tools and captured traffic apply to us unchanged and a mixed deployment is at least conceivable.

Parsing follows Synapse exactly where a line is well-formed:

* the line is split at the **first** space into name and body (no space: the body is ``""``);
* the name is looked up in a :class:`CommandRegistry` (unknown names fail);
* the command parses its body with a *bounded* ``split(" ", k)``, so its final field may contain
  spaces: JSON, free text (``ERROR server stopping``).

We are stricter than Synapse in the places where its leniency is accidental: integers must be plain
ASCII decimals (Python's ``int()`` also takes ``"+1"``, ``" 1"``, ``"1_0"`` or Arabic-Indic digits),
typed JSON bodies (``USER_IP``, ``LOCK_RELEASED``) are checked against their types here rather than
failing later, and a line handed to :func:`parse_command` may not contain a newline other than one
trailing line terminator. A malformed line raises :class:`CommandParseError` whose message starts with
the command name, e.g. ``RDATA: token 'x' is not an integer or 'batch'``.

Blank lines. The protocol says blank (whitespace-only) lines are ignored. :func:`parse_command`
signals them by raising :class:`BlankLineError`, a subclass of :class:`CommandParseError`: a transport
that wants the documented behaviour catches that subclass and carries on, and a caller that treats
every failure alike (the Redis transport only logs) needs no special case. Raising costs nothing on
the normal path, because blankness is only checked after the name lookup failed.

Serialising. :meth:`Command.to_line` returns the full line *without* the terminator, such that
``parse_command(cmd.to_line()) == cmd``; :func:`encode_line` adds ``"\\n"`` and encodes to bytes for
transports. Anything that would not survive the round trip raises :class:`CommandEncodeError` at the
sender instead of confusing the receiver: a newline anywhere in the line, a line ending in ``"\\r"``
(readers strip a ``"\\r\\n"`` terminator, so the ``"\\r"`` would be lost), a space inside a field that is
not the last one, a non-``int`` token, the device ID ``"None"`` in ``USER_SYNC`` (the wire uses that
word for "no device"), or a value JSON cannot represent (NaN, infinity, arbitrary objects).

JSON. Bodies are written exactly as Synapse's ``json_encoder`` writes them: compact separators
``(",", ":")``, ``allow_nan=False`` and Python's default ``ensure_ascii=True`` (every non-ASCII
character as a ``\\uXXXX`` escape, astral characters as surrogate pairs, DEL as ``\\u007f``). msgspec
encodes the same bytes several times faster for the common case, but not always: it writes non-ASCII
characters raw, leaves DEL unescaped, formats floats outside ``[1e-4, 1e16)`` differently (``1e16``
for Python's ``1e+16``, ``0.00001`` for ``1e-05``), writes NaN and infinity as ``null`` instead of
failing, and accepts types the json module refuses (sets, datetimes, bytes, ...). So
:func:`encode_json` uses msgspec only for values made of plain ``dict``/``list``/``tuple``/``str``/
``int``/``bool``/``None`` and in-range ``float``, and only when msgspec's output is pure ASCII without
DEL; everything else goes through the json module configured like Synapse's encoder (which also
accepts read-only mappings, as Synapse's accepts ``immutabledict``). Decoding uses msgspec and falls
back to the json module, configured like Synapse's decoder, for the few inputs only the latter accepts
(escaped lone surrogates, numbers too large for a float), so we accept what Synapse accepts.

Received RDATA rows keep their JSON text (:attr:`RdataCommand.row_json`), and :meth:`to_line` reuses
it: relaying a row re-sends exactly the received bytes and costs no encoding. Rows are facts; treat a
received row as read-only. ``msgspec.structs.replace`` and ``copy`` build a command without that text,
which is then encoded afresh. Equality never looks at the text: two RDATA commands are equal when
stream, instance, token and row *value* are (with Python's ``==``, so ``[1] == [1.0]`` and a tuple row
differs from the list it decodes to: JSON arrays always decode to lists).

Extending. A plugin defines a subclass of :class:`Command` with a unique ``NAME``, ``to_body`` and
``from_body``, and registers it in the host's :class:`CommandRegistry` at startup. The built-in
commands live in :data:`DEFAULT_REGISTRY`, which is read-only; ``parse_command`` uses it unless given
another registry.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Iterator, Mapping
from itertools import chain, repeat
from typing import Any, ClassVar, Final, Self, TypeVar

import msgspec

from factstream.errors import FactstreamError, PluginError

__all__ = [
    "BUILTIN_COMMANDS",
    "CLIENT_SENDS",
    "DEFAULT_REGISTRY",
    "SERVER_SENDS",
    "BlankLineError",
    "CancelTaskCommand",
    "ClearUserSyncCommand",
    "Command",
    "CommandEncodeError",
    "CommandParseError",
    "CommandRegistry",
    "ErrorCommand",
    "FederationAckCommand",
    "LockReleasedCommand",
    "NameCommand",
    "NewActiveTaskCommand",
    "PingCommand",
    "PositionCommand",
    "RdataCommand",
    "RemoteServerUpCommand",
    "ReplicateCommand",
    "ServerCommand",
    "UserIpCommand",
    "UserSyncCommand",
    "decode_json",
    "encode_json",
    "encode_line",
    "encode_rdata_lines",
    "parse_command",
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
_EXCERPT = 80


def _show(text: str) -> str:
    """``repr`` of a value for an error message, shortened so one bad line cannot flood the logs."""
    if len(text) > _EXCERPT:
        return repr(text[:_EXCERPT]) + f"... ({len(text)} characters)"
    return repr(text)


# --------------------------------------------------------------------------------------------------
# JSON exactly as Synapse writes and reads it


def _reject_constant(value: str) -> None:
    """Synapse's decoder refuses the json module's extensions ``NaN``, ``Infinity``, ``-Infinity``."""
    raise ValueError(f"invalid JSON value: {value!r}")


def _plain_mapping(value: object) -> dict[Any, Any]:
    """Read-only mappings serialise as dicts (Synapse's encoder does this for ``immutabledict``)."""
    if isinstance(value, Mapping):
        return dict(value)
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


_json_encoder: Final = json.JSONEncoder(allow_nan=False, separators=(",", ":"), default=_plain_mapping)
_json_decoder: Final = json.JSONDecoder(parse_constant=_reject_constant)
_msgspec_encode: Final = msgspec.json.Encoder().encode
_msgspec_decode: Final = msgspec.json.Decoder().decode
_msgspec_encode_lines: Final = msgspec.json.Encoder().encode_lines


#: Types msgspec writes exactly like the json module (strings aside: see ``encode_json``).
_PLAIN_SCALARS: Final = frozenset({str, int, bool, type(None)})
_STR: Final = frozenset({str})


def _msgspec_writes_like_python(value: Any) -> bool:
    """Whether msgspec encodes ``value`` to the same text as the json module, non-ASCII aside.

    True for trees of exact ``dict`` (with ``str`` keys), ``list``, ``tuple``, ``str``, ``int``,
    ``bool``, ``None`` and finite floats whose ``repr`` is positional (zero or ``1e-4 <= |x| < 1e16``).
    Outside that range Python switches to exponent notation and msgspec formats differently; NaN and
    infinity must raise, which only the json module does; subclasses and other types may be encoded
    differently or not at all. Each container's element types are checked in one C-level pass
    (``issuperset(map(type, ...))``), so the walk only recurses into nested containers and floats.
    """
    kind = type(value)
    if kind is list or kind is tuple:
        items = value
    elif kind is dict:
        if not _STR.issuperset(map(type, value)):
            return False
        items = value.values()
    elif kind is float:
        size: float = abs(value)
        return size == 0.0 or 1e-4 <= size < 1e16  # False for NaN (every comparison is) and infinity
    else:
        return kind in _PLAIN_SCALARS
    if _PLAIN_SCALARS.issuperset(map(type, items)):
        return True
    # A loop rather than all(<generator>), which is about 20 % slower; this runs for every row sent.
    for item in items:  # noqa: SIM110
        if type(item) not in _PLAIN_SCALARS and not _msgspec_writes_like_python(item):
            return False
    return True


_LIST_TYPES: Final = frozenset({list, tuple})


def _plain_rows(rows: list[Any]) -> bool:
    """:func:`_msgspec_writes_like_python` for a list of rows, with a C-level pass for the usual
    shape (every row a list of plain scalars) before the general walk."""
    if _LIST_TYPES.issuperset(map(type, rows)) and _PLAIN_SCALARS.issuperset(map(type, chain.from_iterable(rows))):
        return True
    return _msgspec_writes_like_python(rows)


def encode_json(value: object) -> str:
    """Serialise ``value`` exactly as Synapse's ``json_encoder.encode`` does (see the module docstring).

    Raises ``ValueError`` for NaN and infinities and ``TypeError`` for values JSON cannot represent,
    as the json module does.
    """
    if _msgspec_writes_like_python(value):
        try:
            data = _msgspec_encode(value)
        except UnicodeEncodeError:  # a lone surrogate: the json module escapes it, we follow
            pass
        else:
            # Non-ASCII characters and DEL are the only string bytes msgspec writes differently.
            if data.isascii() and b"\x7f" not in data:
                return data.decode("ascii")
    return _json_encoder.encode(value)


def decode_json(text: str) -> Any:
    """Parse JSON text into plain Python values, accepting exactly what Synapse's ``json_decoder`` accepts.

    msgspec is tried first; the json module (without its ``NaN``/``Infinity`` extensions) decides
    when msgspec refuses, because it also reads escaped lone surrogates and numbers beyond the float
    range (as infinity). Raises ``ValueError`` with msgspec's description of the first error.
    """
    try:
        return _msgspec_decode(text)
    except (msgspec.DecodeError, RecursionError) as error:  # msgspec refuses nesting beyond ~1000 levels
        reason = str(error)
    try:
        return _json_decoder.decode(text)
    except (ValueError, RecursionError):
        raise ValueError(reason) from None


# --------------------------------------------------------------------------------------------------
# Field helpers shared by the built-in commands


def _int(command: str, field: str, text: str) -> int:
    """Parse a decimal integer field: ASCII digits with an optional leading ``-``, nothing else."""
    if text.isascii() and (text.isdigit() or (text[:1] == "-" and text[1:].isdigit())):
        try:
            return int(text)
        except ValueError:  # more digits than int() converts (sys.get_int_max_str_digits())
            pass
    raise CommandParseError(f"{command}: {field} {_show(text)} is not an integer")


def _fields(command: str, body: str, count: int) -> list[str]:
    """Split ``body`` into ``count`` fields, the last of which keeps any further spaces."""
    parts = body.split(" ", count - 1)
    if len(parts) != count:
        raise CommandParseError(f"{command}: expected {count} fields, got {len(parts)}")
    return parts


def _word(command: str, field: str, value: object) -> str:
    """A field that is followed by another one: a ``str`` without spaces."""
    if type(value) is not str:
        raise CommandEncodeError(f"{command}: {field} must be a str, got {type(value).__name__}")
    if " " in value:
        raise CommandEncodeError(f"{command}: {field} {_show(value)} contains a space")
    return value


def _text(command: str, field: str, value: object) -> str:
    """A final free-text field: any ``str`` (line breaks are checked on the whole line)."""
    if type(value) is not str:
        raise CommandEncodeError(f"{command}: {field} must be a str, got {type(value).__name__}")
    return value


def _int_text(command: str, field: str, value: object) -> str:
    """An integer field as decimal text; ``bool`` is refused although it is an ``int`` subclass."""
    if type(value) is not int:
        raise CommandEncodeError(f"{command}: {field} must be an int, got {type(value).__name__}")
    return str(value)


def _json_text(command: str, field: str, value: object) -> str:
    try:
        return encode_json(value)
    except (TypeError, ValueError, RecursionError) as error:
        raise CommandEncodeError(f"{command}: {field} is not JSON-serialisable: {error}") from error


def _json_value(command: str, field: str, text: str) -> Any:
    try:
        return decode_json(text)
    except ValueError as error:
        raise CommandParseError(f"{command}: {field} is not valid JSON: {error}") from None


def _typed_json(command: str, what: str, text: str, kind: Any) -> Any:
    """Parse a JSON body and check it against ``kind`` (a fixed-length tuple type)."""
    value = _json_value(command, "body", text)
    try:
        return msgspec.convert(value, kind)
    except msgspec.ValidationError as error:
        raise CommandParseError(f"{command}: expected a JSON array {what}: {error}") from None


# --------------------------------------------------------------------------------------------------
# The command base class


class Command(msgspec.Struct, frozen=True):
    """One replication command: a frozen, typed value whose fields are in wire order.

    Subclasses set ``NAME`` (the first word of the line, unique in a registry) and implement
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


def encode_rdata_lines(stream_name: str, instance_name: str, rows: Iterable[tuple[int | None, Any]]) -> list[bytes]:
    """``RDATA`` lines for ``(token, row)`` pairs (``None`` = ``batch``), as ``encode_line`` would write them.

    The streamer's hot path: the names are checked once for the whole run instead of once per
    row, and no command objects are built. The result is byte-identical to
    ``encode_line(RdataCommand(stream_name, instance_name, token, row))`` for each pair.
    """
    pairs = rows if isinstance(rows, list) else list(rows)
    return encode_rdata_run(stream_name, instance_name, [t for t, _ in pairs], [r for _, r in pairs])


_TOKEN_TYPES: Final = frozenset({int, type(None)})


def encode_rdata_run(
    stream_name: str, instance_name: str, tokens: list[int | None], rows: list[Any], end: bytes = b"\n"
) -> list[bytes]:
    """:func:`encode_rdata_lines` for parallel lists of tokens and rows, each line ending in ``end``
    (``b""`` for a transport that frames lines itself, such as Redis).

    When every row is plain JSON that msgspec writes exactly like the json module, and ASCII, the
    whole run is encoded in a few C calls: the rows as newline-delimited JSON in one msgspec call
    (msgspec escapes line breaks inside strings, so the only newlines are the separators), the
    tokens in another, and each line joined from its pieces. Anything else goes row by row.
    """
    _word("RDATA", "stream_name", stream_name)
    _word("RDATA", "instance_name", instance_name)
    prefix = f"RDATA {stream_name} {instance_name} "
    if "\n" in prefix:
        raise CommandEncodeError("RDATA: a command cannot contain a newline")
    if len(tokens) != len(rows):
        raise ValueError("encode_rdata_run: tokens and rows differ in length")
    if rows and _TOKEN_TYPES.issuperset(map(type, tokens)) and _plain_rows(rows):
        try:
            blob = _msgspec_encode_lines(rows)
            words = _msgspec_encode(tokens)[1:-1].split(b",")
            head = prefix.encode("utf-8")
        except UnicodeEncodeError:  # a lone surrogate: the row-by-row path escapes or reports it
            blob = b"\x80"
        if blob.isascii() and b"\x7f" not in blob:
            texts = blob.split(b"\n")
            texts.pop()
            if None in tokens:
                words = list(map(_BATCH_WORD.get, words, words))
            return list(map(b"".join, zip(repeat(head), words, repeat(b" "), texts, repeat(end))))
    lines = []
    for token, row in zip(tokens, rows, strict=True):
        if token is not None and type(token) is not int:
            _int_text("RDATA", "token", token)
        text = _json_text("RDATA", "row", row)
        line = f"{prefix}{'batch' if token is None else token} {text}"
        if "\n" in text or text[-1:] == "\r":
            raise CommandEncodeError("RDATA: a command cannot contain a newline")
        try:
            lines.append(line.encode("utf-8") + end)
        except UnicodeEncodeError as error:
            raise CommandEncodeError(f"RDATA: the line is not encodable as UTF-8: {error}") from None
    return lines


#: msgspec writes ``None`` as ``null``; on the wire a token of ``None`` is the word ``batch``.
_BATCH_WORD: Final = {b"null": b"batch"}


# --------------------------------------------------------------------------------------------------
# The built-in commands, in Synapse's order


class ServerCommand(Command, frozen=True):
    """``SERVER <server_name>``: sent by a TCP server on connect; the client checks the name it expects."""

    NAME: ClassVar[str] = "SERVER"
    server_name: str

    def to_body(self) -> str:
        return _text(self.NAME, "server_name", self.server_name)

    @classmethod
    def from_body(cls, body: str) -> Self:
        return cls(body)


class RdataCommand(Command, frozen=True, dict=True):
    """``RDATA <stream_name> <instance_name> <token> <row_json>``: one row of a stream.

    ``token`` is ``None`` for the wire word ``batch``: a writer that emits several rows with the same
    stream ID sends all but the last with ``batch`` and the last with the ID; the receiver buffers
    the batch per stream and applies it when the numeric token arrives. ``row`` is the decoded JSON,
    usually an array of the stream's row-type fields in order; the stream layer converts it.

    ``dict=True`` gives each instance a ``__dict__`` outside the struct fields, where the parser keeps
    the received row text (see :attr:`row_json`); it takes no part in equality, hashing or ``repr``.
    """

    NAME: ClassVar[str] = "RDATA"
    stream_name: str
    instance_name: str
    token: int | None
    row: Any

    @property
    def row_json(self) -> str | None:
        """The row's JSON text exactly as received, or ``None`` for a command built locally."""
        text: str | None = self.__dict__.get("_row_json")
        return text

    def to_body(self) -> str:
        stream_name, instance_name, token = self.stream_name, self.instance_name, self.token
        # The checks of _word() and _int_text(), inlined for the common case (this is the sending
        # hot path); the helpers run only to raise the precise error.
        if not (
            type(stream_name) is str
            and type(instance_name) is str
            and " " not in stream_name
            and " " not in instance_name
            and (token is None or type(token) is int)
        ):
            _word("RDATA", "stream_name", stream_name)
            _word("RDATA", "instance_name", instance_name)
            _int_text("RDATA", "token", token)
        row_json = self.__dict__.get("_row_json")
        if row_json is None:
            row_json = _json_text("RDATA", "row", self.row)
        return f"{stream_name} {instance_name} {'batch' if token is None else token} {row_json}"

    @classmethod
    def from_body(cls, body: str) -> Self:
        parts = body.split(" ", 3)
        if len(parts) != 4:
            raise CommandParseError(f"RDATA: expected 4 fields, got {len(parts)}")
        stream_name, instance_name, token_text, row_json = parts
        token: int | None
        if token_text == "batch":
            token = None
        else:  # _int() inlined (this runs for every row); the checks are ordered for the common case
            try:
                if not (token_text.isdigit() or (token_text[:1] == "-" and token_text[1:].isdigit())):
                    raise ValueError
                if not token_text.isascii():
                    raise ValueError
                token = int(token_text)  # ValueError beyond sys.get_int_max_str_digits() digits
            except ValueError:
                raise CommandParseError(f"RDATA: token {_show(token_text)} is not an integer or 'batch'") from None
        try:
            row = _msgspec_decode(row_json)
        except (msgspec.DecodeError, RecursionError):
            row = _json_value("RDATA", "row", row_json)  # the json module's second opinion, or the error
        command = cls(stream_name, instance_name, token, row)
        command.__dict__["_row_json"] = row_json
        return command


class PositionCommand(Command, frozen=True):
    """``POSITION <stream_name> <instance_name> <prev_token> <new_token>``: a writer's stream position.

    The sender guarantees it wrote no rows in ``(prev_token, new_token]``; a receiver whose view of the
    writer is outside ``[prev_token, new_token]`` has missed rows and catches up out of band. The
    first announcement after (re)connecting uses ``prev_token == new_token``.
    """

    NAME: ClassVar[str] = "POSITION"
    stream_name: str
    instance_name: str
    prev_token: int
    new_token: int

    def to_body(self) -> str:
        name = self.NAME
        return " ".join(
            (
                _word(name, "stream_name", self.stream_name),
                _word(name, "instance_name", self.instance_name),
                _int_text(name, "prev_token", self.prev_token),
                _int_text(name, "new_token", self.new_token),
            )
        )

    @classmethod
    def from_body(cls, body: str) -> Self:
        parts = body.split(" ", 3)
        if len(parts) != 4:
            raise CommandParseError(f"POSITION: expected 4 fields, got {len(parts)}")
        stream_name, instance_name, prev_text, new_text = parts
        # Inlined _int() for the common case, like RDATA's token: POSITION is the next most frequent line.
        if prev_text.isdigit() and new_text.isdigit() and prev_text.isascii() and new_text.isascii():
            try:
                return cls(stream_name, instance_name, int(prev_text), int(new_text))
            except ValueError:
                pass  # more digits than int() converts: _int() reports it
        return cls(
            stream_name,
            instance_name,
            _int("POSITION", "prev_token", prev_text),
            _int("POSITION", "new_token", new_text),
        )


class ErrorCommand(Command, frozen=True):
    """``ERROR <message>``: either side reports an error, usually before closing the connection."""

    NAME: ClassVar[str] = "ERROR"
    message: str

    def to_body(self) -> str:
        return _text(self.NAME, "message", self.message)

    @classmethod
    def from_body(cls, body: str) -> Self:
        return cls(body)


class PingCommand(Command, frozen=True):
    """``PING <data>``: keep-alive from either side; the data is free text (in practice a ms timestamp)."""

    NAME: ClassVar[str] = "PING"
    data: str

    def to_body(self) -> str:
        return _text(self.NAME, "data", self.data)

    @classmethod
    def from_body(cls, body: str) -> Self:
        return cls(body)


class NameCommand(Command, frozen=True):
    """``NAME <name>``: a TCP client tells the server a human-friendly name for the connection."""

    NAME: ClassVar[str] = "NAME"
    name: str

    def to_body(self) -> str:
        return _text(self.NAME, "name", self.name)

    @classmethod
    def from_body(cls, body: str) -> Self:
        return cls(body)


class ReplicateCommand(Command, frozen=True):
    """``REPLICATE ``: "everyone, announce your stream positions" (sent on connect).

    Sent with an empty body, hence the trailing space. Like Synapse we ignore a body on receipt:
    older Synapse versions sent ``REPLICATE <stream> <token>``.
    """

    NAME: ClassVar[str] = "REPLICATE"

    def to_body(self) -> str:
        return ""

    @classmethod
    def from_body(cls, body: str) -> Self:
        return cls()


class UserSyncCommand(Command, frozen=True):
    """``USER_SYNC <instance_id> <user_id> <device_id> <start|end> <last_sync_ms>``: presence input.

    A worker tells the presence writer that a user started or stopped syncing on it. A missing device
    is the word ``None`` on the wire, so a device really called ``None`` cannot be sent.
    """

    NAME: ClassVar[str] = "USER_SYNC"
    instance_id: str
    user_id: str
    device_id: str | None
    is_syncing: bool
    last_sync_ms: int

    def to_body(self) -> str:
        name = self.NAME
        device_id = self.device_id
        if device_id == "None":
            raise CommandEncodeError("USER_SYNC: device_id 'None' cannot be sent (the wire word for no device)")
        if type(self.is_syncing) is not bool:
            raise CommandEncodeError(f"USER_SYNC: is_syncing must be a bool, got {type(self.is_syncing).__name__}")
        return " ".join(
            (
                _word(name, "instance_id", self.instance_id),
                _word(name, "user_id", self.user_id),
                "None" if device_id is None else _word(name, "device_id", device_id),
                "start" if self.is_syncing else "end",
                _int_text(name, "last_sync_ms", self.last_sync_ms),
            )
        )

    @classmethod
    def from_body(cls, body: str) -> Self:
        instance_id, user_id, device_id, state, last_sync_ms = _fields("USER_SYNC", body, 5)
        if state != "start" and state != "end":
            raise CommandParseError(f"USER_SYNC: state {_show(state)} is not 'start' or 'end'")
        return cls(
            instance_id,
            user_id,
            None if device_id == "None" else device_id,
            state == "start",
            _int("USER_SYNC", "last_sync_ms", last_sync_ms),
        )


class FederationAckCommand(Command, frozen=True):
    """``FEDERATION_ACK <instance_name> <token>``: the federation sender processed up to ``token``."""

    NAME: ClassVar[str] = "FEDERATION_ACK"
    instance_name: str
    token: int

    def to_body(self) -> str:
        name = self.NAME
        return _word(name, "instance_name", self.instance_name) + " " + _int_text(name, "token", self.token)

    @classmethod
    def from_body(cls, body: str) -> Self:
        parts = body.split(" ")  # exactly two fields, as Synapse's unbounded split demands
        if len(parts) != 2:
            raise CommandParseError(f"FEDERATION_ACK: expected 2 fields, got {len(parts)}")
        return cls(parts[0], _int("FEDERATION_ACK", "token", parts[1]))


_UserIpArray = tuple[str, str, str, str | None, int]


class UserIpCommand(Command, frozen=True):
    """``USER_IP <user_id> <JSON [access_token, ip, user_agent, device_id, last_seen]>``: client activity.

    Published on the Redis channel ``<prefix>/USER_IP``, which only the instances that record client
    IPs subscribe to. (Synapse's docstring shows another field order; its code, and so the wire, uses
    this one.) The access token is a credential: it is left out of ``repr``.
    """

    NAME: ClassVar[str] = "USER_IP"
    user_id: str
    access_token: str
    ip: str
    user_agent: str
    device_id: str | None
    last_seen: int

    def to_body(self) -> str:
        name = self.NAME
        for field in ("access_token", "ip", "user_agent"):
            _text(name, field, getattr(self, field))
        if self.device_id is not None:
            _text(name, "device_id", self.device_id)
        _int_text(name, "last_seen", self.last_seen)
        array = (self.access_token, self.ip, self.user_agent, self.device_id, self.last_seen)
        return _word(name, "user_id", self.user_id) + " " + _json_text(name, "body", array)

    @classmethod
    def from_body(cls, body: str) -> Self:
        user_id, array_json = _fields("USER_IP", body, 2)
        what = "[access_token, ip, user_agent, device_id, last_seen]"
        array: _UserIpArray = _typed_json("USER_IP", what, array_json, _UserIpArray)
        return cls(user_id, *array)

    @classmethod
    def redis_channel(cls, prefix: str) -> str:
        return f"{prefix}/USER_IP"

    def __repr__(self) -> str:
        return (
            f"UserIpCommand(user_id={self.user_id!r}, access_token=<redacted>, ip={self.ip!r}, "
            f"user_agent={self.user_agent!r}, device_id={self.device_id!r}, last_seen={self.last_seen!r})"
        )


class RemoteServerUpCommand(Command, frozen=True):
    """``REMOTE_SERVER_UP <server_name>``: a remote homeserver seems reachable again; reset its backoff."""

    NAME: ClassVar[str] = "REMOTE_SERVER_UP"
    server_name: str

    def to_body(self) -> str:
        return _text(self.NAME, "server_name", self.server_name)

    @classmethod
    def from_body(cls, body: str) -> Self:
        return cls(body)


class ClearUserSyncCommand(Command, frozen=True):
    """``CLEAR_USER_SYNC <instance_id>``: a worker shutting down; forget the users syncing on it."""

    NAME: ClassVar[str] = "CLEAR_USER_SYNC"
    instance_id: str

    def to_body(self) -> str:
        return _text(self.NAME, "instance_id", self.instance_id)

    @classmethod
    def from_body(cls, body: str) -> Self:
        return cls(body)


class LockReleasedCommand(Command, frozen=True):
    """``LOCK_RELEASED ["<instance_name>","<lock_name>","<lock_key>"]``: a database lock was released.

    The whole body is one JSON array (so each field may hold any character). Receivers ignore their
    own echoes.
    """

    NAME: ClassVar[str] = "LOCK_RELEASED"
    instance_name: str
    lock_name: str
    lock_key: str

    def to_body(self) -> str:
        name = self.NAME
        for field in ("instance_name", "lock_name", "lock_key"):
            _text(name, field, getattr(self, field))
        return _json_text(name, "body", [self.instance_name, self.lock_name, self.lock_key])

    @classmethod
    def from_body(cls, body: str) -> Self:
        what = "[instance_name, lock_name, lock_key]"
        fields: tuple[str, str, str] = _typed_json("LOCK_RELEASED", what, body, tuple[str, str, str])
        return cls(*fields)


class NewActiveTaskCommand(Command, frozen=True):
    """``NEW_ACTIVE_TASK <task_id>``: the task scheduler tells the background-tasks instance to run a task.

    Synapse's docstring shows the ID in quotes; its code sends it bare, and so do we.
    """

    NAME: ClassVar[str] = "NEW_ACTIVE_TASK"
    task_id: str

    def to_body(self) -> str:
        return _text(self.NAME, "task_id", self.task_id)

    @classmethod
    def from_body(cls, body: str) -> Self:
        return cls(body)


class CancelTaskCommand(Command, frozen=True):
    """``CANCEL_TASK <task_id>``: the task scheduler asks the instance running a task to cancel it."""

    NAME: ClassVar[str] = "CANCEL_TASK"
    task_id: str

    def to_body(self) -> str:
        return _text(self.NAME, "task_id", self.task_id)

    @classmethod
    def from_body(cls, body: str) -> Self:
        return cls(body)


#: Every built-in command class.
BUILTIN_COMMANDS: Final[tuple[type[Command], ...]] = (
    ServerCommand,
    RdataCommand,
    PositionCommand,
    ErrorCommand,
    PingCommand,
    NameCommand,
    ReplicateCommand,
    UserSyncCommand,
    FederationAckCommand,
    UserIpCommand,
    RemoteServerUpCommand,
    ClearUserSyncCommand,
    LockReleasedCommand,
    NewActiveTaskCommand,
    CancelTaskCommand,
)

#: Names of the commands a TCP *server* may send; a client receiving anything else sends
#: ``ERROR invalid command`` and closes. Redis has no direction and does not check.
SERVER_SENDS: Final[frozenset[str]] = frozenset(
    cls.NAME
    for cls in (
        ServerCommand,
        RdataCommand,
        PositionCommand,
        ErrorCommand,
        PingCommand,
        RemoteServerUpCommand,
        LockReleasedCommand,
    )
)

#: Names of the commands a TCP *client* may send. ``NEW_ACTIVE_TASK`` and ``CANCEL_TASK`` are in
#: neither set: they only travel over Redis.
CLIENT_SENDS: Final[frozenset[str]] = frozenset(
    cls.NAME
    for cls in (
        NameCommand,
        ReplicateCommand,
        PingCommand,
        UserSyncCommand,
        ClearUserSyncCommand,
        FederationAckCommand,
        UserIpCommand,
        ErrorCommand,
        RemoteServerUpCommand,
        LockReleasedCommand,
    )
)


# --------------------------------------------------------------------------------------------------
# Registry and parsing

C = TypeVar("C", bound=type[Command])


class CommandRegistry:
    """The command classes one process understands, by wire name.

    A new registry starts with the built-in commands (pass ``commands=()`` for an empty one).
    Plugins add theirs with :meth:`register` during startup; the host then calls :meth:`freeze` so
    the set cannot change while connections are open. Names are unique: a second class for a name
    is refused with a :class:`~factstream.errors.PluginError` naming both classes.
    """

    __slots__ = ("_classes", "_frozen", "_parsers")

    def __init__(self, commands: Iterable[type[Command]] = BUILTIN_COMMANDS) -> None:
        self._classes: dict[str, type[Command]] = {}
        # name -> bound ``from_body``: what ``parse_command`` calls, looked up once per line.
        self._parsers: dict[str, Callable[[str], Command]] = {}
        self._frozen = False
        for command_class in commands:
            self.register(command_class)

    def register(self, command_class: C) -> C:
        """Add a command class; returns it, so it can be used as a class decorator."""
        if self._frozen:
            raise PluginError(
                f"cannot register replication command {_qualname(command_class)}: the registry is frozen "
                "(register commands at startup, into the host's CommandRegistry)"
            )
        if not (isinstance(command_class, type) and issubclass(command_class, Command)):
            raise PluginError(f"{command_class!r} is not a subclass of factstream's replication Command")
        name = command_class.__dict__.get("NAME")
        if not isinstance(name, str) or not name or not name.isascii() or not name.isprintable() or " " in name:
            raise PluginError(
                f"replication command {_qualname(command_class)} must define NAME as a non-empty "
                f"printable ASCII word without spaces, got {name!r}"
            )
        missing = [
            method
            for method in ("to_body", "from_body")
            # ``__func__`` unwraps the classmethod, which is bound to a different class each time.
            if getattr(getattr(command_class, method), "__func__", getattr(command_class, method))
            is getattr(getattr(Command, method), "__func__", getattr(Command, method))
        ]
        if missing:
            raise PluginError(
                f"replication command {name} ({_qualname(command_class)}) does not define {' or '.join(missing)}"
            )
        existing = self._classes.get(name)
        if existing is not None:
            raise PluginError(
                f"replication command {name} is already registered by {_qualname(existing)}; "
                f"{_qualname(command_class)} cannot register it again"
            )
        self._classes[name] = command_class
        self._parsers[name] = command_class.from_body
        return command_class

    def freeze(self) -> None:
        """Refuse further registrations (the set of commands is fixed once the process runs)."""
        self._frozen = True

    @property
    def frozen(self) -> bool:
        return self._frozen

    def get(self, name: str) -> type[Command] | None:
        """The class registered for a wire name, if any."""
        return self._classes.get(name)

    def __contains__(self, name: object) -> bool:
        return name in self._classes

    def __iter__(self) -> Iterator[type[Command]]:
        return iter(self._classes.values())

    def __len__(self) -> int:
        return len(self._classes)

    def __repr__(self) -> str:
        return f"CommandRegistry({sorted(self._classes)!r}, frozen={self._frozen})"


def _qualname(cls: object) -> str:
    """``module.Class`` for messages: the module says which plugin a class comes from."""
    return f"{getattr(cls, '__module__', '?')}.{getattr(cls, '__qualname__', repr(cls))}"


#: The built-in commands, read-only; what :func:`parse_command` uses when given no registry.
DEFAULT_REGISTRY: Final = CommandRegistry()
DEFAULT_REGISTRY.freeze()
_DEFAULT_PARSERS: Final = DEFAULT_REGISTRY._parsers


def _decode_line(line: bytes) -> str:
    try:
        return line.decode("utf-8")
    except UnicodeDecodeError as error:
        name = line[:_EXCERPT].partition(b" ")[0].decode("utf-8", "replace")
        raise CommandParseError(f"{name}: line is not valid UTF-8: {error}") from None


def parse_command(line: str | bytes, registry: CommandRegistry | None = None) -> Command:
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
    parser = (_DEFAULT_PARSERS if registry is None else registry._parsers).get(name)
    if parser is None:
        if not text.strip():
            raise BlankLineError("blank line")
        raise CommandParseError(f"unknown command {_show(name)}")
    try:
        return parser(body)
    except CommandParseError:
        raise
    except ValueError as error:  # a plugin's from_body may raise plain ValueError
        raise CommandParseError(f"{name}: {error}") from error
