"""A stream's rows and positions on the wire: ``RDATA`` and ``POSITION``, and RDATA lines in bulk.

These two commands are nearly all of a busy link's traffic, so their ``to_body`` and ``from_body``
inline the field helpers' checks for the common case (the helpers run only to raise the precise
error), and the streamer encodes many rows at once with :func:`encode_rdata_run` without building
command objects. (Reading many RDATA lines at once is :mod:`factstream.replication.wire.runs`.)

Received RDATA rows keep their JSON text (:attr:`RdataCommand.row_json`), and :meth:`to_line` reuses
it: relaying a row re-sends exactly the received bytes and costs no encoding. Rows are facts; treat a
received row as read-only. ``msgspec.structs.replace`` and ``copy`` build a command without that text,
which is then encoded afresh. Equality never looks at the text: two RDATA commands are equal when
stream, instance, token and row *value* are (with Python's ``==``, so ``[1] == [1.0]`` and a tuple row
differs from the list it decodes to: JSON arrays always decode to lists).
"""

from __future__ import annotations

from collections.abc import Iterable
from itertools import repeat
from typing import Any, ClassVar, Final, Self

import msgspec

from factstream.replication.wire.command import (
    Command,
    CommandEncodeError,
    CommandParseError,
    check_word,
    excerpt,
    int_text,
    json_text,
    parse_int,
    parse_json,
)
from factstream.replication.wire.json import msgspec_decode, msgspec_encode, msgspec_encode_lines, plain_rows

__all__ = ["PositionCommand", "RdataCommand", "encode_rdata_lines", "encode_rdata_run"]


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
        # The checks of check_word() and int_text(), inlined for the common case (this is the sending
        # hot path); the helpers run only to raise the precise error.
        if not (
            type(stream_name) is str
            and type(instance_name) is str
            and " " not in stream_name
            and " " not in instance_name
            and (token is None or type(token) is int)
        ):
            check_word("RDATA", "stream_name", stream_name)
            check_word("RDATA", "instance_name", instance_name)
            int_text("RDATA", "token", token)
        row_json = self.__dict__.get("_row_json")
        if row_json is None:
            row_json = json_text("RDATA", "row", self.row)
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
        else:  # parse_int() inlined (this runs for every row); the checks are ordered for the common case
            try:
                if not (token_text.isdigit() or (token_text[:1] == "-" and token_text[1:].isdigit())):
                    raise ValueError
                if not token_text.isascii():
                    raise ValueError
                token = int(token_text)  # ValueError beyond sys.get_int_max_str_digits() digits
            except ValueError:
                raise CommandParseError(f"RDATA: token {excerpt(token_text)} is not an integer or 'batch'") from None
        try:
            row = msgspec_decode(row_json)
        except (msgspec.DecodeError, RecursionError):
            row = parse_json("RDATA", "row", row_json)  # the json module's second opinion, or the error
        command = cls(stream_name, instance_name, token, row)
        command.__dict__["_row_json"] = row_json
        return command


class PositionCommand(Command, frozen=True):
    """``POSITION <stream_name> <instance_name> <prev_token> <new_token> [<stamp>]``: a writer's stream position.

    The sender guarantees it wrote no rows in ``(prev_token, new_token]``; a receiver whose view of the
    writer is outside ``[prev_token, new_token]`` has missed rows and catches up out of band. The
    first announcement after (re)connecting uses ``prev_token == new_token``.

    Beyond the reference: ``stamp``, the writer's wall clock in milliseconds when it reached
    ``new_token``, an optional trailing field. Lines without it (the reference's) parse with ``stamp``
    None; the transports send it only to peers that said they read it (a reference peer could not
    parse it), and readers use it only through an offset estimated per writer, never compared with
    their own clock directly (see docs/replication.md, "Lag").
    """

    NAME: ClassVar[str] = "POSITION"
    stream_name: str
    instance_name: str
    prev_token: int
    new_token: int
    stamp: int | None = None

    def to_body(self) -> str:
        name = self.NAME
        fields = [
            check_word(name, "stream_name", self.stream_name),
            check_word(name, "instance_name", self.instance_name),
            int_text(name, "prev_token", self.prev_token),
            int_text(name, "new_token", self.new_token),
        ]
        if self.stamp is not None:
            fields.append(int_text(name, "stamp", self.stamp))
        return " ".join(fields)

    def unstamped(self) -> PositionCommand:
        """The same position without ``stamp``: the reference's line, for peers that do not read it."""
        return PositionCommand(self.stream_name, self.instance_name, self.prev_token, self.new_token)

    @classmethod
    def from_body(cls, body: str) -> Self:
        parts = body.split(" ", 4)
        if len(parts) < 4:
            raise CommandParseError(f"POSITION: expected 4 fields, got {len(parts)}")
        stream_name, instance_name, prev_text, new_text = parts[:4]
        stamp = parse_int("POSITION", "stamp", parts[4]) if len(parts) == 5 else None
        # Inlined parse_int() for the common case, like RDATA's token: POSITION is the next most frequent line.
        if prev_text.isdigit() and new_text.isdigit() and prev_text.isascii() and new_text.isascii():
            try:
                return cls(stream_name, instance_name, int(prev_text), int(new_text), stamp)
            except ValueError:
                pass  # more digits than int() converts: parse_int() reports it
        return cls(
            stream_name,
            instance_name,
            parse_int("POSITION", "prev_token", prev_text),
            parse_int("POSITION", "new_token", new_text),
            stamp,
        )


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
    check_word("RDATA", "stream_name", stream_name)
    check_word("RDATA", "instance_name", instance_name)
    prefix = f"RDATA {stream_name} {instance_name} "
    if "\n" in prefix:
        raise CommandEncodeError("RDATA: a command cannot contain a newline")
    if len(tokens) != len(rows):
        raise ValueError("encode_rdata_run: tokens and rows differ in length")
    if rows and _TOKEN_TYPES.issuperset(map(type, tokens)) and plain_rows(rows):
        try:
            blob = msgspec_encode_lines(rows)
            words = msgspec_encode(tokens)[1:-1].split(b",")
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
            int_text("RDATA", "token", token)
        text = json_text("RDATA", "row", row)
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
