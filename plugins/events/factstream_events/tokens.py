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

The reference's multi-writer form (``m<stream>~<instance>.<position>...``) is not accepted.

Tokens are parsed strictly, so that each token has exactly one spelling and ``str(RoomToken.parse(x))
== x`` for every accepted ``x``: numbers are ASCII digits with an optional leading ``-`` where a
negative value is allowed, without a ``+``, leading zeros, ``-0``, whitespace or any other character;
at most :data:`MAX_TOKEN_LENGTH` characters; each number within PostgreSQL's ``BIGINT`` range.
Anything else raises :class:`TokenError` (a :class:`ValueError`) saying which token and what is wrong.

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

from dataclasses import dataclass
from typing import Final, Literal

__all__ = [
    "MAX_TOKEN_LENGTH",
    "Direction",
    "RoomToken",
    "TokenError",
    "next_token",
    "order_by",
    "pagination_bounds",
]

Direction = Literal["b", "f"]
"""``/messages``' ``dir``: ``"b"`` backwards (newest first), ``"f"`` forwards (oldest first)."""

MAX_TOKEN_LENGTH: Final = 100
"""The longest token text accepted (well above the longest valid token, 41 characters)."""

_BIGINT_MIN: Final = -(2**63)
_BIGINT_MAX: Final = 2**63 - 1
_DIGITS: Final = frozenset("0123456789")


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


@dataclass(frozen=True, slots=True, order=False)
class RoomToken:
    """A position in a room's timeline, just after an event: ``s<stream>`` or ``t<topological>-<stream>``.

    ``topological`` is ``None`` for a live token. Tokens are not ordered as Python objects (a live and
    a historic token do not compare); :func:`pagination_bounds` turns them into SQL. Constructing an
    invalid token (a negative topological ordering, a negative stream ordering in a live token, a value
    outside ``BIGINT``) raises :class:`TokenError`, so every ``RoomToken`` formats to a valid token.
    """

    stream: int
    topological: int | None = None

    def __post_init__(self) -> None:
        if not _BIGINT_MIN <= self.stream <= _BIGINT_MAX:
            raise TokenError(f"room token stream ordering {self.stream} is outside the 64-bit integer range")
        if self.topological is None:
            if self.stream < 0:
                raise TokenError(f"live room token with a negative stream position ({self.stream})")
        elif not 0 <= self.topological <= _BIGINT_MAX:
            raise TokenError(f"room token topological ordering {self.topological} is negative or too large")

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
            raise TokenError(f"invalid room token {_show(text)}: multi-writer ('m') room tokens are not supported")
        raise TokenError(f"invalid room token {_show(text)}: it must start with 's' (live) or 't' (historic)")

    def __str__(self) -> str:
        if self.topological is None:
            return f"s{self.stream}"
        return f"t{self.topological}-{self.stream}"


def _check_direction(direction: str) -> None:
    if direction not in ("b", "f"):
        raise ValueError(f"pagination direction must be 'b' or 'f', not {direction!r}")


def _bound(token: RoomToken, operator: str, name: str, params: dict[str, int]) -> str:
    """``<columns> <operator> <token>``: on the pair when the token is historic, else on the stream."""
    params[f"{name}_stream"] = token.stream
    if token.topological is None:
        return f"stream_ordering {operator} %({name}_stream)s"
    params[f"{name}_topological"] = token.topological
    return f"(topological_ordering, stream_ordering) {operator} (%({name}_topological)s, %({name}_stream)s)"


def pagination_bounds(
    direction: Direction, from_token: RoomToken, to_token: RoomToken | None
) -> tuple[str, dict[str, int]]:
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

    ``to_token`` ``None``: no second bound.
    """
    _check_direction(direction)
    params: dict[str, int] = {}
    if direction == "b":
        clauses = [_bound(from_token, "<=", "from", params)]
        if to_token is not None:
            clauses.append(_bound(to_token, ">", "to", params))
    else:
        clauses = [_bound(from_token, ">", "from", params)]
        if to_token is not None:
            clauses.append(_bound(to_token, "<=", "to", params))
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
