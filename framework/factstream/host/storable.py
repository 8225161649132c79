"""What PostgreSQL can store, checked at the edge of the HTTP API before anything reaches it.

A PostgreSQL ``text`` value cannot hold NUL; a Python ``str`` holding a lone UTF-16 surrogate
(``"\\ud800"``) cannot be encoded for the database; a ``bigint`` holds [-2**63, 2**63 - 1]. Each
would otherwise surface as a ``psycopg`` error, a 500, in the middle of whatever an endpoint was doing
(possibly after it wrote something). The route wrapper in :mod:`factstream.host.http` calls these
checks for every route, core and plugin, before the bearer token is looked up (headers, path, query)
and before the endpoint runs (the body). Each failure is an :class:`InputError` whose message names
the field: ``path parameter 'device_id' contains a NUL character``.

What is checked:

* header names and values: NUL (the bearer token is looked up in ``access_tokens``; latin-1 header
  text holds no surrogates);
* path parameters: text, and integers from an ``:int`` converter;
* query parameter names and values: text. A query value is text until a route reads a number from
  it, so the route checks that number's range itself (``/sync`` caps ``timeout``);
* a JSON body's keys and values at any depth: text and integers.

The body costs no parse on the hot path: endpoints parse their bodies themselves, with whatever decoder
they like, so :func:`check_body` scans the raw bytes for everything a JSON decoder could turn into an
unstorable value: a raw NUL byte, a ``\\u0000`` escape, a ``\\uD800``-``\\uDFFF`` escape, the
UTF-8-style bytes of a surrogate (``ED A0``-``ED BF``, which ``json.loads`` accepts from bytes with
``surrogatepass``), and a run of 19 digits (every integer of 18 digits or fewer is a ``bigint``). The
scan costs about a third of a ``json.loads`` of the same body (70 us for 64 KiB). Only a body with such
a match is parsed, with ``json.loads`` (the most lenient common decoder, and what Starlette's
``request.json()`` uses), and walked to name the field; a match that turns out harmless (a valid
surrogate pair, a long digit run inside a string) passes. A body that is not JSON at all is left to
the endpoint, which refuses it as it always did.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

from starlette.requests import Request

from factstream.plugin.web import HttpError, read_limited

#: The largest request body the host reads for any route (413 beyond); a plugin may set a lower limit.
MAX_BODY_BYTES = 1024 * 1024
#: The range of a PostgreSQL ``bigint``.
BIGINT_MIN, BIGINT_MAX = -(2**63), 2**63 - 1


class InputError(HttpError):
    """Input the host refuses before the endpoint runs: ``status`` (400 or 413), a Matrix-style
    ``errcode`` and a ``message`` naming the field, answered like any :class:`~factstream.HttpError`."""


_UNSTORABLE_CHAR = re.compile(r"[\x00\ud800-\udfff]")
# Everything in raw bytes that a JSON decoder could turn into an unstorable value (see the module
# docstring); a false positive only costs a parse.
_SUSPECT_ESCAPE = re.compile(rb"\\u(?:0000|[dD][89a-fA-F])")
_SURROGATE_BYTES = re.compile(rb"\xed[\xa0-\xbf]")
# Digits to "0", everything else to " ": a long number is then a plain substring search (a regular
# expression for 19 digits in a row costs ten times as much).
_DIGITS_ONLY = bytes(0x30 if 0x30 <= i <= 0x39 else 0x20 for i in range(256))
_DIGIT_RUN = b"0" * 19
_NAME_LIMIT = 80


def _shown(text: str) -> str:
    """``text`` fit for a message: NUL, surrogates and other control characters escaped, shortened."""
    if len(text) > _NAME_LIMIT:
        text = text[:_NAME_LIMIT] + "..."
    return "".join(c if c.isprintable() and not 0xD800 <= ord(c) <= 0xDFFF else ascii(c)[1:-1] for c in text)


def _text_problem(text: str) -> str | None:
    """Why PostgreSQL cannot store ``text``, or ``None`` if it can."""
    found = _UNSTORABLE_CHAR.search(text)
    if found is None:
        return None
    char = found.group()
    if char == "\x00":
        return "contains a NUL character"
    return f"contains a lone UTF-16 surrogate ({ascii(char)[1:-1]}), which is not valid Unicode text"


def _int_problem(value: int) -> str | None:
    if BIGINT_MIN <= value <= BIGINT_MAX:
        return None
    return f"is an integer outside the range PostgreSQL stores ({BIGINT_MIN} to {BIGINT_MAX})"


def check_headers(raw_headers: Sequence[tuple[bytes, bytes]]) -> None:
    """No header name or value holds NUL (the bearer token goes to a database lookup)."""
    for name, value in raw_headers:
        if b"\x00" in name or b"\x00" in value:
            shown = _shown(name.decode("latin-1"))
            raise InputError(400, "M_INVALID_PARAM", f"header '{shown}' contains a NUL character")


def check_path_params(params: Mapping[str, Any]) -> None:
    """Every path parameter is storable text (or a ``bigint``, from an ``:int`` converter)."""
    for name, value in params.items():
        problem = _text_problem(value) if isinstance(value, str) else None
        if isinstance(value, int) and not isinstance(value, bool):
            problem = _int_problem(value)
        if problem:
            raise InputError(400, "M_INVALID_PARAM", f"path parameter '{_shown(name)}' {problem}")


def check_query_params(items: Sequence[tuple[str, str]]) -> None:
    """Every query parameter's name and value is storable text."""
    for name, value in items:
        problem = _text_problem(name)
        if problem:
            raise InputError(400, "M_INVALID_PARAM", f"query parameter name '{_shown(name)}' {problem}")
        problem = _text_problem(value)
        if problem:
            raise InputError(400, "M_INVALID_PARAM", f"query parameter '{_shown(name)}' {problem}")


def _field(path: str, key: object) -> str:
    if isinstance(key, int):
        return f"{path}[{key}]"
    return f"{path}.{key}" if path else str(key)


class _OutOfRange:
    """What :func:`check_body`'s parse makes of an integer too long to be a ``bigint``."""


_OUT_OF_RANGE = _OutOfRange()


def _parse_int(text: str) -> int | _OutOfRange:
    # Never int() a long digit string: Python refuses more than 4,300 digits, and it is slow anyway.
    return _OUT_OF_RANGE if len(text) > len(str(BIGINT_MIN)) else int(text)


def check_json_value(value: Any) -> None:
    """Every key and value of a parsed JSON document, at any depth, is storable.

    Iterative, so a deeply nested document costs no recursion.
    """
    stack: list[tuple[str, Any]] = [("", value)]
    while stack:
        path, item = stack.pop()
        problem: str | None = None
        if isinstance(item, str):
            problem = _text_problem(item)
        elif isinstance(item, bool):
            pass
        elif isinstance(item, int):
            problem = _int_problem(item)
        elif item is _OUT_OF_RANGE:
            problem = _int_problem(BIGINT_MAX + 1)
        elif isinstance(item, dict):
            for key, child in item.items():
                key_problem = _text_problem(key)
                if key_problem:
                    raise InputError(400, "M_BAD_JSON", f"body field name '{_shown(_field(path, key))}' {key_problem}")
                stack.append((_field(path, key), child))
        elif isinstance(item, list):
            stack.extend((_field(path, i), child) for i, child in enumerate(item))
        if problem:
            where = f"body field '{_shown(path)}'" if path else "the request body"
            raise InputError(400, "M_BAD_JSON", f"{where} {problem}")


def check_body(body: bytes) -> None:
    """A JSON ``body`` holds nothing unstorable (a body that is not JSON is the endpoint's business)."""
    suspect = (
        b"\x00" in body
        or _SUSPECT_ESCAPE.search(body) is not None
        or (b"\xed" in body and _SURROGATE_BYTES.search(body) is not None)
        or _DIGIT_RUN in body.translate(_DIGITS_ONLY)
    )
    if not suspect:
        return
    try:
        # Bytes, as Starlette's request.json() passes them: UTF-8 with surrogatepass, or UTF-16/32.
        value = json.loads(body, parse_int=_parse_int)
    except (ValueError, RecursionError):
        return
    check_json_value(value)


async def read_body(request: Request, limit: int = MAX_BODY_BYTES) -> bytes:
    """The request body, or a 413 (``M_TOO_LARGE``) as soon as it is known to exceed ``limit``."""
    try:
        return await read_limited(request, limit, "the host's limit")
    except HttpError as exc:
        raise InputError(exc.status, exc.errcode, exc.message) from None
