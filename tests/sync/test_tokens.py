"""Multi-writer tokens: the reference vectors, the invariant, the helpers and round trips."""

from __future__ import annotations

import contextlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from factstream.sync import MemoryInstanceIds, MultiWriterStreamToken, RoomStreamToken, TokenError
from factstream.sync.tokens import MAX_POSITION

NAMES = st.sampled_from(["main", "w1", "w2", "w3", "persister-4", "émoji-✓"])
POSITIONS = st.integers(min_value=-MAX_POSITION, max_value=MAX_POSITION)


@st.composite
def clocks(draw: st.DrawFn) -> tuple[int, dict[str, int]]:
    stream = draw(st.integers(min_value=-MAX_POSITION, max_value=MAX_POSITION - 1))
    ahead = st.integers(min_value=stream + 1, max_value=MAX_POSITION)
    return stream, draw(st.dictionaries(NAMES, ahead, max_size=4))


@st.composite
def room_tokens(draw: st.DrawFn) -> RoomStreamToken:
    if draw(st.booleans()):
        return RoomStreamToken(topological=draw(st.integers(0, MAX_POSITION)), stream=draw(POSITIONS))
    stream, positions = draw(clocks())
    return RoomStreamToken(stream=stream, instance_map=positions)


def ids() -> MemoryInstanceIds:
    return MemoryInstanceIds({"foo": 1})


# -- reference vectors -------------------------------------------------------------------------------


def test_a_token_with_no_writer_ahead_is_written_short():
    assert RoomStreamToken(stream=5).serialize(ids().id_for) == "s5"
    assert MultiWriterStreamToken(stream=5).serialize(ids().id_for) == "5"


def test_a_writer_ahead_is_written_with_its_instance_id():
    token = MultiWriterStreamToken(stream=5, instance_map={"foo": 6})
    assert token.serialize(ids().id_for) == "m5~1.6"
    assert RoomStreamToken(stream=5, instance_map={"foo": 6}).serialize(ids().id_for) == "m5~1.6"


@pytest.mark.parametrize("pos", [5, 4, -1])
def test_a_position_not_above_the_minimum_is_rejected(pos):
    with pytest.raises(ValueError, match="strictly greater"):
        MultiWriterStreamToken(stream=5, instance_map={"foo": pos})
    with pytest.raises(ValueError, match="strictly greater"):
        RoomStreamToken(stream=5, instance_map={"foo": pos})


def test_the_historic_trailing_tilde_form_parses_as_the_minimum():
    assert MultiWriterStreamToken.deserialize("m5~", ids().name_for) == MultiWriterStreamToken(stream=5)
    assert RoomStreamToken.deserialize("m5~", ids().name_for) == RoomStreamToken(stream=5)


def test_the_three_room_forms_parse():
    name_for = MemoryInstanceIds({"a": 2, "b": 3}).name_for
    assert RoomStreamToken.deserialize("s2633508", name_for) == RoomStreamToken(stream=2633508)
    assert RoomStreamToken.deserialize("t426-2633508", name_for) == RoomStreamToken(topological=426, stream=2633508)
    assert RoomStreamToken.deserialize("m56~2.58~3.59", name_for) == RoomStreamToken(
        stream=56, instance_map={"a": 58, "b": 59}
    )


def test_entries_at_or_below_the_minimum_are_dropped_when_parsing():
    name_for = MemoryInstanceIds({"a": 1, "b": 2}).name_for
    assert MultiWriterStreamToken.deserialize("m5~1.5~2.3", name_for) == MultiWriterStreamToken(stream=5)


def test_a_room_token_cannot_be_both_topological_and_a_vector_clock():
    with pytest.raises(ValueError, match="both"):
        RoomStreamToken(topological=3, stream=5, instance_map={"foo": 6})


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("s-", "expected an integer"),
        ("s", "expected an integer"),
        ("t3-", "stream position"),
        ("t3", "expected 't<topological>-<stream>'"),
        ("t-5", "topological position"),
        ("m5~x.1", "instance id"),
        ("m5~1.x", "position of instance 1"),
        ("m5~1", "'<instance id>.<position>'"),
        ("m5~~1.6", "'<instance id>.<position>'"),
        ("m5~9.6", "unknown instance id 9"),
        ("m5~1.6~1.7", "appears twice"),
        ("mx", "minimum position"),
        ("m", "minimum position"),
        ("5", "expected 's<stream>'"),
        ("", "expected 's<stream>'"),
        ("s1_000", "expected an integer"),
        ("s 7", "expected an integer"),
        ("s٣", "expected an integer"),
        ("s99999999999999999999", "at most 19 digits"),
        ("s9999999999999999999", "out of range"),
    ],
)
def test_malformed_room_tokens_raise_token_error_saying_what_is_wrong(text, message):
    with pytest.raises(TokenError, match=message) as info:
        RoomStreamToken.deserialize(text, ids().name_for, what="field 1 (room)")
    assert str(info.value).startswith("field 1 (room)")


@pytest.mark.parametrize("text", ["s5", "t1-2", "", "5x", "m5~1", "-", "m" + "~1.9" * 65])
def test_malformed_multi_writer_tokens_raise_token_error(text):
    with pytest.raises(TokenError):
        MultiWriterStreamToken.deserialize(text, ids().name_for)


# -- helpers ---------------------------------------------------------------------------------------------


class FakeGenerator:
    def __init__(self, current: int, positions: dict[str, int]) -> None:
        self.current, self.positions = current, positions

    def get_current_token(self) -> int:
        return self.current

    def get_positions(self) -> dict[str, int]:
        return dict(self.positions)


def test_from_generator_lists_only_writers_ahead_of_the_watermark():
    gen = FakeGenerator(5, {"a": 5, "b": 7, "c": 3})
    assert MultiWriterStreamToken.from_generator(gen) == MultiWriterStreamToken(stream=5, instance_map={"b": 7})
    assert RoomStreamToken.from_generator(gen) == RoomStreamToken(stream=5, instance_map={"b": 7})


def test_copy_and_advance_takes_the_per_writer_maximum_and_drops_entries_at_the_new_minimum():
    a = MultiWriterStreamToken(stream=5, instance_map={"x": 9, "y": 6})
    b = MultiWriterStreamToken(stream=6, instance_map={"y": 8, "z": 7})
    assert a.copy_and_advance(b) == MultiWriterStreamToken(stream=6, instance_map={"x": 9, "y": 8, "z": 7})
    assert b.copy_and_advance(MultiWriterStreamToken(stream=8)) == MultiWriterStreamToken(stream=8)


def test_topological_room_tokens_cannot_be_advanced():
    with pytest.raises(ValueError, match="topological"):
        RoomStreamToken(topological=1, stream=2).copy_and_advance(RoomStreamToken(stream=3))


def test_position_accessors():
    token = MultiWriterStreamToken(stream=5, instance_map={"x": 9, "y": 6})
    assert token.get_max_stream_pos() == 9
    assert token.get_stream_pos_for_instance("y") == 6
    assert token.get_stream_pos_for_instance("other") == 5
    assert MultiWriterStreamToken(stream=5).get_max_stream_pos() == 5


def test_bound_stream_token_clamps_every_position():
    token = MultiWriterStreamToken(stream=5, instance_map={"x": 9, "y": 6})
    assert token.bound_stream_token(7) == MultiWriterStreamToken(stream=5, instance_map={"x": 7, "y": 6})
    assert token.bound_stream_token(4) == MultiWriterStreamToken(stream=4)
    assert RoomStreamToken(topological=2, stream=9).bound_stream_token(4) == RoomStreamToken(topological=2, stream=4)


def test_is_before_or_eq_compares_per_writer():
    ahead_on_one = MultiWriterStreamToken(stream=5, instance_map={"x": 9})
    assert not ahead_on_one.is_before_or_eq(MultiWriterStreamToken(stream=6))
    assert ahead_on_one.is_before_or_eq(MultiWriterStreamToken(stream=6, instance_map={"x": 9}))
    assert MultiWriterStreamToken(stream=5).is_before_or_eq(ahead_on_one)
    assert RoomStreamToken(topological=3, stream=9).is_before_or_eq(RoomStreamToken(topological=4, stream=1))


def test_is_stream_position_in_range_is_exclusive_below_and_inclusive_above():
    low = MultiWriterStreamToken(stream=5, instance_map={"x": 7})
    high = MultiWriterStreamToken(stream=8)
    in_range = MultiWriterStreamToken.is_stream_position_in_range
    assert not in_range(low, high, "x", 7)
    assert in_range(low, high, "x", 8)
    assert not in_range(low, high, "x", 9)
    assert in_range(low, high, "y", 6)
    assert in_range(None, None, "y", -100)


def test_tokens_are_hashable_and_equal_whatever_the_map_order():
    a = MultiWriterStreamToken(stream=1, instance_map={"x": 2, "y": 3})
    b = MultiWriterStreamToken(stream=1, instance_map={"y": 3, "x": 2})
    assert a == b and hash(a) == hash(b)
    assert len({RoomStreamToken(stream=1), RoomStreamToken(stream=1)}) == 1
    assert RoomStreamToken(stream=1) != MultiWriterStreamToken(stream=1)


async def test_async_forms_resolve_instance_ids_through_the_resolver():
    resolver = MemoryInstanceIds()
    token = MultiWriterStreamToken(stream=5, instance_map={"w9": 8})
    text = await token.to_string(resolver)
    assert text == "m5~1.8"
    assert await MultiWriterStreamToken.parse(text, resolver) == token
    with pytest.raises(TokenError, match="unknown instance id 2"):
        await RoomStreamToken.parse("m5~2.8", resolver)


# -- properties -------------------------------------------------------------------------------------------


@given(clocks())
def test_multi_writer_tokens_round_trip(clock):
    stream, positions = clock
    resolver = MemoryInstanceIds()
    token = MultiWriterStreamToken(stream=stream, instance_map=positions)
    text = token.serialize(resolver.id_for)
    assert MultiWriterStreamToken.deserialize(text, resolver.name_for) == token
    assert text.startswith("m") == bool(positions)


@given(room_tokens())
def test_room_tokens_round_trip(token):
    resolver = MemoryInstanceIds()
    assert RoomStreamToken.deserialize(token.serialize(resolver.id_for), resolver.name_for) == token


@given(clocks(), clocks())
def test_copy_and_advance_is_an_upper_bound_of_both(a, b):
    x = MultiWriterStreamToken(stream=a[0], instance_map=a[1])
    y = MultiWriterStreamToken(stream=b[0], instance_map=b[1])
    merged = x.copy_and_advance(y)
    assert x.is_before_or_eq(merged) and y.is_before_or_eq(merged)
    assert merged == y.copy_and_advance(x)


TOKEN_TEXT = st.one_of(st.text(max_size=30), st.text(alphabet="stm~.-0123456789_x", max_size=30))


@given(TOKEN_TEXT)
def test_any_text_either_parses_or_raises_token_error(text):
    name_for = MemoryInstanceIds({"a": 1, "b": 2}).name_for
    for cls in (MultiWriterStreamToken, RoomStreamToken):
        with contextlib.suppress(TokenError):
            cls.deserialize(text, name_for)
