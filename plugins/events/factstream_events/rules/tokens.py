"""Room pagination tokens (``/messages``'s ``from``, ``to``, ``start`` and ``end``) and the SQL bounds they set.

A room token names a position in a room's timeline, *just after* one event (docs/plugins/events.md,
``GET /rooms/{room_id}/messages``). Two forms, the reference's:

* ``s<stream>``, a *live* token: after the event with stream ordering ``<stream>``, compared on
  ``stream_ordering`` alone. ``<stream>`` is a position of the forward ``events`` stream, never
  negative.
* ``t<topo>-<stream>``, a *historic* token: after the event at ``(topological_ordering,
  stream_ordering) = (<topo>, <stream>)``, the pair compared lexicographically. ``<topo>`` (a depth)
  is never negative; ``<stream>`` may be: backfilled events have negative stream orderings (-1, -2,
  ...), so ``t5--3`` names the position after the backfilled event ``(5, -3)``, and the token after
  the event ``(5, 0)`` when paging backwards is ``t5--1``.

* ``m<stream>~<id>.<pos>~<id>.<pos>...``, a *live* token of several writers (the core's
  ``RoomStreamToken`` form, the one ``/sync``'s ``room_key`` has): every writer of the events stream
  is at ``<stream>`` except those listed, each by its instance ID (``HostApi.instance_ids``) at its
  own position. An event written by writer ``w`` at stream ordering ``n`` is *at or before* the
  token iff ``n`` is at most ``w``'s position there; so a token can say "writer 1 is done up to 58,
  writer 2 only up to 56" and nothing of the slow writer is skipped (docs/plugins/events.md, "Tokens
  with several writers"). A token whose writers are all at one position is written ``s<stream>``.

Tokens are parsed strictly, so that each token has exactly one spelling and ``str(RoomToken.parse(x))
== x`` for every accepted ``x``: numbers are ASCII digits with an optional leading ``-`` where a
negative value is allowed, without a ``+``, leading zeros, ``-0``, whitespace or any other character;
at most :data:`MAX_TOKEN_LENGTH` characters; each number within PostgreSQL's ``BIGINT`` range. An
``m`` token lists at least one and at most :data:`MAX_WRITERS` writers, by strictly increasing
instance ID, each strictly ahead of the minimum (so it is the core serialiser's exact output).
Anything else raises :class:`TokenError` (a :class:`ValueError`) saying which token and what is wrong.

The live forms (``s``, ``m``) follow the one rule of a room position in a ``/sync`` token
(docs/sync.md, "Token strings"): the core reads the ``room_key`` field of ``since`` by it too, and a
test (tests/host/test_sync_token_input.py) checks on generated strings that both accept exactly the
same live tokens. Only the moment an unknown instance ID is refused differs: the core's parser
refuses it, this module's in :meth:`RoomToken.positions` (and the routes, ``roomtokens.writer_names``,
before any read), so that :meth:`RoomToken.parse` needs no database.

Reading a page: ``WHERE room_id = ... AND <pagination_bounds(...)> ORDER BY <order_by(direction)>
LIMIT n``; the next page starts at :func:`next_token` of the last row returned (no rows: no ``end``).
Backwards includes the ``from`` position's event and excludes ``to``'s; forwards excludes ``from``'s and
includes ``to``'s: both follow from "a token is the position after the event it names".

A live ``from`` bounds only the first page by stream ordering: the pages after it start at historic
tokens, so paging backwards from ``s<n>`` also reaches events with a stream ordering above ``n`` that
sit topologically before the first page's events (a late-arriving federated event of low depth), as
in the reference. Start back-pagination from the room's newest historic token for a strict walk.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Final, Literal

__all__ = [
    "MAX_TOKEN_LENGTH",
    "MAX_WRITERS",
    "Direction",
    "Positions",
    "RoomToken",
    "TokenError",
    "WriterRange",
    "next_token",
    "order_by",
    "pagination_bounds",
]

Direction = Literal["b", "f"]
"""``/messages``' ``dir``: ``"b"`` backwards (newest first), ``"f"`` forwards (oldest first)."""

MAX_WRITERS: Final = 64
"""The most writers an ``m`` token lists (the core's limit for a multi-writer field)."""

MAX_TOKEN_LENGTH: Final = 1 + 19 + MAX_WRITERS * (1 + 19 + 1 + 19)
"""The longest token text accepted: an ``m`` token of :data:`MAX_WRITERS` writers, every number at
19 digits (a one-writer token is at most 41 characters)."""

_BIGINT_MIN: Final = -(2**63)
_BIGINT_MAX: Final = 2**63 - 1
_DIGITS: Final = frozenset("0123456789")
_EMPTY: Final[Mapping[str, int]] = MappingProxyType({})


class TokenError(ValueError):
    """A room token that is not valid: the message names the token and says what is wrong."""


def _show(text: str) -> str:
    """The token as quoted in an error message (escaped; cut short if long)."""
    if len(text) > 40:
        return f"{text[:40]!r}... ({len(text)} characters)"
    return repr(text)


def _parse_number(token: str, part: str, what: str, *, allow_negative: bool) -> int:
    """One number of a token, strictly (see the module docstring)."""
    digits = part[1:] if part.startswith("-") else part
    if not part:
        raise TokenError(f"invalid room token {_show(token)}: the {what} is empty")
    if part.startswith("-") and not allow_negative:
        raise TokenError(f"invalid room token {_show(token)}: the {what} is negative")
    if not digits:
        raise TokenError(f"invalid room token {_show(token)}: the {what} has a '-' but no digits")
    bad = next((c for c in digits if c not in _DIGITS), None)
    if bad is not None:
        raise TokenError(f"invalid room token {_show(token)}: the {what} has a character other than digits ({bad!r})")
    if len(digits) > 1 and digits[0] == "0":
        raise TokenError(f"invalid room token {_show(token)}: the {what} has a leading zero")
    if part == "-0":
        raise TokenError(f"invalid room token {_show(token)}: the {what} is '-0' (write 0)")
    value = int(part)
    if not _BIGINT_MIN <= value <= _BIGINT_MAX:
        raise TokenError(f"invalid room token {_show(token)}: the {what} is outside the 64-bit integer range")
    return value


def _parse_writers(text: str, body: str) -> tuple[int, tuple[tuple[int, int], ...]]:
    """The minimum and the ``(instance ID, position)`` entries of an ``m`` token's ``body``."""
    minimum_text, *entries = body.split("~")
    minimum = _parse_number(text, minimum_text, "minimum stream position", allow_negative=False)
    if not entries:
        raise TokenError(
            f"invalid room token {_show(text)}: an 'm' token lists at least one writer ('m<stream>~<id>.<pos>'):"
            " with none, write 's<stream>'"
        )
    if len(entries) > MAX_WRITERS:
        raise TokenError(f"invalid room token {_show(text)}: more than {MAX_WRITERS} writers")
    writers: list[tuple[int, int]] = []
    for n, entry in enumerate(entries, 1):
        id_text, dot, position_text = entry.partition(".")
        if not dot:
            raise TokenError(f"invalid room token {_show(text)}: writer {n} is not '<instance id>.<position>'")
        instance = _parse_number(text, id_text, f"instance ID of writer {n}", allow_negative=False)
        position = _parse_number(text, position_text, f"position of writer {n}", allow_negative=False)
        if writers and instance <= writers[-1][0]:
            raise TokenError(
                f"invalid room token {_show(text)}: writer {n}'s instance ID {instance} does not follow"
                f" {writers[-1][0]} (the writers are listed once each, by increasing ID)"
            )
        if position <= minimum:
            raise TokenError(
                f"invalid room token {_show(text)}: writer {n} (instance {instance}) is at {position}, not ahead"
                f" of the minimum {minimum} (a writer at the minimum is not listed)"
            )
        writers.append((instance, position))
    return minimum, tuple(writers)


@dataclass(frozen=True, slots=True, order=False)
class RoomToken:
    """A position in a room's timeline, just after an event: ``s<stream>``, ``t<topological>-<stream>``
    or ``m<stream>~<id>.<pos>...``.

    ``topological`` is ``None`` for a live token; ``writers`` (``(instance ID, position)`` pairs, by
    increasing ID, each ahead of ``stream``) is empty unless the token is ``m``, where ``stream`` is
    the minimum. Tokens are not ordered as Python objects (a live and a historic token do not
    compare); :func:`pagination_bounds` turns them into SQL. Constructing an invalid token (a negative
    topological ordering, a negative stream ordering in a live token, a value outside ``BIGINT``, a
    historic token with writers, writers out of order or not ahead) raises :class:`TokenError`, so
    every ``RoomToken`` formats to a valid token.
    """

    stream: int
    topological: int | None = None
    writers: tuple[tuple[int, int], ...] = ()

    def __post_init__(self) -> None:
        if not _BIGINT_MIN <= self.stream <= _BIGINT_MAX:
            raise TokenError(f"room token stream ordering {self.stream} is outside the 64-bit integer range")
        if self.topological is None:
            if self.stream < 0:
                raise TokenError(f"live room token with a negative stream position ({self.stream})")
        elif not 0 <= self.topological <= _BIGINT_MAX:
            raise TokenError(f"room token topological ordering {self.topological} is negative or too large")
        if not self.writers:
            return
        if self.topological is not None:
            raise TokenError("a historic (t) room token has no per-writer positions")
        if len(self.writers) > MAX_WRITERS:
            raise TokenError(f"room token with more than {MAX_WRITERS} writers")
        previous = -1
        for instance, position in self.writers:
            if not previous < instance <= _BIGINT_MAX:
                raise TokenError(f"room token writers must have increasing instance IDs of 0 or more: {self.writers}")
            if not self.stream < position <= _BIGINT_MAX:
                raise TokenError(f"room token writer {instance} at {position}: not ahead of the minimum {self.stream}")
            previous = instance

    @classmethod
    def parse(cls, text: str) -> RoomToken:
        """The token ``text`` denotes; :class:`TokenError` if it is not a valid room token."""
        if not isinstance(text, str):
            raise TokenError(f"invalid room token {text!r}: not a string")
        if not text:
            raise TokenError("invalid room token '': empty")
        if len(text) > MAX_TOKEN_LENGTH:
            raise TokenError(f"invalid room token {_show(text)}: longer than {MAX_TOKEN_LENGTH} characters")
        prefix, body = text[0], text[1:]
        if prefix == "s":
            return cls(stream=_parse_number(text, body, "stream position", allow_negative=False))
        if prefix == "t":
            if body.startswith("-"):
                raise TokenError(f"invalid room token {_show(text)}: the topological ordering is negative")
            topological, separator, stream = body.partition("-")
            if not separator:
                raise TokenError(
                    f"invalid room token {_show(text)}: a 't' token needs '-' between its topological"
                    " and stream orderings"
                )
            return cls(
                topological=_parse_number(text, topological, "topological ordering", allow_negative=False),
                stream=_parse_number(text, stream, "stream ordering", allow_negative=True),
            )
        if prefix == "m":
            minimum, writers = _parse_writers(text, body)
            return cls(stream=minimum, writers=writers)
        raise TokenError(
            f"invalid room token {_show(text)}: it must start with 's' (live) or 't' (historic),"
            " or 'm' (live, per writer)"
        )

    @classmethod
    def at(cls, positions: Positions, ids: Mapping[str, int]) -> RoomToken:
        """The live token of ``positions``, naming writers by their instance IDs (``ids``: name -> ID,
        for every writer ahead of the minimum): ``s<stream>`` when no writer is ahead."""
        writers = tuple(sorted((ids[name], at) for name, at in positions.ahead.items()))
        return cls(stream=positions.minimum, writers=writers)

    @property
    def live(self) -> bool:
        """Whether the token is live (``s`` or ``m``: compared on stream orderings, per writer)."""
        return self.topological is None

    def positions(self, names: Mapping[int, str]) -> Positions:
        """Where a live token puts each writer, by name (``names``: instance ID -> name). A writer whose
        ID no instance has raises :class:`TokenError`: a token this deployment never wrote."""
        if self.topological is not None:
            raise ValueError(f"a historic room token ({self}) has no per-writer positions")
        ahead: dict[str, int] = {}
        for instance, position in self.writers:
            name = names.get(instance)
            if name is None:
                raise TokenError(f"invalid room token {_show(str(self))}: no writer has instance ID {instance}")
            ahead[name] = position
        return Positions(self.stream, ahead)

    def __str__(self) -> str:
        if self.topological is not None:
            return f"t{self.topological}-{self.stream}"
        if self.writers:
            return "m" + "~".join([str(self.stream), *(f"{i}.{p}" for i, p in self.writers)])
        return f"s{self.stream}"


@dataclass(frozen=True, slots=True)
class Positions:
    """Where each writer of the events stream is, by instance name: ``minimum`` for every writer not in
    ``ahead`` (whose positions are all above it). An event of writer ``w`` at stream ordering ``n``
    is at or before these positions iff ``n <= of(w)``.

    The form every live position takes inside the plugin (a token's, a ``/sync`` range end's, the
    stream's current one): :meth:`bound` turns it into SQL over a table's writer and stream columns.
    """

    minimum: int
    ahead: Mapping[str, int] = field(default_factory=lambda: _EMPTY)

    def __post_init__(self) -> None:
        ahead = {w: p for w, p in self.ahead.items() if p > self.minimum}
        object.__setattr__(self, "ahead", MappingProxyType(dict(sorted(ahead.items()))) if ahead else _EMPTY)

    @classmethod
    def of_writers(cls, positions: Mapping[str, int], *, minimum: int | None = None) -> Positions:
        """Per-writer ``positions``; a writer not given is at ``minimum`` (default: the lowest given)."""
        low = min(positions.values(), default=0) if minimum is None else minimum
        return cls(low, positions)

    def of(self, writer: str) -> int:
        """Where ``writer`` is."""
        return self.ahead.get(writer, self.minimum)

    @property
    def maximum(self) -> int:
        """The furthest writer's position."""
        return max(self.ahead.values(), default=self.minimum)

    def capped(self, cap: int) -> Positions:
        """Every writer at most at ``cap``."""
        return Positions(min(self.minimum, cap), {w: min(p, cap) for w, p in self.ahead.items()})

    def before(self, writer: str, stream: int) -> bool:
        """Whether the event of ``writer`` at ``stream`` is at or before these positions."""
        return stream <= self.of(writer)

    def bound(self, operator: Literal["<=", ">"], stream: str, instance: str, name: str) -> tuple[str, dict[str, Any]]:
        """SQL: the rows whose ``stream`` column is ``<=`` (at or before) or ``>`` (after) the position of
        the writer in their ``instance`` column; parameters named after ``name``.

        With no writer ahead it is one comparison with the minimum. Otherwise a plain comparison
        (with the maximum for ``<=``, the minimum for ``>``) keeps the stream-ordering index usable,
        and the per-writer one looks the row's writer up in two arrays (a writer not in them is at
        the minimum).
        """
        if operator not in ("<=", ">"):
            raise ValueError(f"operator must be '<=' or '>', not {operator!r}")
        params: dict[str, Any] = {f"{name}_min": self.minimum}
        if not self.ahead:
            return f"{stream} {operator} %({name}_min)s", params
        params[f"{name}_max"] = self.maximum
        params[f"{name}_writers"] = list(self.ahead)
        params[f"{name}_positions"] = list(self.ahead.values())
        coarse = f"{stream} <= %({name}_max)s" if operator == "<=" else f"{stream} > %({name}_min)s"
        per_writer = (
            f"{stream} {operator} COALESCE((%({name}_positions)s::bigint[])"
            f"[array_position(%({name}_writers)s::text[], {instance})], %({name}_min)s)"
        )
        return f"{coarse} AND {per_writer}", params


@dataclass(frozen=True, slots=True)
class WriterRange:
    """The events after ``low`` up to ``high``, per writer: the event of writer ``w`` at stream ordering
    ``n`` is in the range iff ``low.of(w) < n <= high.of(w)``. What a ``/sync`` or ``/events`` answer
    covers: consecutive ranges (each one's ``low`` the last one's ``high``) hold every event once."""

    low: Positions
    high: Positions

    def contains(self, writer: str, stream: int) -> bool:
        return self.low.of(writer) < stream <= self.high.of(writer)

    @property
    def empty(self) -> bool:
        """Whether no event can be in the range (no writer's ``high`` is above its ``low``)."""
        writers = set(self.low.ahead) | set(self.high.ahead)
        return self.high.minimum <= self.low.minimum and all(self.high.of(w) <= self.low.of(w) for w in writers)

    def sql(self, stream: str, instance: str, name: str) -> tuple[str, dict[str, Any]]:
        """SQL: the rows in the range, over a table's ``stream`` and ``instance`` columns."""
        after, low_params = self.low.bound(">", stream, instance, f"{name}_low")
        upto, high_params = self.high.bound("<=", stream, instance, f"{name}_high")
        return f"{after} AND {upto}", {**low_params, **high_params}


def _check_direction(direction: str) -> None:
    if direction not in ("b", "f"):
        raise ValueError(f"pagination direction must be 'b' or 'f', not {direction!r}")


def _bound(
    token: RoomToken, operator: Literal["<=", ">"], name: str, params: dict[str, Any], names: Mapping[int, str]
) -> str:
    """``<columns> <operator> <token>``: on the pair when the token is historic, per writer when it has
    writers (``names``: their instance names), else on the stream."""
    if token.writers:
        sql, more = token.positions(names).bound(operator, "stream_ordering", "instance_name", name)
        params.update(more)
        return sql
    params[f"{name}_stream"] = token.stream
    if token.topological is None:
        return f"stream_ordering {operator} %({name}_stream)s"
    params[f"{name}_topological"] = token.topological
    return f"(topological_ordering, stream_ordering) {operator} (%({name}_topological)s, %({name}_stream)s)"


def pagination_bounds(
    direction: Direction,
    from_token: RoomToken,
    to_token: RoomToken | None,
    names: Mapping[int, str] | None = None,
) -> tuple[str, dict[str, Any]]:
    """The SQL condition selecting a page's events between two tokens, and its parameters.

    The condition uses the columns ``topological_ordering`` and ``stream_ordering`` and psycopg
    placeholders (``%(from_topological)s``, ``%(from_stream)s``, ``%(to_topological)s``,
    ``%(to_stream)s``). An event is *at or before* a token when its ``stream_ordering`` is at most the
    token's stream (live token), or its ``(topological_ordering, stream_ordering)`` is at most the
    token's pair, lexicographically (historic token: a row comparison, which PostgreSQL answers from
    the ``(room_id, topological_ordering, stream_ordering)`` index).

    * Backwards (``"b"``): events at or before ``from_token`` (it names the event just before the
      position, which is included), and after ``to_token`` (its event excluded).
    * Forwards (``"f"``): events after ``from_token`` (excluded) and at or before ``to_token``
      (included).

    An ``m`` token bounds per writer (column ``instance_name``; ``names`` maps its instance IDs to
    names, :class:`TokenError` for one it lacks): an event is at or before it when its stream ordering
    is at most its writer's position there (:meth:`Positions.bound`).

    ``to_token`` ``None``: no second bound.
    """
    _check_direction(direction)
    params: dict[str, Any] = {}
    known = names or {}
    if direction == "b":
        clauses = [_bound(from_token, "<=", "from", params, known)]
        if to_token is not None:
            clauses.append(_bound(to_token, ">", "to", params, known))
    else:
        clauses = [_bound(from_token, ">", "from", params, known)]
        if to_token is not None:
            clauses.append(_bound(to_token, "<=", "to", params, known))
    return " AND ".join(clauses), params


def next_token(direction: Direction, last_topological: int, last_stream: int) -> RoomToken:
    """The token where the next page starts, after a page whose last event is at ``(last_topological,
    last_stream)``.

    Forwards: the position after that event, ``t<topo>-<stream>`` (the next page excludes it).
    Backwards: the position after the event just before it, ``t<topo>-<stream - 1>``: as stream
    orderings are unique, the next page (which includes its ``from``) holds exactly the events
    before the last one. The stream part may go negative (after a backfilled event, or one of
    stream ordering 0).
    """
    _check_direction(direction)
    if direction == "b":
        return RoomToken(topological=last_topological, stream=last_stream - 1)
    return RoomToken(topological=last_topological, stream=last_stream)


def order_by(direction: Direction) -> str:
    """The ``ORDER BY`` of a page: newest first backwards, oldest first forwards."""
    _check_direction(direction)
    if direction == "b":
        return "topological_ordering DESC, stream_ordering DESC"
    return "topological_ordering ASC, stream_ordering ASC"
