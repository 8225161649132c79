"""JSON exactly as Synapse writes and reads it: the bodies of replication commands.

Bodies are written exactly as Synapse's ``json_encoder`` writes them: compact separators
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

The msgspec encoders and decoder are exported for the codec's hot paths (RDATA rows), which call them
directly and fall back to :func:`encode_json` / :func:`decode_json` themselves.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from itertools import chain
from typing import Any, Final

import msgspec

__all__ = ["decode_json", "encode_json", "msgspec_decode", "msgspec_encode", "msgspec_encode_lines", "plain_rows"]


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
msgspec_encode: Final = msgspec.json.Encoder().encode
msgspec_decode: Final = msgspec.json.Decoder().decode
msgspec_encode_lines: Final = msgspec.json.Encoder().encode_lines


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


def plain_rows(rows: list[Any]) -> bool:
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
            data = msgspec_encode(value)
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
        return msgspec_decode(text)
    except (msgspec.DecodeError, RecursionError) as error:  # msgspec refuses nesting beyond ~1000 levels
        reason = str(error)
    try:
        return _json_decoder.decode(text)
    except (ValueError, RecursionError):
        raise ValueError(reason) from None
