"""StreamToken: fields in layout order, padding, strict parsing, advancing, bounding the future."""

from __future__ import annotations

import contextlib
import logging

import pytest
from hypothesis import given
from hypothesis import strategies as st

from factstream.sync import (
    MemoryInstanceIds,
    MultiWriterStreamToken,
    RoomStreamToken,
    StreamToken,
    SyncKey,
    SyncKeyKind,
    SyncKeyLayout,
    TokenError,
    bound_future_token,
    current_token_source,
)
from factstream.sync.tokens import MAX_POSITION

LAYOUT = SyncKeyLayout.of(
    SyncKey("room_key", SyncKeyKind.ROOM),
    "presence_key",
    SyncKey("typing_key", comparable=False),
    SyncKey("receipt_key", SyncKeyKind.MULTI_WRITER),
    SyncKey("old_key", SyncKeyKind.RETIRED, comparable=False),
)
NAMES = st.sampled_from(["main", "w1", "w2", "w3"])
#: Sync positions: a client's token holds nothing else (tests/host/test_sync_token_input.py).
INTS = st.integers(min_value=0, max_value=MAX_POSITION)


@st.composite
def clock(draw: st.DrawFn, cls: type[MultiWriterStreamToken] | type[RoomStreamToken]):
    stream = draw(st.integers(min_value=0, max_value=1000))
    positions = draw(st.dictionaries(NAMES, st.integers(stream + 1, stream + 1000), max_size=3))
    return cls(stream=stream, instance_map=positions)


@st.composite
def stream_tokens(draw: st.DrawFn) -> StreamToken:
    room = draw(clock(RoomStreamToken))  # live: a topological room token is no sync position
    return StreamToken(LAYOUT, (room, draw(INTS), draw(INTS), draw(clock(MultiWriterStreamToken)), 0))


def ids() -> MemoryInstanceIds:
    return MemoryInstanceIds({"w1": 1, "w2": 2})


def test_start_is_all_zeros():
    assert StreamToken.start(LAYOUT).serialize(ids().id_for) == "s0_0_0_0_0"


def test_fields_are_written_in_layout_order():
    token = StreamToken.of(
        LAYOUT,
        {
            "room_key": RoomStreamToken(stream=5, instance_map={"w1": 6}),
            "presence_key": 17,
            "typing_key": 3,
            "receipt_key": MultiWriterStreamToken(stream=4, instance_map={"w2": 9}),
        },
    )
    assert token.serialize(ids().id_for) == "m5~1.6_17_3_m4~2.9_0"


def test_missing_trailing_fields_parse_as_start():
    token = StreamToken.deserialize("s7_3", LAYOUT, ids().name_for)
    assert token == StreamToken.of(LAYOUT, {"room_key": 7, "presence_key": 3})
    assert token.get("receipt_key") == MultiWriterStreamToken(stream=0)


def test_unknown_extra_fields_are_rejected():
    with pytest.raises(TokenError, match="6 fields; this server knows only 5"):
        StreamToken.deserialize("s1_2_3_4_5_6", LAYOUT, ids().name_for)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "the token is empty"),
        ("s5_abc", r"field 2 \(presence_key\): expected an integer"),
        ("5_1", r"field 1 \(room_key\): invalid room token '5': it must start with 's'"),
        ("s5__1", r"field 2 \(presence_key\): is empty"),
        ("s5_1_2_", r"field 4 \(receipt_key\): is empty"),
        ("s-_1", r"field 1 \(room_key\): invalid room token 's-': the stream position is negative"),
        ("t3-_1", r"field 1 \(room_key\): invalid room token 't3-': the stream ordering is empty"),
        ("t3-4_1", r"field 1 \(room_key\): a topological room token 't3-4' is not a sync position"),
        ("s5_1_2_m5~x.1", r"field 4 \(receipt_key\): the instance ID of writer 1 has a character other than digits"),
        ("s5_1_2_m5~7.8", r"field 4 \(receipt_key\): unknown instance id 7"),
        ("s5_1_2_3_zz", r"field 5 \(old_key\)"),
        ("s5_" + "1" * 20000, "longer than"),
    ],
)
def test_malformed_tokens_raise_token_error_naming_the_field(text, message):
    with pytest.raises(TokenError, match=message):
        StreamToken.deserialize(text, LAYOUT, ids().name_for)


def test_a_retired_field_accepts_any_old_form_and_keeps_nothing():
    for old in ("7", "s7", "t1-7", "m7~1.9"):
        assert StreamToken.deserialize(f"s1_0_0_0_{old}", LAYOUT, ids().name_for).get("old_key") == 0


def test_an_int_field_accepts_a_vector_clock_and_keeps_its_minimum():
    layout = SyncKeyLayout.of("a")
    assert StreamToken.deserialize("m5~1.9", layout, ids().name_for).get("a") == 5


def test_copy_and_advance_moves_int_fields_forward_only_and_merges_multi_writer_fields():
    token = StreamToken.of(LAYOUT, {"presence_key": 10, "receipt_key": MultiWriterStreamToken(stream=4)})
    assert token.copy_and_advance("presence_key", 7) is token
    assert token.copy_and_advance("presence_key", 12).get("presence_key") == 12
    advanced = token.copy_and_advance("receipt_key", MultiWriterStreamToken(stream=3, instance_map={"w1": 8}))
    assert advanced.get("receipt_key") == MultiWriterStreamToken(stream=4, instance_map={"w1": 8})
    assert advanced.copy_and_advance("receipt_key", 6).get("receipt_key") == MultiWriterStreamToken(
        stream=6, instance_map={"w1": 8}
    )
    with pytest.raises(KeyError, match="retired"):
        token.copy_and_advance("old_key", 1)
    with pytest.raises(KeyError, match="unknown sync key 'nope'"):
        token.copy_and_advance("nope", 1)
    with pytest.raises(TypeError):
        token.copy_and_advance("presence_key", MultiWriterStreamToken(stream=1))


def test_is_before_or_eq_skips_keys_that_can_reset():
    low = StreamToken.of(LAYOUT, {"presence_key": 1, "typing_key": 50})
    high = StreamToken.of(LAYOUT, {"presence_key": 2, "typing_key": 0})
    assert low.is_before_or_eq(high)
    assert not high.is_before_or_eq(low)
    ahead = StreamToken.of(LAYOUT, {"receipt_key": MultiWriterStreamToken(stream=0, instance_map={"w1": 1})})
    assert not ahead.is_before_or_eq(high)


async def test_async_round_trip_through_a_resolver():
    resolver = MemoryInstanceIds()
    token = StreamToken.of(LAYOUT, {"receipt_key": MultiWriterStreamToken(stream=1, instance_map={"new": 3})})
    text = await token.to_string(resolver)
    assert text == "s0_0_0_m1~1.3_0"
    assert await StreamToken.parse(text, LAYOUT, resolver) == token


class Gen:
    def __init__(self, current: int, positions: dict[str, int]) -> None:
        self.current, self.positions = current, positions

    def get_current_token(self) -> int:
        return self.current

    def get_positions(self) -> dict[str, int]:
        return dict(self.positions)


def test_current_token_source_reads_every_stream_in_its_form():
    gen = Gen(5, {"w1": 7, "w2": 5})
    current = current_token_source(
        LAYOUT, {"room_key": gen, "presence_key": gen, "typing_key": lambda: 99, "receipt_key": gen}
    )()
    assert current.get("room_key") == RoomStreamToken(stream=5, instance_map={"w1": 7})
    assert current.get("presence_key") == 5
    assert current.get("typing_key") == 99
    assert current.get("receipt_key") == MultiWriterStreamToken(stream=5, instance_map={"w1": 7})
    with pytest.raises(KeyError, match="receipt_key"):
        current_token_source(LAYOUT, {"room_key": gen, "presence_key": gen, "typing_key": gen})


def allocated(value: int):
    calls = []

    async def source() -> int:
        calls.append(value)
        return value

    return source, calls


async def test_bound_future_token_clamps_fields_ahead_of_the_allocation_and_warns(caplog):
    current = StreamToken.of(LAYOUT, {"room_key": 10, "presence_key": 10, "receipt_key": 10})
    client = StreamToken.of(
        LAYOUT,
        {
            "room_key": 12,  # ahead of current, not of the allocation: kept (the caller waits)
            "presence_key": 1000,  # from the future
            "typing_key": 10**6,  # can reset: never bounded
            "receipt_key": MultiWriterStreamToken(stream=9, instance_map={"w1": 500}),
        },
    )
    room, room_calls = allocated(20)
    presence, _ = allocated(20)
    receipts, _ = allocated(30)
    with caplog.at_level(logging.WARNING, logger="factstream.sync.stream_token"):
        bounded = await bound_future_token(
            client, current, {"room_key": room, "presence_key": presence, "receipt_key": receipts}
        )
    assert bounded.get("room_key") == RoomStreamToken(stream=12)
    assert bounded.get("presence_key") == 20
    assert bounded.get("typing_key") == 10**6
    assert bounded.get("receipt_key") == MultiWriterStreamToken(stream=9, instance_map={"w1": 30})
    assert room_calls == [20]
    messages = [r.getMessage() for r in caplog.records]
    assert any("Bounding token from the future" in m and "presence_key" in m for m in messages)
    assert any("receipt_key" in m for m in messages)
    assert not any("room_key" in m for m in messages)


async def test_bound_future_token_asks_for_no_allocation_when_the_token_is_not_ahead():
    current = StreamToken.of(LAYOUT, {"presence_key": 10})
    token = StreamToken.of(LAYOUT, {"presence_key": 3})
    assert await bound_future_token(token, current, {}) is token
    with pytest.raises(KeyError, match="presence_key"):
        await bound_future_token(StreamToken.of(LAYOUT, {"presence_key": 11}), current, {})


# -- properties -------------------------------------------------------------------------------------------


@given(stream_tokens())
def test_stream_tokens_round_trip(token):
    resolver = MemoryInstanceIds()
    assert StreamToken.deserialize(token.serialize(resolver.id_for), LAYOUT, resolver.name_for) == token


@given(stream_tokens(), st.integers(0, 4))
def test_a_token_cut_short_parses_with_the_rest_at_start(token, keep):
    resolver = MemoryInstanceIds()
    text = "_".join(token.serialize(resolver.id_for).split("_")[: keep + 1])
    parsed = StreamToken.deserialize(text, LAYOUT, resolver.name_for)
    start = StreamToken.start(LAYOUT)
    assert parsed.values[: keep + 1] == token.values[: keep + 1]
    assert parsed.values[keep + 1 :] == start.values[keep + 1 :]


ALPHABET = "stm~.-_0123456789x"


@given(st.one_of(st.text(max_size=60), st.text(alphabet=ALPHABET, max_size=60)))
def test_any_text_either_parses_or_raises_token_error(text):
    # Any other exception type fails the test: a client's token must never cause a 500.
    with contextlib.suppress(TokenError):
        StreamToken.deserialize(text, LAYOUT, ids().name_for)
