"""Matrix canonical JSON, and strict parsing of event JSON as it arrives.

Everything that is hashed or signed in Matrix (content hashes, reference hashes and therefore event IDs,
signatures) is computed over *canonical JSON*: object keys sorted by Unicode code point, no insignificant
whitespace, UTF-8 output with only the escapes JSON requires, and integers only, within the range a
double represents exactly. :func:`canonical_json` produces those bytes, or says which value prevents it.

:func:`parse_event_json` is the other end: it reads one event as received and refuses what a lenient
parser would silently accept or mangle (duplicate keys, ``NaN``, NUL characters, broken UTF-8), naming the
field at fault. It does not enforce canonical JSON's number rules: events in old room versions may carry
floats or large integers and must still be stored as received.

Pure functions. The common case takes a quick path: a type-only pass over the value, then msgspec's
encoder (the same bytes as ``json.dumps`` with sorted keys and no ASCII escaping, for every code point),
and parsing skips the walk over every string when the text holds nothing it could refuse; anything
unusual takes the full checks, which name the path at fault.
"""

from __future__ import annotations

import json
import math
import re
from typing import Any

import msgspec

__all__ = [
    "MAX_CANONICAL_INT",
    "MIN_CANONICAL_INT",
    "CanonicalJsonError",
    "EventJsonError",
    "canonical_json",
    "parse_event_json",
]

MAX_CANONICAL_INT = 2**53 - 1
"""The largest integer canonical JSON allows."""

MIN_CANONICAL_INT = -(2**53) + 1
"""The smallest integer canonical JSON allows."""


class CanonicalJsonError(ValueError):
    """A value cannot be written as Matrix canonical JSON; the message names the JSON path at fault."""


class EventJsonError(ValueError):
    """Received event JSON was refused; the message says what was wrong and where."""


# ---------------------------------------------------------------------------------------------------------
# JSON paths in messages


def _child_path(parent: str, key: str) -> str:
    """The path of object member ``key`` under ``parent`` ("" is the top level): ``content.body``."""
    return f"{parent}.{key}" if parent else key


def _item_path(parent: str, index: int) -> str:
    """The path of array element ``index`` under ``parent``: ``prev_events[0]``."""
    return f"{parent}[{index}]"


def _where(path: str) -> str:
    """A path as shown to people: the top level has no path of its own."""
    return path if path else "the top-level value"


def _unpaired_surrogate(text: str) -> str | None:
    """The first lone UTF-16 surrogate in ``text`` as ``U+D800``, or None when the text is valid Unicode."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        return f"U+{ord(text[exc.start]):04X}"
    return None


# ---------------------------------------------------------------------------------------------------------
# Canonical JSON


def canonical_json(value: object) -> bytes:
    """Encode ``value`` as Matrix canonical JSON (UTF-8 bytes).

    Objects must be ``dict`` with ``str`` keys; arrays may be ``list`` or ``tuple``; scalars are ``str``,
    ``int`` in [-(2**53)+1, 2**53-1], ``bool`` and ``None``. Anything else (floats, NaN and infinities,
    integers out of range, other types, non-string keys, strings that are not valid Unicode) raises
    :class:`CanonicalJsonError` naming the path of the offending value, e.g. ``content.n``.
    """
    if _plainly_canonical(value):
        try:  # the one check left, unpaired surrogates, is the encoder's own
            return _fast_encode(value)
        except (UnicodeEncodeError, RecursionError):
            pass  # the walk below names the path
    try:
        _check_canonical(value, "")
    except RecursionError:
        raise CanonicalJsonError("the value is nested too deeply to encode") from None
    return _dumps(value).encode("utf-8")


#: The same bytes as :func:`_dumps` for values :func:`_plainly_canonical` accepts (every code point is
#: escaped alike, keys sort by code point), ten times faster.
_fast_encode = msgspec.json.Encoder(order="sorted").encode


def _dumps(value: object) -> str:
    return json.dumps(value, ensure_ascii=False, allow_nan=False, sort_keys=True, separators=(",", ":"))


def _plainly_canonical(value: object) -> bool:
    """Whether ``value`` holds only what canonical JSON allows, strings not looked into (a quick pass
    without paths: :func:`_check_canonical` finds and names what is wrong when this says no)."""
    stack: list[Any] = [value]
    pop, push, extend = stack.pop, stack.append, stack.extend
    while stack:
        item = pop()
        kind = type(item)
        if kind is dict:
            for key, child in item.items():
                if type(key) is not str:
                    return False
                child_kind = type(child)
                if child_kind is str or child is None or child_kind is bool:
                    continue
                if child_kind is int:
                    if not MIN_CANONICAL_INT <= child <= MAX_CANONICAL_INT:
                        return False
                    continue
                push(child)
        elif kind is list or kind is tuple:
            extend(item)
        elif kind is int:
            if not MIN_CANONICAL_INT <= item <= MAX_CANONICAL_INT:
                return False
        elif not (kind is str or item is None or kind is bool):
            return False
    return True


def _check_canonical(value: object, path: str) -> None:
    """Raise :class:`CanonicalJsonError` for the first value under ``path`` canonical JSON cannot hold."""
    if value is None or isinstance(value, bool):
        return
    if isinstance(value, int):
        _check_canonical_int(value, path)
    elif isinstance(value, float):
        _refuse_float(value, path)
    elif isinstance(value, str):
        _check_canonical_text(value, path)
    elif isinstance(value, dict):
        _check_canonical_object(value, path)
    elif isinstance(value, list | tuple):
        for index, item in enumerate(value):
            _check_canonical(item, _item_path(path, index))
    else:
        raise CanonicalJsonError(f"{_where(path)}: a {type(value).__name__} has no JSON form")


def _refuse_float(value: float, path: str) -> None:
    if math.isfinite(value):
        raise CanonicalJsonError(f"{_where(path)}: {value!r} is a float; canonical JSON allows only integers")
    raise CanonicalJsonError(f"{_where(path)}: {value!r} is not a JSON number (NaN and infinities have no JSON form)")


def _check_canonical_int(value: int, path: str) -> None:
    if not MIN_CANONICAL_INT <= value <= MAX_CANONICAL_INT:
        raise CanonicalJsonError(
            f"{_where(path)}: the integer {value} is outside the range canonical JSON allows (-(2**53)+1 to 2**53-1)"
        )


def _check_canonical_text(value: str, path: str) -> None:
    surrogate = _unpaired_surrogate(value)
    if surrogate is not None:
        raise CanonicalJsonError(f"{_where(path)}: the string holds an unpaired surrogate {surrogate}, not Unicode")


def _check_canonical_object(value: dict[Any, Any], path: str) -> None:
    for key, item in value.items():
        if not isinstance(key, str):
            raise CanonicalJsonError(f"{_where(path)}: the key {key!r} is not a string ({type(key).__name__})")
        if _unpaired_surrogate(key) is not None:
            raise CanonicalJsonError(f"{_where(path)}: the key {key!r} holds an unpaired surrogate, not Unicode")
        _check_canonical(item, _child_path(path, key))


# ---------------------------------------------------------------------------------------------------------
# Strict parsing of received event JSON


class _DuplicateKeyObject(dict[str, Any]):
    """A parsed JSON object in which ``duplicate`` appeared more than once (reported after parsing)."""

    duplicate: str


class _NonFiniteConstant:
    """Stands in for ``NaN``, ``Infinity`` or ``-Infinity`` until the value's path is known."""

    def __init__(self, name: str) -> None:
        self.name = name


#: An escaped NUL or UTF-16 surrogate (``\\u0000``, ``\\ud800``-``\\udfff``): text the walk must look at.
_SUSPECT_ESCAPE = re.compile(r"\\u(?:0000|[dD][89a-fA-F])")


#: Counts the duplicate keys and non-finite constants the parsers met (in any thread): a parse that sees
#: it move may have met one and walks its value. It only grows, so a parse that met one always sees it move.
_odd = [0]


def _build_object(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """``object_pairs_hook``: a plain dict, or one marked with its first repeated key (counted in ``_odd``)."""
    value = dict(pairs)
    if len(value) == len(pairs):
        return value
    _odd[0] += 1
    seen: set[str] = set()
    for key, _ in pairs:
        if key in seen:
            marked = _DuplicateKeyObject(pairs)
            marked.duplicate = key
            return marked
        seen.add(key)
    raise AssertionError("unreachable: a shorter dict has a repeated key")


def _constant(name: str) -> _NonFiniteConstant:
    """``parse_constant``: ``NaN`` and the infinities, refused by the walk with their path."""
    _odd[0] += 1
    return _NonFiniteConstant(name)


_STRICT = json.JSONDecoder(object_pairs_hook=_build_object, parse_constant=_constant, strict=True)
#: Lets a raw NUL (a control character) through, so that the walk can name the string it is in.
_LENIENT = json.JSONDecoder(object_pairs_hook=_build_object, parse_constant=_constant, strict=False)


def parse_event_json(data: bytes | str) -> dict[str, Any]:
    """Parse one event received as JSON, strictly.

    ``data`` is UTF-8 bytes or an already decoded ``str``. Refused, with :class:`EventJsonError` saying
    what and where: bytes that are not UTF-8, text that is not JSON, the ``NaN``/``Infinity`` constants,
    a key repeated in any object (``duplicate key 'type' in content``), a NUL character in any string or
    key (escaped as ``\\u0000`` or raw), an unpaired UTF-16 surrogate, and a top-level value that is not an
    object. Floats and integers of any size are accepted: only :func:`canonical_json` refuses them.
    """
    text = _decode(data)
    odd = _odd[0]
    value = _load(text)
    if not isinstance(value, dict):
        raise EventJsonError(f"an event must be a JSON object, not {_json_kind(value)}")
    if odd != _odd[0] or isinstance(data, str) or ("\\u" in text and _SUSPECT_ESCAPE.search(text)):
        # A duplicate key, NaN or Infinity, an escaped NUL or surrogate, or text that was never UTF-8:
        # the walk finds it and names its path. Decoded UTF-8 holds no raw surrogate, and a raw NUL
        # fails the strict parse.
        try:
            _check_parsed(value, "")
        except RecursionError:
            raise EventJsonError("not valid JSON: nested too deeply") from None
    return value


def _decode(data: bytes | str) -> str:
    if isinstance(data, str):
        return data
    if not isinstance(data, bytes | bytearray):
        raise TypeError(f"event JSON must be bytes or str, not {type(data).__name__}")
    try:
        return bytes(data).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise EventJsonError(f"not valid UTF-8: {exc.reason} at byte offset {exc.start}") from None


def _load(text: str) -> Any:
    try:
        return _STRICT.decode(text)
    except json.JSONDecodeError as exc:
        if "\x00" in text:
            return _load_with_raw_nul(text, exc)
        raise EventJsonError(f"not valid JSON: {exc}") from None
    except RecursionError:
        raise EventJsonError("not valid JSON: nested too deeply") from None
    except ValueError as exc:  # e.g. an integer with more digits than Python converts
        raise EventJsonError(f"not valid JSON: {exc}") from None


def _load_with_raw_nul(text: str, strict_error: json.JSONDecodeError) -> Any:
    """Parse text holding a raw NUL leniently, so that the walk after parsing can name the field it is in.

    Only used to locate the NUL: :func:`_check_parsed` refuses the result whatever else it holds.
    """
    _odd[0] += 1
    try:
        return _LENIENT.decode(text)
    except (ValueError, RecursionError):
        position = text.index("\x00")
        raise EventJsonError(f"not valid JSON: {strict_error} (a NUL byte is at character {position})") from None


def _check_parsed(value: Any, path: str) -> None:
    """Refuse what strict Matrix event JSON does not allow anywhere under ``path``."""
    if isinstance(value, dict):
        _check_parsed_object(value, path)
    elif isinstance(value, list):
        for index, item in enumerate(value):
            _check_parsed(item, _item_path(path, index))
    elif isinstance(value, str):
        _check_parsed_text(value, _where(path))
    elif isinstance(value, _NonFiniteConstant):
        raise EventJsonError(f"{_where(path)}: {value.name} is not a JSON number and is not allowed in events")


def _check_parsed_object(value: dict[str, Any], path: str) -> None:
    if isinstance(value, _DuplicateKeyObject):
        place = f"in {path}" if path else "at the top level"
        raise EventJsonError(f"duplicate key {value.duplicate!r} {place}")
    for key, item in value.items():
        child = _child_path(path, key)
        _check_parsed_text(key, f"the key {child!r}")
        _check_parsed(item, child)


def _check_parsed_text(text: str, what: str) -> None:
    if "\x00" in text:
        raise EventJsonError(f"{what} contains a NUL character (U+0000), which events may not carry")
    surrogate = _unpaired_surrogate(text)
    if surrogate is not None:
        raise EventJsonError(f"{what} contains an unpaired surrogate {surrogate}, which is not valid Unicode")


_TOP_LEVEL_KINDS: dict[type, str] = {list: "an array", str: "a string", bool: "a boolean", type(None): "null"}


def _json_kind(value: Any) -> str:
    """How a parsed top-level value is described in messages: ``an array``, ``a string``..."""
    if isinstance(value, _NonFiniteConstant):
        return value.name
    return _TOP_LEVEL_KINDS.get(type(value), "a number")
