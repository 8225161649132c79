"""Room pagination tokens: strict parsing, one spelling per token, and the SQL bounds they set.

The bound semantics are checked against docs/plugins/events.md, ``GET /rooms/{room_id}/messages`` ("a token
names the position just after an event"; backwards includes ``from`` and excludes ``to``, forwards the
opposite), on generated rooms, twice: with a small evaluator of the generated SQL written here, and
against a real PostgreSQL (``$FACTSTREAM_TEST_DATABASE_URL``; those tests skip when it is unset).
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator, Sequence
from typing import Any, Protocol

import psycopg
import pytest
from factstream_events.rules.tokens import (
    MAX_TOKEN_LENGTH,
    Direction,
    RoomToken,
    TokenError,
    next_token,
    order_by,
    pagination_bounds,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import factstream
from factstream.db.engine import libpq_url

BIGINT_MIN = -(2**63)
BIGINT_MAX = 2**63 - 1

Event = tuple[int, int]  # (topological_ordering, stream_ordering)

# -- parsing and formatting -----------------------------------------------------------------------


def test_the_plugin_reads_room_tokens_with_the_core_s_one_type() -> None:
    """One room token type, owned by the core: the plugin's names are the core's (so the ``/sync`` token
    parser and the plugin's routes cannot drift apart), and its error is a ``ValueError`` and a
    ``FactstreamError`` alike."""
    assert RoomToken is factstream.RoomToken and TokenError is factstream.TokenError
    assert RoomToken.__module__ == "factstream.room_token"
    assert issubclass(TokenError, ValueError) and issubclass(TokenError, factstream.FactstreamError)


live_tokens = st.builds(RoomToken, stream=st.integers(0, BIGINT_MAX))
historic_tokens = st.builds(
    RoomToken, stream=st.integers(BIGINT_MIN, BIGINT_MAX), topological=st.integers(0, BIGINT_MAX)
)
any_tokens = st.one_of(live_tokens, historic_tokens)


@given(any_tokens)
def test_format_then_parse_round_trips(token: RoomToken) -> None:
    text = str(token)
    assert RoomToken.parse(text) == token
    assert len(text) <= MAX_TOKEN_LENGTH


@given(st.text(alphabet="st-+0123456789 m\x00\n٣", max_size=30) | st.text(max_size=30))
def test_every_accepted_text_is_the_one_spelling_of_its_token(text: str) -> None:
    try:
        token = RoomToken.parse(text)
    except TokenError as exc:
        assert "room token" in str(exc)
        return
    assert str(token) == text


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("s0", RoomToken(0)),
        ("s42", RoomToken(42)),
        ("t0-0", RoomToken(0, topological=0)),
        ("t7-13", RoomToken(13, topological=7)),
        ("t5--3", RoomToken(-3, topological=5)),  # a backfilled event's position
        ("t1--1", RoomToken(-1, topological=1)),
        (f"s{BIGINT_MAX}", RoomToken(BIGINT_MAX)),
        (f"t{BIGINT_MAX}-{BIGINT_MIN}", RoomToken(BIGINT_MIN, topological=BIGINT_MAX)),
    ],
)
def test_parse_valid(text: str, expected: RoomToken) -> None:
    assert RoomToken.parse(text) == expected
    assert str(expected) == text


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("", "empty"),
        ("x5", "must start with 's' (live) or 't' (historic)"),
        ("S5", "must start with 's'"),
        ("5", "must start with 's'"),
        (" s5", "must start with 's'"),
        ("\x00s5", "must start with 's'"),
        ("m5", "an 'm' token lists at least one writer"),
        ("m5~1.5", "is at 5, not ahead of the minimum 5"),
        ("m5~2.7~1.8", "does not follow 2"),
        ("s", "stream position is empty"),
        ("s-5", "stream position is negative"),
        ("s+5", "stream position has a character other than digits ('+')"),
        ("s 5", "stream position has a character other than digits (' ')"),
        ("s5 ", "stream position has a character other than digits (' ')"),
        ("s5\n", "stream position has a character other than digits ('\\n')"),
        ("s5\x00", "stream position has a character other than digits ('\\x00')"),
        ("s1_000", "stream position has a character other than digits ('_')"),
        ("s٣", "stream position has a character other than digits ('٣')"),  # a non-ASCII digit
        ("s05", "stream position has a leading zero"),
        ("s00", "stream position has a leading zero"),
        (f"s{BIGINT_MAX + 1}", "stream position is outside the 64-bit integer range"),
        ("t", "needs '-' between its topological and stream orderings"),
        ("t5", "needs '-' between its topological and stream orderings"),
        ("t5-", "stream ordering is empty"),
        ("t-5-3", "topological ordering is negative"),
        ("t-3", "topological ordering is negative"),
        ("t+5-3", "topological ordering has a character other than digits ('+')"),
        ("ta-3", "topological ordering has a character other than digits ('a')"),
        ("t5-3a", "stream ordering has a character other than digits ('a')"),
        ("t5-+3", "stream ordering has a character other than digits ('+')"),
        ("t5---3", "stream ordering has a character other than digits ('-')"),
        ("t5--", "stream ordering has a '-' but no digits"),
        ("t5-3-", "stream ordering has a character other than digits ('-')"),
        ("t05-3", "topological ordering has a leading zero"),
        ("t5-03", "stream ordering has a leading zero"),
        ("t5--03", "stream ordering has a leading zero"),
        ("t5--0", "stream ordering is '-0'"),
        ("t5-3 ", "stream ordering has a character other than digits (' ')"),
        (f"t{BIGINT_MAX + 1}-1", "topological ordering is outside the 64-bit integer range"),
        (f"t1--{-BIGINT_MIN + 1}", "stream ordering is outside the 64-bit integer range"),
        ("s" + "1" * MAX_TOKEN_LENGTH, f"longer than {MAX_TOKEN_LENGTH} characters"),
    ],
)
def test_parse_rejects(text: str, reason: str) -> None:
    with pytest.raises(TokenError) as caught:
        RoomToken.parse(text)
    message = str(caught.value)
    assert reason in message
    assert message.startswith("invalid room token ")
    shown = repr(text) if len(text) <= 40 else repr(text[:40])
    assert shown in message  # names the bad token (escaped, cut short when long)


def test_token_error_is_a_value_error() -> None:
    assert issubclass(TokenError, ValueError)
    with pytest.raises(ValueError):
        RoomToken.parse("nope")


def test_a_long_token_is_named_cut_short() -> None:
    text = "t" + "9" * 200
    with pytest.raises(TokenError, match=r"\(201 characters\)") as caught:
        RoomToken.parse(text)
    assert len(str(caught.value)) < 150


@pytest.mark.parametrize(
    ("stream", "topological"),
    [(-1, None), (5, -1), (BIGINT_MAX + 1, None), (BIGINT_MIN - 1, 3), (1, BIGINT_MAX + 1)],
)
def test_constructor_rejects_what_could_not_be_written(stream: int, topological: int | None) -> None:
    with pytest.raises(TokenError):
        RoomToken(stream, topological)


def test_tokens_are_values_not_ordered() -> None:
    assert RoomToken(3, 2) == RoomToken.parse("t2-3")
    assert RoomToken(3) != RoomToken(3, 0)
    assert len({RoomToken(3), RoomToken.parse("s3")}) == 1
    with pytest.raises(TypeError):
        _ = RoomToken(1) < RoomToken(2)  # type: ignore[operator]


# -- next token, order, the generated SQL ----------------------------------------------------------


@pytest.mark.parametrize(
    ("direction", "topo", "stream", "expected"),
    [
        ("b", 5, 10, "t5-9"),
        ("f", 5, 10, "t5-10"),
        ("b", 5, -3, "t5--4"),  # backfilled: further negative
        ("f", 5, -3, "t5--3"),
        ("b", 3, 0, "t3--1"),
        ("b", 3, 1, "t3-0"),
    ],
)
def test_next_token(direction: Direction, topo: int, stream: int, expected: str) -> None:
    assert str(next_token(direction, topo, stream)) == expected


def test_order_by() -> None:
    assert order_by("b") == "topological_ordering DESC, stream_ordering DESC"
    assert order_by("f") == "topological_ordering ASC, stream_ordering ASC"


@pytest.mark.parametrize(
    "call", [order_by, lambda d: next_token(d, 1, 1), lambda d: pagination_bounds(d, RoomToken(1), None)]
)
def test_a_direction_other_than_b_or_f_is_refused(call: object) -> None:
    assert callable(call)
    with pytest.raises(ValueError, match="'x'"):
        call("x")


def test_bounds_sql_text() -> None:
    assert pagination_bounds("b", RoomToken(9, 4), None) == (
        "(topological_ordering, stream_ordering) <= (%(from_topological)s, %(from_stream)s)",
        {"from_topological": 4, "from_stream": 9},
    )
    assert pagination_bounds("b", RoomToken(9), RoomToken(-2, 1)) == (
        "stream_ordering <= %(from_stream)s"
        " AND (topological_ordering, stream_ordering) > (%(to_topological)s, %(to_stream)s)",
        {"from_stream": 9, "to_topological": 1, "to_stream": -2},
    )
    assert pagination_bounds("f", RoomToken(3, 1), RoomToken(7)) == (
        "(topological_ordering, stream_ordering) > (%(from_topological)s, %(from_stream)s)"
        " AND stream_ordering <= %(to_stream)s",
        {"from_topological": 1, "from_stream": 3, "to_stream": 7},
    )


# -- two ways to run a page query ----------------------------------------------------------------


class Backend(Protocol):
    def load(self, events: Sequence[Event]) -> None: ...

    def select(self, condition: str, params: dict[str, int], order: str, limit: int | None) -> list[Event]: ...


_COLUMN = {"topological_ordering": 0, "stream_ordering": 1}
_OPERATORS = {
    "<=": lambda a, b: a <= b,
    "<": lambda a, b: a < b,
    ">=": lambda a, b: a >= b,
    ">": lambda a, b: a > b,
}
_STREAM_CLAUSE = re.compile(r"stream_ordering (<=|<|>=|>) %\((\w+)\)s")
_PAIR_CLAUSE = re.compile(r"\(topological_ordering, stream_ordering\) (<=|<|>=|>) \(%\((\w+)\)s, %\((\w+)\)s\)")
_ORDER_TERM = re.compile(r"(topological_ordering|stream_ordering) (ASC|DESC)")


class PythonBackend:
    """Evaluates the exact shapes of condition :func:`pagination_bounds` writes; anything else fails."""

    def __init__(self) -> None:
        self.events: list[Event] = []

    def load(self, events: Sequence[Event]) -> None:
        self.events = list(events)

    def _matches(self, event: Event, condition: str, params: dict[str, int]) -> bool:
        for clause in condition.split(" AND "):
            if m := _STREAM_CLAUSE.fullmatch(clause):
                if not _OPERATORS[m[1]](event[1], params[m[2]]):
                    return False
            elif m := _PAIR_CLAUSE.fullmatch(clause):
                if not _OPERATORS[m[1]](event, (params[m[2]], params[m[3]])):
                    return False
            else:
                raise AssertionError(f"clause the evaluator does not know: {clause!r}")
        return True

    def select(self, condition: str, params: dict[str, int], order: str, limit: int | None) -> list[Event]:
        rows = [e for e in self.events if self._matches(e, condition, params)]
        terms = [_ORDER_TERM.fullmatch(term) for term in order.split(", ")]
        assert all(terms), order
        for term in reversed(terms):  # stable sorts, last key first
            assert term is not None
            rows.sort(key=lambda e, i=_COLUMN[term[1]]: e[i], reverse=term[2] == "DESC")
        return rows if limit is None else rows[:limit]


class PostgresBackend:
    """Runs the generated condition in PostgreSQL over a TEMP table with the store's column types."""

    def __init__(self, conn: psycopg.Connection[tuple[Any, ...]]) -> None:
        self.conn = conn
        conn.execute(
            "CREATE TEMP TABLE page_events (topological_ordering BIGINT NOT NULL,"
            " stream_ordering BIGINT NOT NULL UNIQUE)"
        )
        conn.execute("CREATE INDEX ON page_events (topological_ordering, stream_ordering)")

    def load(self, events: Sequence[Event]) -> None:
        self.conn.execute("TRUNCATE page_events")
        self.conn.execute(
            "INSERT INTO page_events SELECT * FROM unnest(%s::bigint[], %s::bigint[])",
            ([t for t, _ in events], [s for _, s in events]),
        )

    def select(self, condition: str, params: dict[str, int], order: str, limit: int | None) -> list[Event]:
        sql = f"SELECT topological_ordering, stream_ordering FROM page_events WHERE {condition} ORDER BY {order}"
        if limit is not None:
            sql += f" LIMIT {int(limit)}"
        return [(t, s) for t, s in self.conn.execute(sql, params).fetchall()]


@pytest.fixture(scope="module", params=["python", "postgresql"])
def backend(request: pytest.FixtureRequest) -> Iterator[Backend]:
    if request.param == "python":
        yield PythonBackend()
        return
    url = os.environ.get("FACTSTREAM_TEST_DATABASE_URL")
    if not url:
        pytest.skip("FACTSTREAM_TEST_DATABASE_URL is not set")
    with psycopg.connect(libpq_url(url), autocommit=True) as conn:
        yield PostgresBackend(conn)


# -- the bounds the docs give, independently of the SQL -----------------------------------------

rooms = st.lists(
    st.tuples(st.integers(1, 8), st.integers(-20, 40)),  # small ranges: ties on depth, backfilled events
    unique_by=lambda e: e[1],  # stream orderings are unique
    max_size=25,
)
hypothesis_settings = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def topological_order(events: Sequence[Event]) -> list[Event]:
    return sorted(events)  # (topological, stream), lexicographically


def stream_order(events: Sequence[Event]) -> list[Event]:
    return sorted(events, key=lambda e: e[1])


def after_position(order: list[Event], token: RoomToken) -> int:
    """How many events of ``order`` are at or before the position ``token`` denotes: the position is
    just after the last event not later than the one the token names (located by counting, not by
    comparing with the token as a whole)."""
    count = 0
    for event in order:
        if token.topological is None:
            later = event[1] > token.stream
        else:
            later = event[0] > token.topological or (event[0] == token.topological and event[1] > token.stream)
        if later:
            break
        count += 1
    return count


def expected_page(events: Sequence[Event], direction: Direction, start: RoomToken, end: RoomToken | None) -> set[Event]:
    """The events between the two positions, each position located in its own order (live tokens in
    stream order, historic ones in topological order)."""

    def before(token: RoomToken) -> set[Event]:
        order = stream_order(events) if token.topological is None else topological_order(events)
        return set(order[: after_position(order, token)])

    everything = set(events)
    if direction == "b":  # before `from`, not before `to`
        return before(start) - (before(end) if end is not None else set())
    return (everything - before(start)) & (before(end) if end is not None else everything)


def tokens_for(events: Sequence[Event]) -> st.SearchStrategy[RoomToken]:
    arbitrary = st.one_of(
        st.builds(RoomToken, stream=st.integers(0, 45)),
        st.builds(RoomToken, stream=st.integers(-25, 45), topological=st.integers(0, 10)),
    )
    if not events:
        return arbitrary
    naming = st.sampled_from(events).flatmap(
        lambda e: st.sampled_from([RoomToken(e[1], e[0]), RoomToken(max(e[1], 0))])
    )
    return st.one_of(naming, arbitrary)


@hypothesis_settings
@given(st.data(), rooms, st.sampled_from(["b", "f"]))
def test_bounds_select_exactly_the_events_between_the_tokens(
    backend: Backend, data: st.DataObject, events: list[Event], direction: Direction
) -> None:
    backend.load(events)
    start = data.draw(tokens_for(events), label="from")
    end = data.draw(st.none() | tokens_for(events), label="to")
    condition, params = pagination_bounds(direction, start, end)
    got = backend.select(condition, params, order_by(direction), None)
    assert set(got) == expected_page(events, direction, start, end)
    assert got == sorted(got, reverse=direction == "b")
    assert len(got) == len(set(got))


@hypothesis_settings
@given(rooms, st.data())
def test_a_token_naming_an_event_splits_the_room_after_it(
    backend: Backend, events: list[Event], data: st.DataObject
) -> None:
    """``t<topo>-<stream>`` of the i-th event (topological order): backwards from it gives events
    0..i, newest first; forwards from it, events i+1.. ; with ``to`` the j-th event, the slice between."""
    if not events:
        return
    backend.load(events)
    order = topological_order(events)
    i = data.draw(st.integers(0, len(order) - 1), label="i")
    j = data.draw(st.integers(-1, i), label="j")  # -1: before every event
    token_i = RoomToken(order[i][1], order[i][0])
    token_j = RoomToken(order[j][1], order[j][0]) if j >= 0 else RoomToken(0, 0)
    backwards = backend.select(*pagination_bounds("b", token_i, None), order_by("b"), None)
    assert backwards == order[: i + 1][::-1]
    forwards = backend.select(*pagination_bounds("f", token_i, None), order_by("f"), None)
    assert forwards == order[i + 1 :]
    between_b = backend.select(*pagination_bounds("b", token_i, token_j), order_by("b"), None)
    assert between_b == order[j + 1 : i + 1][::-1]
    between_f = backend.select(*pagination_bounds("f", token_j, token_i), order_by("f"), None)
    assert between_f == order[j + 1 : i + 1]


def page_through(
    backend: Backend, direction: Direction, start: RoomToken, end: RoomToken | None, limit: int, bound: int
) -> list[Event]:
    seen: list[Event] = []
    token = start
    for _ in range(bound):
        rows = backend.select(*pagination_bounds(direction, token, end), order_by(direction), limit)
        if not rows:
            return seen
        seen.extend(rows)
        token = next_token(direction, *rows[-1])
    raise AssertionError(f"paging did not end after {bound} pages: {seen}")


@hypothesis_settings
@given(rooms.filter(bool), st.integers(1, 5), st.data())
def test_paging_backwards_visits_every_event_once_newest_first(
    backend: Backend, events: list[Event], limit: int, data: st.DataObject
) -> None:
    backend.load(events)
    order = topological_order(events)
    newest = order[-1]
    start = RoomToken(newest[1], newest[0])  # the room's newest historic token (no `from`)
    bound = len(events) + 2
    assert page_through(backend, "b", start, None, limit, bound) == order[::-1]
    # With a `to`: exactly the events after it.
    j = data.draw(st.integers(0, len(order) - 1), label="to index")
    end = RoomToken(order[j][1], order[j][0])
    assert page_through(backend, "b", start, end, limit, bound) == order[j + 1 :][::-1]


@hypothesis_settings
@given(rooms.filter(bool), st.integers(1, 5))
def test_paging_forwards_visits_every_event_once_oldest_first(
    backend: Backend, events: list[Event], limit: int
) -> None:
    backend.load(events)
    order = topological_order(events)
    newest = order[-1]
    bound = len(events) + 2
    assert page_through(backend, "f", RoomToken(0, 0), None, limit, bound) == order
    assert page_through(backend, "f", RoomToken(0, 0), RoomToken(newest[1], newest[0]), limit, bound) == order


def test_extreme_values_reach_the_database_intact(backend: Backend) -> None:
    events = [(0, BIGINT_MIN + 1), (0, BIGINT_MIN + 2), (BIGINT_MAX, BIGINT_MAX), (BIGINT_MAX, 0), (1, -1)]
    backend.load(events)
    start = RoomToken.parse(f"t{BIGINT_MAX}-{BIGINT_MAX}")
    assert page_through(backend, "b", start, None, 2, 10) == sorted(events, reverse=True)
    assert page_through(backend, "f", RoomToken.parse(f"t0-{BIGINT_MIN}"), None, 2, 10) == sorted(events)
    everything = pagination_bounds("b", RoomToken(BIGINT_MAX), RoomToken(BIGINT_MIN, 0))
    assert backend.select(*everything, order_by("b"), None) == sorted(events, reverse=True)
    # The event before the lowest possible stream ordering cannot be named: refused, not wrapped.
    with pytest.raises(TokenError):
        next_token("b", 0, BIGINT_MIN)
