"""Multi-writer positions in a sync token: ``MultiWriterStreamToken`` and ``RoomStreamToken``.

A stream with several writers has no single "current position": writer A may have completed 58
while writer B is still at 56. A token therefore carries a *vector clock*: ``stream``, the position
every writer has reached (the minimum), and ``instance_map``, the writers that are further ahead.
Its string form names writers by small integers from the ``instance_map`` table, so it stays short:

* ``MultiWriterStreamToken``: ``<stream>`` (e.g. ``5``) or ``m<stream>~<id>.<pos>~<id>.<pos>...``
  (e.g. ``m56~2.58~3.59``: instances 2 and 3 at 58 and 59, every other writer at 56).
* ``RoomStreamToken``: ``s<stream>`` (live), ``t<topological>-<stream>`` (a position in a room's
  history) or the same vector clock ``m...`` form. A token is never topological *and* a vector clock.

Invariant: every ``instance_map`` value is *strictly greater* than ``stream`` (``ValueError``
otherwise). An entry at or below the minimum says nothing the minimum does not already say; allowing
it made two spellings of one position possible, and writing such entries is how a real system once
produced tokens its own parser rejected. The serialiser therefore only ever writes entries above
``stream``, by increasing instance ID (and the short form when none remain).

Two parsers, for two kinds of input:

* ``from_sync_field``: a field of a client's /sync token (``StreamToken`` parses with it). It accepts
  exactly what the serialiser writes for a *sync position*, one spelling per position: every number
  a whole number from 0 to :data:`MAX_POSITION` in ASCII digits (no sign, no leading zero, no
  space); an ``m`` token lists at least one and at most :data:`MAX_WRITERS` writers, by strictly
  increasing instance ID, each known and strictly ahead of the minimum; a room field is ``s`` or
  ``m``, never ``t`` (a position in one room's history is no position of the stream: nothing can
  advance or compare it as one). Negative positions are refused: only forward streams are synced
  (``check_sync_keys``), so none of their positions is below 0. The grammar is the room token's,
  owned by :mod:`factstream.room_token`: a room field is read by ``RoomToken.parse`` itself (the
  parser the events plugin reads its ``from`` and ``to`` with), then its instance IDs become writer
  names and a historic token is refused; the ``m`` form of a multi-writer field by its writer grammar
  (``parse_writers``). One rule, one parser, for every live position a client gives.
* ``deserialize``: the lenient codec of any value of the class (negative positions of backwards
  streams, topological room tokens, the historic ``m5~`` and entries at or below the minimum, which
  it drops). Only a retired sync key's field, whose value is thrown away, is read with it.

Parsing never raises anything but :class:`TokenError`: a client's token is untrusted input and the
HTTP layer turns a ``TokenError`` into a 400 with its message.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TYPE_CHECKING, Protocol, Self, runtime_checkable

from factstream.room_token import MAX_WRITERS, RoomToken, TokenError, parse_writers

__all__ = [
    "MAX_POSITION",
    "MAX_WRITERS",
    "MultiWriterStreamToken",
    "PositionSource",
    "RoomStreamToken",
    "TokenError",
    "instance_ids_in",
    "parse_int",
    "parse_position",
    "writer_names",
]

if TYPE_CHECKING:
    from factstream.sync.instance_ids import InstanceIds

#: The largest position a token may hold: PostgreSQL ``BIGINT``.
MAX_POSITION = 2**63 - 1

_EMPTY: Mapping[str, int] = MappingProxyType({})
_INT = re.compile(r"-?[0-9]{1,19}", re.ASCII)
#: A position as the serialiser writes it: 0, or up to 19 digits without a leading zero.
_POSITION = re.compile(r"0|[1-9][0-9]{0,18}", re.ASCII)


@runtime_checkable
class PositionSource(Protocol):
    """What a token needs from a stream's ID generator (``MultiWriterIdGenerator`` fits)."""

    def get_current_token(self) -> int: ...

    def get_positions(self) -> dict[str, int]: ...


def parse_int(text: str, what: str) -> int:
    """``text`` as a BIGINT, else ``TokenError`` naming ``what``.

    Only an optional ``-`` and ASCII digits are accepted: ``int()`` alone would also take
    ``"1_000"``, ``" 7"`` and non-ASCII digits, none of which a token of ours ever contains.
    Negative values are allowed because streams written backwards (backfill) have negative IDs.
    """
    if not _INT.fullmatch(text):
        shown = repr(text) if len(text) <= 40 else repr(text[:40]) + "..."
        raise TokenError(f"{what}: expected an integer of at most 19 digits, got {shown}")
    value = int(text)
    if abs(value) > MAX_POSITION:
        raise TokenError(f"{what}: {value} is out of range")
    return value


def _shown(text: str) -> str:
    return repr(text) if len(text) <= 40 else f"{text[:40]!r}... ({len(text)} characters)"


def parse_position(text: str, what: str) -> int:
    """``text`` as a position of a sync token, else ``TokenError`` naming ``what``.

    A whole number from 0 to :data:`MAX_POSITION`, spelt as the serialiser spells it: ASCII digits,
    no sign, no leading zero (``0`` itself is the start), so that a position has one spelling and a
    value PostgreSQL's ``BIGINT`` cannot hold never gets past the parser.
    """
    if not _POSITION.fullmatch(text):
        raise TokenError(
            f"{what}: expected an integer of at most 19 digits from 0 to {MAX_POSITION}"
            f" (no sign, no leading zero), got {_shown(text)}"
        )
    value = int(text)
    if value > MAX_POSITION:
        raise TokenError(f"{what}: {value} is out of range (at most {MAX_POSITION})")
    return value


@dataclass(frozen=True, kw_only=True)
class _VectorClock:
    """The shared part of both token types: a minimum ``stream`` and the writers ahead of it."""

    stream: int
    instance_map: Mapping[str, int] = field(default_factory=lambda: _EMPTY)

    def __post_init__(self) -> None:
        if isinstance(self.stream, bool) or not isinstance(self.stream, int):
            raise TypeError(f"stream must be an int, not {self.stream!r}")
        if self.instance_map is _EMPTY:
            return
        for instance, pos in self.instance_map.items():
            if isinstance(pos, bool) or not isinstance(pos, int):
                raise TypeError(f"position of instance {instance!r} must be an int, not {pos!r}")
            if pos <= self.stream:
                raise ValueError(
                    f"position {pos} of instance {instance!r} must be strictly greater than the minimum {self.stream}"
                )
        # Frozen and order-independent: equal maps compare and hash equal whatever their insertion order.
        frozen = MappingProxyType(dict(sorted(self.instance_map.items()))) if self.instance_map else _EMPTY
        object.__setattr__(self, "instance_map", frozen)

    # -- reading -----------------------------------------------------------------------------------

    def get_max_stream_pos(self) -> int:
        """The furthest position of any writer (``stream`` when no writer is ahead)."""
        return max(self.instance_map.values(), default=self.stream)

    def get_stream_pos_for_instance(self, instance: str) -> int:
        """Where ``instance`` is in this token: its own entry, else the minimum."""
        return self.instance_map.get(instance, self.stream)

    def is_before_or_eq(self, other: _VectorClock) -> bool:
        """True when every writer's position here is at or below its position in ``other``.

        Compared per writer: ``m5~1.9`` is *not* before ``m6`` (writer 1 at 9 against 6), which a
        comparison of minimums alone would get wrong.
        """
        if self.stream > other.stream:
            return False
        instances = set(self.instance_map) | set(other.instance_map)
        return all(self.get_stream_pos_for_instance(i) <= other.get_stream_pos_for_instance(i) for i in instances)

    def _merged(self, other: _VectorClock) -> tuple[int, dict[str, int]]:
        stream = max(self.stream, other.stream)
        merged = {}
        for instance in set(self.instance_map) | set(other.instance_map):
            pos = max(self.get_stream_pos_for_instance(instance), other.get_stream_pos_for_instance(instance))
            if pos > stream:
                merged[instance] = pos
        return stream, merged

    def _bounded(self, max_stream: int) -> tuple[int, dict[str, int]]:
        stream = min(self.stream, max_stream)
        bounded = {i: min(p, max_stream) for i, p in self.instance_map.items()}
        return stream, {i: p for i, p in bounded.items() if p > stream}

    def instance_names(self) -> list[str]:
        """The writers named in the serialised form (those ahead of the minimum)."""
        return list(self.instance_map)

    def _clock_string(self, id_for: Callable[[str], int]) -> str:
        entries = sorted((id_for(name), pos) for name, pos in self.instance_map.items())
        return "m" + "~".join([str(self.stream), *(f"{i}.{p}" for i, p in entries)])


def _parse_clock(text: str, what: str, name_for: Callable[[int], str]) -> tuple[int, dict[str, int]]:
    """Parse ``m<stream>~<id>.<pos>...`` (``text`` without the leading ``m``)."""
    pieces = text.split("~")
    if len(pieces) > 1 and pieces[-1] == "":
        pieces.pop()  # the historic "m5~": a trailing separator with nothing after it
    stream = parse_int(pieces[0], f"{what}: minimum position")
    if len(pieces) - 1 > MAX_WRITERS:
        raise TokenError(f"{what}: more than {MAX_WRITERS} writers")
    positions: dict[str, int] = {}
    seen: set[int] = set()
    for piece in pieces[1:]:
        instance_text, dot, pos_text = piece.partition(".")
        if not dot:
            raise TokenError(f"{what}: expected '<instance id>.<position>', got {piece[:40]!r}")
        instance_id = parse_int(instance_text, f"{what}: instance id")
        pos = parse_int(pos_text, f"{what}: position of instance {instance_id}")
        if instance_id in seen:
            raise TokenError(f"{what}: instance id {instance_id} appears twice")
        seen.add(instance_id)
        try:
            name = name_for(instance_id)
        except LookupError:
            raise TokenError(f"{what}: unknown instance id {instance_id}") from None
        if pos > stream:  # an entry at or below the minimum carries nothing: drop it, do not fail
            positions[name] = pos
    return stream, positions


def _parse_sync_clock(text: str, what: str, name_for: Callable[[int], str], short: str) -> tuple[int, dict[str, int]]:
    """Parse ``m<stream>~<id>.<pos>...`` (``text`` without the ``m``) strictly, by the room token's rule
    (:func:`factstream.room_token.parse_writers`); ``short`` is the form to write when no writer is
    ahead (``<stream>`` or ``s<stream>``)."""
    stream, writers = parse_writers(what, text, short=short)
    return stream, _named(writers, what, name_for)


def _named(writers: Iterable[tuple[int, int]], what: str, name_for: Callable[[int], str]) -> dict[str, int]:
    """``(instance ID, position)`` entries by writer name; an ID that no instance has is a ``TokenError``."""
    positions: dict[str, int] = {}
    for instance_id, pos in writers:
        try:
            positions[name_for(instance_id)] = pos
        except LookupError:
            raise TokenError(f"{what}: unknown instance id {instance_id}") from None
    return positions


def instance_ids_in(text: str) -> list[int]:
    """The instance IDs a token string mentions (empty if it has none or is malformed).

    Lets an async resolver fetch every name a string needs before the synchronous parser runs.
    """
    found: dict[int, None] = {}
    for part in text.split("_"):
        if part.startswith("m"):
            for piece in part[1:].split("~")[1 : MAX_WRITERS + 1]:
                head = piece.partition(".")[0]
                if _INT.fullmatch(head) and abs(int(head)) <= MAX_POSITION:
                    found[int(head)] = None
    return list(found)


@dataclass(frozen=True, kw_only=True)
class MultiWriterStreamToken(_VectorClock):
    """A position in a stream with several writers: ``<stream>`` or ``m<stream>~<id>.<pos>...``.

    Frozen and hashable; ``instance_map`` maps writer *names* to positions (IDs appear only in
    the string form).
    """

    def __hash__(self) -> int:
        return hash((MultiWriterStreamToken, self.stream, tuple(self.instance_map.items())))

    @classmethod
    def from_generator(cls, gen: PositionSource) -> Self:
        """This process's current position of the stream ``gen`` generates IDs for.

        ``stream`` is the watermark (every writer is at least there) and only writers strictly
        ahead of it are listed, so the invariant holds by construction.
        """
        stream = gen.get_current_token()
        return cls(stream=stream, instance_map={i: p for i, p in gen.get_positions().items() if p > stream})

    def copy_and_advance(self, other: MultiWriterStreamToken) -> MultiWriterStreamToken:
        """The per-writer maximum of both tokens (a merge: never moves any writer backwards)."""
        stream, merged = self._merged(other)
        return MultiWriterStreamToken(stream=stream, instance_map=merged)

    def bound_stream_token(self, max_stream: int) -> MultiWriterStreamToken:
        """This token with every position clamped to ``max_stream``."""
        stream, bounded = self._bounded(max_stream)
        return MultiWriterStreamToken(stream=stream, instance_map=bounded)

    @classmethod
    def is_stream_position_in_range(
        cls, low: _VectorClock | None, high: _VectorClock | None, instance: str, pos: int
    ) -> bool:
        """Whether a fact written by ``instance`` at ``pos`` lies in ``(low, high]`` for that writer.

        ``None`` leaves that side open. This is how a sync handler decides whether a row read from
        the database falls between the client's token and the current one.
        """
        if low is not None and pos <= low.get_stream_pos_for_instance(instance):
            return False
        return high is None or pos <= high.get_stream_pos_for_instance(instance)

    def serialize(self, id_for: Callable[[str], int]) -> str:
        """The string form, naming writers through ``id_for`` (a synchronous name -> ID lookup)."""
        return self._clock_string(id_for) if self.instance_map else str(self.stream)

    @classmethod
    def deserialize(cls, text: str, name_for: Callable[[int], str], *, what: str = "token") -> Self:
        """Parse the string form leniently (any value of the class; see the module docstring);
        ``name_for`` maps IDs to names (``LookupError`` if unknown). A client's sync token is read
        with :meth:`from_sync_field` instead.

        Raises ``TokenError`` (and nothing else) for any malformed input; ``what`` names the field
        in the message.
        """
        if text.startswith("m"):
            stream, positions = _parse_clock(text[1:], what, name_for)
            return cls(stream=stream, instance_map=positions)
        return cls(stream=parse_int(text, what))

    @classmethod
    def from_sync_field(cls, text: str, name_for: Callable[[int], str], *, what: str = "token") -> Self:
        """Parse a field of a client's sync token: ``<stream>`` or ``m<stream>~<id>.<pos>...``, strictly
        (the rule of the module docstring); raises only ``TokenError``, naming ``what``."""
        if text.startswith("m"):
            stream, positions = _parse_sync_clock(text[1:], what, name_for, "<stream>")
            return cls(stream=stream, instance_map=positions)
        return cls(stream=parse_position(text, what))

    async def to_string(self, ids: InstanceIds) -> str:
        """The string form, resolving (and if needed recording) writer IDs through ``ids``."""
        return self.serialize(await ids.id_lookup(self.instance_names()))

    @classmethod
    async def parse(cls, text: str, ids: InstanceIds, *, what: str = "token") -> Self:
        """Parse the string form, resolving writer IDs through ``ids``; raises only ``TokenError``."""
        return cls.deserialize(text, await ids.name_lookup(instance_ids_in(text)), what=what)


@dataclass(frozen=True, kw_only=True)
class RoomStreamToken(_VectorClock):
    """A position in a room-style stream: ``s<stream>``, ``t<topological>-<stream>`` or ``m...``.

    ``topological`` is set for a position inside one room's history (its depth): such a token
    cannot also carry an ``instance_map`` (``ValueError``), because a historic position belongs to
    one ordering, not to the live vector clock.
    """

    topological: int | None = None

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.topological is not None:
            if isinstance(self.topological, bool) or not isinstance(self.topological, int):
                raise TypeError(f"topological must be an int or None, not {self.topological!r}")
            if self.topological < 0:
                raise ValueError(f"topological position {self.topological} must not be negative")
            if self.instance_map:
                raise ValueError("a room token cannot have both a topological part and an instance map")

    def __hash__(self) -> int:
        return hash((RoomStreamToken, self.topological, self.stream, tuple(self.instance_map.items())))

    @classmethod
    def from_generator(cls, gen: PositionSource) -> Self:
        """The live position of the stream ``gen`` generates IDs for (see MultiWriterStreamToken)."""
        stream = gen.get_current_token()
        return cls(stream=stream, instance_map={i: p for i, p in gen.get_positions().items() if p > stream})

    def is_before_or_eq(self, other: _VectorClock) -> bool:
        """Topological tokens compare as ``(topological, stream)``; otherwise per writer."""
        if isinstance(other, RoomStreamToken) and self.topological is not None and other.topological is not None:
            return (self.topological, self.stream) <= (other.topological, other.stream)
        return super().is_before_or_eq(other)

    def copy_and_advance(self, other: RoomStreamToken) -> RoomStreamToken:
        """The per-writer maximum of two live tokens; topological tokens cannot be merged (ValueError)."""
        if self.topological is not None or other.topological is not None:
            raise ValueError("cannot advance a topological room token")
        stream, merged = self._merged(other)
        return RoomStreamToken(stream=stream, instance_map=merged)

    def bound_stream_token(self, max_stream: int) -> RoomStreamToken:
        """This token with every stream position clamped to ``max_stream`` (topological part kept)."""
        stream, bounded = self._bounded(max_stream)
        return RoomStreamToken(stream=stream, instance_map=bounded, topological=self.topological)

    def serialize(self, id_for: Callable[[str], int]) -> str:
        """``t<topo>-<stream>``, ``m<stream>~...`` or ``s<stream>`` (see the module docstring)."""
        if self.topological is not None:
            return f"t{self.topological}-{self.stream}"
        return self._clock_string(id_for) if self.instance_map else f"s{self.stream}"

    @classmethod
    def deserialize(cls, text: str, name_for: Callable[[int], str], *, what: str = "room token") -> Self:
        """Parse the string form leniently (any value of the class, ``t`` included; see the module
        docstring); raises only ``TokenError``, naming ``what``. A client's sync token is read with
        :meth:`from_sync_field` instead."""
        head, rest = text[:1], text[1:]
        if head == "s":
            return cls(stream=parse_int(rest, what))
        if head == "t":
            topo_text, dash, stream_text = rest.partition("-")
            if not dash:
                raise TokenError(f"{what}: expected 't<topological>-<stream>', got {text[:40]!r}")
            topological = parse_int(topo_text, f"{what}: topological position")
            return cls(topological=topological, stream=parse_int(stream_text, f"{what}: stream position"))
        if head == "m":
            stream, positions = _parse_clock(rest, what, name_for)
            return cls(stream=stream, instance_map=positions)
        expected = "'s<stream>', 't<topological>-<stream>' or 'm<stream>~...'"
        raise TokenError(f"{what}: expected {expected}, got {text[:40]!r}")

    @classmethod
    def from_sync_field(cls, text: str, name_for: Callable[[int], str], *, what: str = "room token") -> Self:
        """Parse the room field of a client's sync token: ``s<stream>`` or ``m<stream>~<id>.<pos>...``,
        strictly (the rule of the module docstring); raises only ``TokenError``, naming ``what``.

        A ``t`` token is refused: it is a position in one room's history (``/messages``), not in the
        stream, and a sync token holding one could be neither compared nor advanced.
        """
        try:
            token = RoomToken.parse(text)
        except TokenError as exc:
            raise TokenError(f"{what}: {exc}") from None
        if not token.live:
            raise TokenError(
                f"{what}: a topological room token {_shown(text)} is not a sync position;"
                " give the next_batch of a /sync"
            )
        return cls(stream=token.stream, instance_map=_named(token.writers, what, name_for))

    async def to_string(self, ids: InstanceIds) -> str:
        """The string form, resolving (and if needed recording) writer IDs through ``ids``."""
        return self.serialize(await ids.id_lookup(self.instance_names()))

    @classmethod
    async def parse(cls, text: str, ids: InstanceIds, *, what: str = "room token") -> Self:
        """Parse the string form, resolving writer IDs through ``ids``; raises only ``TokenError``."""
        return cls.deserialize(text, await ids.name_lookup(instance_ids_in(text)), what=what)


def writer_names(values: Iterable[object]) -> list[str]:
    """Every writer name mentioned by the multi-writer values among ``values``."""
    names: list[str] = []
    for value in values:
        if isinstance(value, _VectorClock):
            names.extend(value.instance_names())
    return names
