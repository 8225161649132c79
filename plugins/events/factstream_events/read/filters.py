"""The ``room`` part of a ``/sync`` filter, as the events plugin reads it (docs/plugins/events.md, Sync).

A malformed part is a 400 naming the field; unknown keys are ignored, as the reference ignores them.
Type patterns match as the reference's do: ``*`` matches any run of characters.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from factstream import HttpError
from factstream_events.read.timeline import MAX_TIMELINE

#: The timeline limit when the filter names none (the reference's default).
DEFAULT_LIMIT = 10


@dataclass(frozen=True, slots=True)
class TypeFilter:
    """``types`` / ``not_types`` of a filter part (``*`` matches any run of characters)."""

    types: tuple[str, ...] | None = None
    not_types: tuple[str, ...] = ()

    def allows(self, event_type: str) -> bool:
        if self.types is None and not self.not_types:
            return True
        if any(_matches(p, event_type) for p in self.not_types):
            return False
        return self.types is None or any(_matches(p, event_type) for p in self.types)


@dataclass(frozen=True, slots=True)
class RoomFilter:
    """The ``room`` part of a ``/sync`` filter that this plugin reads (docs/plugins/events.md, Sync)."""

    limit: int = DEFAULT_LIMIT
    timeline: TypeFilter = TypeFilter()
    state: TypeFilter = TypeFilter()
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


def _matches(pattern: str, value: str) -> bool:
    if "*" not in pattern:
        return pattern == value
    parts = pattern.split("*")
    if not value.startswith(parts[0]) or not value.endswith(parts[-1]):
        return False
    at, end = len(parts[0]), len(value) - len(parts[-1])
    for part in parts[1:-1]:
        found = value.find(part, at, end)
        if found < 0:
            return False
        at = found + len(part)
    return at <= end
