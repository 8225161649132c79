"""Room tokens as the events plugin uses them: per-writer positions and the SQL bounds a token sets.

The token itself, its three forms and its one strict grammar are the core's
(:class:`factstream.RoomToken`, ``factstream/room_token.py``): ``s<stream>`` (live), ``t<topo>-<stream>``
(historic, a position in one room's history; ``<stream>`` may be negative, after a backfilled event)
and ``m<stream>~<id>.<pos>...`` (live, per writer: every writer of the events stream at ``<stream>``
except those listed by instance ID). The core reads the ``room_key`` field of a ``/sync`` token with the
same parser, so a room position is read by one rule wherever a client gives one; this module re-exports
``RoomToken``, ``TokenError`` and the limits for the plugin's code.

What is the plugin's: :class:`Positions` (where each writer is, by name), :class:`WriterRange` (the
events between two of them), :func:`live_token` and :func:`positions_of` (a token to positions and
back, instance IDs to names), and the SQL of pages. An event written by writer ``w`` at stream
ordering ``n`` is *at or before* a live token iff ``n`` is at most ``w``'s position there; so a token
can say "writer 1 is done up to 58, writer 2 only up to 56" and nothing of the slow writer is skipped
(docs/plugins/events.md, "Tokens with several writers"). A token naming an instance ID that no
instance has is refused in :func:`positions_of` (and by the routes, ``roomtokens.writer_names``, before
any read), so that parsing needs no database.

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

from factstream import MAX_ROOM_TOKEN_LENGTH, MAX_WRITERS, RoomToken, TokenError

__all__ = [
    "MAX_TOKEN_LENGTH",
    "MAX_WRITERS",
    "Direction",
    "Positions",
    "RoomToken",
    "TokenError",
    "WriterRange",
    "live_token",
    "next_token",
    "order_by",
    "pagination_bounds",
    "positions_of",
]

Direction = Literal["b", "f"]
"""``/messages``' ``dir``: ``"b"`` backwards (newest first), ``"f"`` forwards (oldest first)."""

MAX_TOKEN_LENGTH: Final = MAX_ROOM_TOKEN_LENGTH
"""The longest token text accepted (the core's :data:`~factstream.room_token.MAX_ROOM_TOKEN_LENGTH`)."""

_EMPTY: Final[Mapping[str, int]] = MappingProxyType({})


def live_token(positions: Positions, ids: Mapping[str, int]) -> RoomToken:
    """The live token of ``positions``, naming writers by their instance IDs (``ids``: name -> ID, for
    every writer ahead of the minimum): ``s<stream>`` when no writer is ahead."""
    return RoomToken.of_writers(positions.minimum, {ids[name]: at for name, at in positions.ahead.items()})


def positions_of(token: RoomToken, names: Mapping[int, str]) -> Positions:
    """Where a live token puts each writer, by name (``names``: instance ID -> name). A writer whose ID
    no instance has raises :class:`TokenError`: a token this deployment never wrote."""
    return Positions(token.stream, token.by_name(names))


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
        sql, more = positions_of(token, names).bound(operator, "stream_ordering", "instance_name", name)
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
