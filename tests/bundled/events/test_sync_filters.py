"""The ``room`` part of a ``/sync`` filter (``factstream_events.read.filters``): which event types a
``types`` / ``not_types`` pair lets through, over every shape of pattern, and malformed parts refused
with the field named."""

from __future__ import annotations

import pytest
from factstream_events.read.filters import RoomFilter, TypeFilter
from hypothesis import given, settings
from hypothesis import strategies as st

from factstream import HttpError

# Few letters, so that patterns and types overlap often; "." and a newline, which a regular expression
# would give a meaning of its own; "*" in types too (a literal there).
_ALPHABET = "ab.\n*"
_patterns = st.text(alphabet=_ALPHABET, max_size=7)
_lists = st.lists(_patterns, max_size=3).map(tuple)


def glob(pattern: str, value: str) -> bool:
    """The rule the filter follows, stated plainly: ``*`` is any run of characters (the empty one too),
    everything else must match itself; tried at every split, so that it is obviously right if slow."""
    if "*" not in pattern:
        return pattern == value
    head, rest = pattern.split("*", 1)
    if not value.startswith(head):
        return False
    tail = value[len(head) :]
    return any(glob(rest, tail[i:]) for i in range(len(tail) + 1))


def expected(types: tuple[str, ...] | None, not_types: tuple[str, ...], event_type: str) -> bool:
    if any(glob(p, event_type) for p in not_types):
        return False
    return types is None or any(glob(p, event_type) for p in types)


@settings(max_examples=3000, deadline=None)
@given(st.one_of(st.none(), _lists), _lists, st.text(alphabet=_ALPHABET, max_size=9))
def test_a_type_filter_allows_exactly_what_its_patterns_say(
    types: tuple[str, ...] | None, not_types: tuple[str, ...], event_type: str
) -> None:
    assert bool(TypeFilter(types, not_types).allows(event_type)) == expected(types, not_types, event_type)


@pytest.mark.parametrize(
    ("types", "not_types", "allowed", "refused"),
    [
        (None, (), ["m.room.message", ""], []),
        ((), (), [], ["m.room.message", ""]),
        (("m.room.*",), (), ["m.room.message", "m.room."], ["m.roomx", "org.m.room.message"]),
        (("*",), ("m.room.member",), ["m.room.message"], ["m.room.member"]),
        (("m.*.message",), ("*.x.*",), ["m.room.message", "m..message"], ["m.x.message", "m.message"]),
        (("a.b",), (), ["a.b"], ["aXb", "a.bc"]),
    ],
)
def test_type_filter_examples(
    types: tuple[str, ...] | None, not_types: tuple[str, ...], allowed: list[str], refused: list[str]
) -> None:
    type_filter = TypeFilter(types, not_types)
    assert [t for t in allowed if not type_filter.allows(t)] == []
    assert [t for t in refused if type_filter.allows(t)] == []


def test_a_pattern_of_many_stars_is_matched_at_once_not_by_trying_every_split() -> None:
    """A hostile client's pattern (30 stars, 100 times) against a long type: the filter answers (no
    match) without trying each way of splitting the type among the stars, which would never end."""
    hostile = TypeFilter(tuple(["*a" * 30 + "b"] * 100), ())
    assert not hostile.allows("a" * 255)
    assert hostile.allows("a" * 30 + "b")


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"room": []}, "filter.room"),
        ({"room": {"timeline": {"limit": 0}}}, "filter.room.timeline.limit"),
        ({"room": {"timeline": {"limit": True}}}, "filter.room.timeline.limit"),
        ({"room": {"timeline": {"types": "m.room.message"}}}, "filter.room.timeline.types"),
        ({"room": {"state": {"not_types": [1]}}}, "filter.room.state.not_types"),
        ({"room": {"state": {"lazy_load_members": "yes"}}}, "filter.room.state.lazy_load_members"),
        ({"room": {"include_leave": 1}}, "filter.room.include_leave"),
    ],
)
def test_a_malformed_filter_is_a_400_naming_the_field(body: dict[str, object], field: str) -> None:
    with pytest.raises(HttpError) as refused:
        RoomFilter.parse(body)
    assert refused.value.status == 400
    assert field in str(refused.value)
