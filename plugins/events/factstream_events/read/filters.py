"""The ``room`` part of a ``/sync`` filter, as the events plugin reads it (docs/plugins/events.md, Sync).

A malformed part is a 400 naming the field; unknown keys are ignored, as the reference ignores them.
Type patterns match as the reference's do: ``*`` matches any run of characters.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from factstream import HttpError
from factstream_events.read.timeline import MAX_TIMELINE

#: The timeline limit when the filter names none (the reference's default).
DEFAULT_LIMIT = 10


@dataclass(frozen=True, slots=True)
class TypeFilter:
    """``types`` / ``not_types`` of a filter part (``*`` matches any run of characters).

    ``allows(event_type)`` is true-ish when the filter lets the type through: the ``fullmatch`` of one
    regular expression compiled from both lists, so a timeline of thousands of events is filtered by the
    regular-expression engine, without a Python call per event.
    """

    types: tuple[str, ...] | None = None
    not_types: tuple[str, ...] = ()
    allows: Callable[[str], object] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "allows", _compiled(self.types, self.not_types).fullmatch)


@dataclass(frozen=True, slots=True)
class RoomFilter:
    """The ``room`` part of a ``/sync`` filter that this plugin reads (docs/plugins/events.md, Sync)."""

    limit: int = DEFAULT_LIMIT
    timeline: TypeFilter = field(default_factory=TypeFilter)
    state: TypeFilter = field(default_factory=TypeFilter)
    lazy_load_members: bool = False
    include_leave: bool = False

    @classmethod
    def parse(cls, body: Mapping[str, Any]) -> RoomFilter:
        """The filter's ``room`` part (400 naming the field when malformed; unknown keys are ignored,
        as the reference ignores them)."""
        room = _object(body.get("room"), "filter.room")
        timeline = _object(room.get("timeline"), "filter.room.timeline")
        state = _object(room.get("state"), "filter.room.state")
        limit = timeline.get("limit", DEFAULT_LIMIT)
        if isinstance(limit, bool) or not isinstance(limit, int) or not 1 <= limit <= MAX_TIMELINE:
            raise _bad(f"filter.room.timeline.limit: a whole number from 1 to {MAX_TIMELINE}, not {limit!r}")
        return cls(
            limit=limit,
            timeline=_types(timeline, "filter.room.timeline"),
            state=_types(state, "filter.room.state"),
            lazy_load_members=_flag(state, "lazy_load_members", "filter.room.state"),
            include_leave=_flag(room, "include_leave", "filter.room"),
        )


def _bad(message: str) -> HttpError:
    return HttpError(400, "M_INVALID_PARAM", message)


def _object(value: object, where: str) -> Mapping[str, Any]:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise _bad(f"{where}: must be an object, not {type(value).__name__}")
    return value


def _flag(part: Mapping[str, Any], key: str, where: str) -> bool:
    value = part.get(key, False)
    if not isinstance(value, bool):
        raise _bad(f"{where}.{key}: must be true or false, not {value!r}")
    return value


def _types(part: Mapping[str, Any], where: str) -> TypeFilter:
    out: dict[str, tuple[str, ...] | None] = {}
    for key in ("types", "not_types"):
        value = part.get(key)
        if value is None:
            out[key] = None
            continue
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value) or len(value) > 100:
            raise _bad(f"{where}.{key}: must be a list of at most 100 strings")
        out[key] = tuple(value)
    return TypeFilter(out["types"], out["not_types"] or ())


def _compiled(types: tuple[str, ...] | None, not_types: tuple[str, ...]) -> re.Pattern[str]:
    """One expression that fully matches the types ``types`` allows (all when None, none when empty) and
    ``not_types`` does not exclude; ``*`` in a pattern is any run of characters, the rest is literal."""
    excluded = f"(?!(?:{_either(not_types)})\\Z)" if not_types else ""
    if types is None:
        return re.compile(excluded + ".*", re.DOTALL)
    allowed = f"(?:{_either(types)})" if types else "(?!)"  # an empty list allows nothing
    return re.compile(excluded + allowed, re.DOTALL)


def _either(patterns: tuple[str, ...]) -> str:
    return "|".join(map(_pattern, patterns))


def _pattern(pattern: str) -> str:
    """A type pattern as an expression in linear time: the first part at the start, each middle part at
    its first occurrence after the one before (an atomic group: never tried again further on, which
    cannot make a match that failed succeed), the last part at the end. Plain ``.*`` between the parts
    would let a pattern of many ``*`` backtrack for a time exponential in their number."""
    parts = pattern.split("*")
    if len(parts) == 1:
        return re.escape(pattern)
    first, *middle, last = parts
    return re.escape(first) + "".join(f"(?>.*?{re.escape(part)})" for part in middle) + ".*" + re.escape(last)
