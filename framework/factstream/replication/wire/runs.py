"""Reading many RDATA lines at once: what both transports do with the lines of a busy link.

A reader receiving tens of thousands of rows a second would spend most of its time parsing lines one
by one. Consecutive RDATA lines of one stream and writer become one :class:`RdataRun` instead: their
rows are checked to be one JSON value each in one msgspec call (and decoded, into the stream's row
type, in one more by the handler), and a chunk made only of such lines is recognised by one
regular-expression pass. Processing a run is exactly processing its lines in order; anything
unusual makes these functions return ``None`` and the caller parses line by line, which reports the
precise error.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Sequence

import msgspec

__all__ = ["RdataRun", "json_array", "split_runs", "uniform_run"]


class RdataRun:
    """Consecutive RDATA lines of one stream and writer, as a TCP link read them in one chunk.

    ``tokens[i]`` is the i-th line's token (``None`` for ``batch``), ``texts[i]`` its row's JSON text
    (checked to be exactly one JSON value), ``array`` the texts as one JSON array (what that check
    parsed, kept for the decoding) and ``lines[i]`` the raw line (for relaying). Processing a
    run is exactly processing its lines one at a time, in order; it only saves the per-line machinery.
    """

    __slots__ = ("array", "instance_name", "lines", "stream_name", "texts", "tokens")

    def __init__(
        self,
        stream_name: str,
        instance_name: str,
        tokens: list[int | None],
        texts: Sequence[bytes],
        array: bytes,
        lines: list[bytes],
    ) -> None:
        self.stream_name = stream_name
        self.instance_name = instance_name
        self.tokens = tokens
        self.texts = texts
        self.array = array
        self.lines = lines


_decode_raws = msgspec.json.Decoder(list[msgspec.Raw]).decode

#: Compiled patterns matching the RDATA lines of one ``b"RDATA <stream> <instance> "`` prefix.
_RUN_PATTERNS: dict[bytes, re.Pattern[bytes]] = {}


def json_array(texts: Sequence[bytes], max_line: int | None) -> bytes | None:
    """The texts as one JSON array if every text is exactly one JSON value, in UTF-8 (and none
    longer than ``max_line``; ``None`` if the caller has checked the lengths); else ``None``.
    Checked for all texts at once.

    The texts are joined into one JSON array and its elements found without being built
    (``msgspec.Raw``). Valid JSON is not enough: ``[1``, ``2]`` and ``3,4`` join into three valid
    elements although no text is a value. So each element must span exactly its text: same count,
    same lengths, and since elements and texts are laid out alike, the same bytes. (Whitespace around
    a value makes it shorter than its text; such rows take the per-line path, which accepts them.)
    """
    if max_line is not None and max(map(len, texts), default=0) > max_line:
        return None
    blob = b"[" + b",".join(texts) + b"]"
    if not blob.isascii():
        try:
            blob.decode("utf-8")
        except UnicodeDecodeError:
            return None
    try:
        raws = _decode_raws(blob)
    except (msgspec.DecodeError, RecursionError):
        return None
    return blob if list(map(len, raws)) == list(map(len, texts)) else None


def uniform_run(lines: list[bytes], max_line: int) -> RdataRun | None:
    """The lines as one run, if they are all RDATA lines of one stream and writer; else ``None``.

    Also ``None`` for an over-long line, a carriage return, a token that is not a plain integer or
    ``batch``, or a row that is not valid JSON. ``lines`` carry no line ends.
    """
    if not lines or lines[0][:6] != b"RDATA ":
        return None
    head = lines[0].split(b" ", 3)
    if len(head) != 4:
        return None
    prefix = b" ".join(head[:3]) + b" "
    pattern = _RUN_PATTERNS.get(prefix)
    if pattern is None:
        if len(_RUN_PATTERNS) >= 1024:
            _RUN_PATTERNS.clear()
        pattern = _RUN_PATTERNS[prefix] = re.compile(b"\n" + re.escape(prefix) + rb"(batch|\d{1,18}) ")
    data = b"\n" + b"\n".join(lines)
    if b"\r" in data or max(map(len, lines)) > max_line:
        return None
    # Column-wise, in C: a run is hundreds of lines and this runs for every chunk a busy link reads.
    # Every line end before a line starts a match, so the split is ``[b"", token, row, token, row,
    # ...]`` exactly when every line is ``<prefix><token> <row>``: one match per line, none elsewhere
    # (a match starts at a line end, and the lines hold none).
    parts = pattern.split(data)
    stream, instance = utf8(head[1]), utf8(head[2])
    if len(parts) != 2 * len(lines) + 1 or stream is None or instance is None:
        return None
    words, texts = parts[1::2], parts[2::2]
    array = json_array(texts, None)  # the lines' lengths are checked above
    if array is None:
        return None
    tokens: list[int | None]
    if b"batch" in words:
        tokens = [None if token == b"batch" else int(token) for token in words]
    else:
        tokens = list(map(int, words))
    return RdataRun(stream, instance, tokens, texts, array, lines)


def split_runs(lines: list[bytes], max_line: int) -> Iterator[RdataRun | bytes]:
    """The lines in order: each stretch of RDATA lines of one stream and writer as one :class:`RdataRun`,
    every other line as itself.

    A stretch with anything unusual (a token that is not a plain integer or ``batch``, a row that is
    not valid JSON, an over-long line) yields its first line alone, for the per-line parse to report
    the precise error, and carries on after it. ``lines`` carry no line ends.
    """
    if len(lines) > 1 and lines[0][:6] == b"RDATA ":
        run = uniform_run(lines, max_line)
        if run is not None:
            yield run  # the usual chunk of a busy link, recognised in one pass
            return
    start = 0
    count = len(lines)
    while start < count:
        line = lines[start]
        head = line.split(b" ", 4) if line[:6] == b"RDATA " else ()
        if len(head) != 5:
            yield line
            start += 1
            continue
        stream, instance = head[1], head[2]
        tokens: list[int | None] = []
        texts: list[bytes] = []
        end = start
        while end < count:
            words = lines[end].split(b" ", 4)
            if len(words) != 5 or words[0] != b"RDATA" or words[1] != stream or words[2] != instance:
                break
            token = words[3]
            if len(token) < 19 and token.isdigit():
                tokens.append(int(token))
            elif token == b"batch":
                tokens.append(None)
            else:
                break
            texts.append(words[4].rstrip(b"\r"))
            end += 1
        array = json_array(texts, max_line) if end > start else None
        names = utf8(stream), utf8(instance)
        if array is None or names[0] is None or names[1] is None:
            yield line  # not a clean run: the per-line path parses (and, if need be, rejects) it
            start += 1
            continue
        yield RdataRun(names[0], names[1], tokens, texts, array, lines[start:end])
        start = end


def utf8(word: bytes) -> str | None:
    try:
        return word.decode("utf-8")
    except UnicodeDecodeError:
        return None
