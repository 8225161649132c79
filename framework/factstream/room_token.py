"""The room token's one grammar: ``s<stream>``, ``t<topological>-<stream>`` and ``m<stream>~<id>.<pos>...``.

A room token names a position in a room's timeline, just after one event (the reference's
``RoomStreamToken``). Three forms:

* ``s<stream>``, *live*: after the event of stream ordering ``<stream>`` (never negative).
* ``t<topo>-<stream>``, *historic*: after the event at ``(topological_ordering, stream_ordering)``;
  ``<topo>`` (a depth) is never negative, ``<stream>`` may be (backfilled events: ``t5--3``).
* ``m<stream>~<id>.<pos>~<id>.<pos>...``, *live, per writer*: every writer of the stream at
  ``<stream>`` except those listed, each by its instance ID at its own position.

Every token has exactly one spelling, and ``str(RoomToken.parse(x)) == x`` for every ``x`` accepted:
numbers are ASCII digits with a leading ``-`` only where a negative value is allowed, without ``+``,
leading zeros, ``-0``, whitespace or any other character, each within PostgreSQL's ``BIGINT``; at most
:data:`MAX_ROOM_TOKEN_LENGTH` characters; an ``m`` token lists at least one and at most
:data:`MAX_WRITERS` writers, by strictly increasing instance ID, each strictly ahead of the minimum.
Anything else raises :class:`TokenError` saying which token and what is wrong.

This module owns the grammar: the events plugin's routes read ``from``, ``to`` and the rest with
:meth:`RoomToken.parse`, and the core reads the ``room_key`` field of a client's ``/sync`` token with it
too (``factstream.sync.tokens.RoomStreamToken.from_sync_field``, which then turns instance IDs into
writer names and refuses a historic token, no position of the stream). The ``m`` form of a multi-writer
field of a ``/sync`` token is read by the same rule (:func:`parse_writers`). Parsing needs no database:
an instance ID that no instance has is refused where IDs meet names.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Final

from factstream.errors import FactstreamError

__all__ = ["MAX_ROOM_TOKEN_LENGTH", "MAX_WRITERS", "RoomToken", "TokenError", "parse_writers"]

MAX_WRITERS: Final = 64
"""The most writers an ``m`` token (or an ``m`` field of a ``/sync`` token) lists."""

MAX_ROOM_TOKEN_LENGTH: Final = 1 + 19 + MAX_WRITERS * (1 + 19 + 1 + 19)
"""The longest room token accepted: an ``m`` token of :data:`MAX_WRITERS` writers, every number at
19 digits (a one-writer token is at most 41 characters)."""

BIGINT_MIN: Final = -(2**63)
BIGINT_MAX: Final = 2**63 - 1
_DIGITS: Final = frozenset("0123456789")


class TokenError(FactstreamError, ValueError):
    """A token (or one field of a ``/sync`` token) is malformed; the message says which and why.

    Raised for untrusted input: the HTTP layer answers it with ``400``. A ``ValueError`` too, so that
    code validating values catches it with the rest.
    """


def shown(text: str) -> str:
    """A token as quoted in an error message (escaped; cut short if long)."""
    if len(text) > 40:
        return f"{text[:40]!r}... ({len(text)} characters)"
    return repr(text)


def parse_number(label: str, part: str, what: str, *, allow_negative: bool) -> int:
    """One number of a token, strictly (module docstring); errors start with ``label``."""
    digits = part[1:] if part.startswith("-") else part
    if not part:
        raise TokenError(f"{label}: the {what} is empty")
    if part.startswith("-") and not allow_negative:
        raise TokenError(f"{label}: the {what} is negative")
    if not digits:
        raise TokenError(f"{label}: the {what} has a '-' but no digits")
    bad = next((c for c in digits if c not in _DIGITS), None)
    if bad is not None:
        raise TokenError(f"{label}: the {what} has a character other than digits ({bad!r})")
    if len(digits) > 1 and digits[0] == "0":
        raise TokenError(f"{label}: the {what} has a leading zero")
    if part == "-0":
        raise TokenError(f"{label}: the {what} is '-0' (write 0)")
    value = int(part)
    if not BIGINT_MIN <= value <= BIGINT_MAX:
        raise TokenError(f"{label}: the {what} is outside the 64-bit integer range")
    return value


def parse_writers(label: str, body: str, *, short: str = "s<stream>") -> tuple[int, tuple[tuple[int, int], ...]]:
    """The minimum and the ``(instance ID, position)`` entries of an ``m`` form's ``body`` (the text
    after the ``m``); errors start with ``label``. ``short``: the form to write when no writer is ahead."""
    minimum_text, *entries = body.split("~", MAX_WRITERS + 1)
    minimum = parse_number(label, minimum_text, "minimum stream position", allow_negative=False)
    if not entries or entries == [""]:
        raise TokenError(
            f"{label}: an 'm' token lists at least one writer ('m<stream>~<id>.<pos>'): with none, write '{short}'"
        )
    if len(entries) > MAX_WRITERS:
        raise TokenError(f"{label}: more than {MAX_WRITERS} writers")
    writers: list[tuple[int, int]] = []
    for n, entry in enumerate(entries, 1):
        id_text, dot, position_text = entry.partition(".")
        if not dot:
            raise TokenError(f"{label}: writer {n} is not '<instance id>.<position>'")
        instance = parse_number(label, id_text, f"instance ID of writer {n}", allow_negative=False)
        position = parse_number(label, position_text, f"position of writer {n}", allow_negative=False)
        if writers and instance <= writers[-1][0]:
            raise TokenError(
                f"{label}: writer {n}'s instance ID {instance} does not follow"
                f" {writers[-1][0]} (the writers are listed once each, by increasing ID)"
            )
        if position <= minimum:
            raise TokenError(
                f"{label}: writer {n} (instance {instance}) is at {position}, not ahead"
                f" of the minimum {minimum} (a writer at the minimum is not listed)"
            )
        writers.append((instance, position))
    return minimum, tuple(writers)


@dataclass(frozen=True, slots=True, order=False)
class RoomToken:
    """A position in a room's timeline, just after an event: ``s<stream>``, ``t<topological>-<stream>``
    or ``m<stream>~<id>.<pos>...`` (module docstring).

    ``topological`` is ``None`` for a live token; ``writers`` (``(instance ID, position)`` pairs, by
    increasing ID, each ahead of ``stream``) is empty unless the token is ``m``, where ``stream`` is
    the minimum. Tokens are not ordered as Python objects (a live and a historic token do not
    compare). Constructing an invalid token (a negative topological ordering, a negative stream
    ordering in a live token, a value outside ``BIGINT``, a historic token with writers, writers out of
    order or not ahead) raises :class:`TokenError`, so every ``RoomToken`` formats to a valid token.
    """

    stream: int
    topological: int | None = None
    writers: tuple[tuple[int, int], ...] = ()

    def __post_init__(self) -> None:
        if not BIGINT_MIN <= self.stream <= BIGINT_MAX:
            raise TokenError(f"room token stream ordering {self.stream} is outside the 64-bit integer range")
        if self.topological is None:
            if self.stream < 0:
                raise TokenError(f"live room token with a negative stream position ({self.stream})")
        elif not 0 <= self.topological <= BIGINT_MAX:
            raise TokenError(f"room token topological ordering {self.topological} is negative or too large")
        if not self.writers:
            return
        if self.topological is not None:
            raise TokenError("a historic (t) room token has no per-writer positions")
        if len(self.writers) > MAX_WRITERS:
            raise TokenError(f"room token with more than {MAX_WRITERS} writers")
        previous = -1
        for instance, position in self.writers:
            if not previous < instance <= BIGINT_MAX:
                raise TokenError(f"room token writers must have increasing instance IDs of 0 or more: {self.writers}")
            if not self.stream < position <= BIGINT_MAX:
                raise TokenError(f"room token writer {instance} at {position}: not ahead of the minimum {self.stream}")
            previous = instance

    @classmethod
    def parse(cls, text: str) -> RoomToken:
        """The token ``text`` denotes; :class:`TokenError` if it is not a valid room token."""
        if not isinstance(text, str):
            raise TokenError(f"invalid room token {text!r}: not a string")
        if not text:
            raise TokenError("invalid room token '': empty")
        label = f"invalid room token {shown(text)}"
        if len(text) > MAX_ROOM_TOKEN_LENGTH:
            raise TokenError(f"{label}: longer than {MAX_ROOM_TOKEN_LENGTH} characters")
        prefix, body = text[0], text[1:]
        if prefix == "s":
            return cls(stream=parse_number(label, body, "stream position", allow_negative=False))
        if prefix == "t":
            if body.startswith("-"):
                raise TokenError(f"{label}: the topological ordering is negative")
            topological, separator, stream = body.partition("-")
            if not separator:
                raise TokenError(f"{label}: a 't' token needs '-' between its topological and stream orderings")
            return cls(
                topological=parse_number(label, topological, "topological ordering", allow_negative=False),
                stream=parse_number(label, stream, "stream ordering", allow_negative=True),
            )
        if prefix == "m":
            minimum, writers = parse_writers(label, body)
            return cls(stream=minimum, writers=writers)
        raise TokenError(f"{label}: it must start with 's' (live) or 't' (historic), or 'm' (live, per writer)")

    @classmethod
    def of_writers(cls, minimum: int, ahead: Mapping[int, int]) -> RoomToken:
        """The live token where every writer is at ``minimum`` except those of ``ahead`` (instance ID ->
        position; those at or below the minimum are left out): ``s<stream>`` when none is ahead."""
        return cls(stream=minimum, writers=tuple(sorted((i, p) for i, p in ahead.items() if p > minimum)))

    @property
    def live(self) -> bool:
        """Whether the token is live (``s`` or ``m``: compared on stream orderings, per writer)."""
        return self.topological is None

    def by_name(self, names: Mapping[int, str]) -> dict[str, int]:
        """The positions of the writers a live token lists, by name (``names``: instance ID -> name); a
        writer whose ID no instance has raises :class:`TokenError`: a token this deployment never wrote."""
        if self.topological is not None:
            raise ValueError(f"a historic room token ({self}) has no per-writer positions")
        ahead: dict[str, int] = {}
        for instance, position in self.writers:
            name = names.get(instance)
            if name is None:
                raise TokenError(f"invalid room token {shown(str(self))}: no writer has instance ID {instance}")
            ahead[name] = position
        return ahead

    def __str__(self) -> str:
        if self.topological is not None:
            return f"t{self.topological}-{self.stream}"
        if self.writers:
            return "m" + "~".join([str(self.stream), *(f"{i}.{p}" for i, p in self.writers)])
        return f"s{self.stream}"
