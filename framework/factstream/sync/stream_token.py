"""``StreamToken``: one position in every synced stream, and ``bound_future_token``.

A client's /sync token says, for every sync key, how far it has seen. Its string form is the fields
in :class:`~factstream.sync.layout.SyncKeyLayout` order joined by ``_``:

* missing trailing fields parse as ``0`` (:meth:`StreamToken.start`): a token minted before a key
  was appended to the layout is still valid and means "nothing seen yet" for the new stream;
* more fields than the layout has is an error (the token is from another deployment or forged);
* every field is parsed by its key's kind, strictly: a field holds a *sync position*, spelt as the
  serialiser spells it (``from_sync_field`` in :mod:`factstream.sync.tokens`: whole numbers from 0
  to ``2**63 - 1`` without sign or leading zero; an ``m`` form lists known writers by increasing
  ID, each ahead of the minimum; a room field is ``s`` or ``m``, never a topological ``t``), so
  that no value a stream could not have reached (negative, beyond ``BIGINT``, a position in one
  room's history) gets into the sync service; a retired field is only checked for a shape its key
  once had and thrown away;
* a malformed field raises :class:`~factstream.sync.tokens.TokenError` naming the field, and
  nothing else is ever raised.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from factstream.sync.layout import SyncKey, SyncKeyKind, SyncKeyLayout
from factstream.sync.tokens import (
    MultiWriterStreamToken,
    PositionSource,
    RoomStreamToken,
    TokenError,
    instance_ids_in,
    parse_position,
    writer_names,
)

if TYPE_CHECKING:
    from factstream.sync.instance_ids import InstanceIds

log = logging.getLogger(__name__)

#: The value of one field: an int, or a multi-writer token for ``MULTI_WRITER``/``ROOM`` keys.
TokenValue = int | MultiWriterStreamToken | RoomStreamToken

#: The longest token string accepted (a field is at most a few hundred characters).
MAX_TOKEN_LENGTH = 16_384

_ZERO_MULTI = MultiWriterStreamToken(stream=0)
_ZERO_ROOM = RoomStreamToken(stream=0)


def zero_value(key: SyncKey) -> TokenValue:
    """The start position of a field of this kind."""
    if key.kind is SyncKeyKind.MULTI_WRITER:
        return _ZERO_MULTI
    if key.kind is SyncKeyKind.ROOM:
        return _ZERO_ROOM
    return 0


def _coerce(key: SyncKey, value: TokenValue) -> TokenValue:
    """``value`` in the form ``key``'s kind uses; an int is accepted for any kind (the minimum)."""
    if key.kind is SyncKeyKind.MULTI_WRITER:
        if isinstance(value, MultiWriterStreamToken):
            return value
        if isinstance(value, int) and not isinstance(value, bool):
            return MultiWriterStreamToken(stream=value)
    elif key.kind is SyncKeyKind.ROOM:
        if isinstance(value, RoomStreamToken):
            return value
        if isinstance(value, int) and not isinstance(value, bool):
            return RoomStreamToken(stream=value)
    elif key.kind is SyncKeyKind.INT:
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    else:
        return 0
    raise TypeError(f"sync key {key.name!r} ({key.kind.value}) cannot hold {value!r}")


def _value_le(a: TokenValue, b: TokenValue) -> bool:
    if isinstance(a, int) and isinstance(b, int):
        return a <= b
    if isinstance(a, int):
        a = MultiWriterStreamToken(stream=a)
    if isinstance(b, int):
        b = MultiWriterStreamToken(stream=b)
    return a.is_before_or_eq(b)


def _max_pos(value: TokenValue) -> int:
    return value if isinstance(value, int) else value.get_max_stream_pos()


@dataclass(frozen=True)
class StreamToken:
    """A position in every stream of a :class:`SyncKeyLayout`: ``values[i]`` belongs to ``layout.keys[i]``.

    Frozen and hashable. Build with :meth:`start`, :meth:`of`, :meth:`parse`/:meth:`deserialize`
    or :func:`current_token_source`; derive new tokens with :meth:`copy_and_advance`.
    """

    layout: SyncKeyLayout
    values: tuple[TokenValue, ...]

    def __post_init__(self) -> None:
        values = tuple(self.values)
        if len(values) != len(self.layout):
            raise ValueError(f"a token of this layout has {len(self.layout)} fields, not {len(values)}")
        object.__setattr__(self, "values", tuple(_coerce(k, v) for k, v in zip(self.layout, values, strict=True)))

    @classmethod
    def start(cls, layout: SyncKeyLayout) -> StreamToken:
        """The token before everything: every field 0."""
        return cls(layout, tuple(zero_value(k) for k in layout))

    @classmethod
    def of(cls, layout: SyncKeyLayout, values: Mapping[str, TokenValue]) -> StreamToken:
        """A token with the given fields (by key name); the others are 0. Unknown names: ``KeyError``."""
        for name in values:
            layout.index(name)
        return cls(layout, tuple(values.get(k.name, zero_value(k)) for k in layout))

    # -- reading -----------------------------------------------------------------------------------

    def get(self, key: str) -> TokenValue:
        """The value of field ``key`` (``KeyError`` if the layout has no such key)."""
        return self.values[self.layout.index(key)]

    def items(self) -> Iterator[tuple[SyncKey, TokenValue]]:
        """``(key, value)`` for every field, in token order."""
        return zip(self.layout.keys, self.values, strict=True)

    def is_before_or_eq(self, other: StreamToken) -> bool:
        """True when every comparable field is at or before ``other``'s (multi-writer: per writer).

        Keys declared not ``comparable`` (streams that can reset) and retired keys are skipped.
        Tokens of different layouts cannot be compared (``ValueError``).
        """
        self._check_layout(other)
        return all(
            _value_le(a, b) for k, a, b in zip(self.layout, self.values, other.values, strict=True) if k.comparable
        )

    def copy_and_advance(self, key: str, value: TokenValue) -> StreamToken:
        """This token with field ``key`` moved forward to ``value``; never moves anything back.

        An ``INT`` field is replaced only if ``value`` is larger; a multi-writer field is merged
        (per-writer maximum). Advancing a retired key is a ``KeyError``: nothing provides it.
        """
        index = self.layout.index(key)
        spec = self.layout.keys[index]
        if spec.kind is SyncKeyKind.RETIRED:
            raise KeyError(f"sync key {key!r} is retired: no installed plugin provides it")
        new = _coerce(spec, value)
        old = self.values[index]
        if isinstance(old, MultiWriterStreamToken) and isinstance(new, MultiWriterStreamToken):
            merged: TokenValue = old.copy_and_advance(new)
        elif isinstance(old, RoomStreamToken) and isinstance(new, RoomStreamToken):
            merged = old.copy_and_advance(new)
        else:
            assert isinstance(old, int) and isinstance(new, int)
            merged = max(old, new)
        if merged == old:
            return self
        return StreamToken(self.layout, (*self.values[:index], merged, *self.values[index + 1 :]))

    def replace(self, key: str, value: TokenValue) -> StreamToken:
        """This token with field ``key`` set to ``value``, forward or back (for bounding and tests)."""
        index = self.layout.index(key)
        return StreamToken(self.layout, (*self.values[:index], value, *self.values[index + 1 :]))

    def _check_layout(self, other: StreamToken) -> None:
        if other.layout is not self.layout and other.layout != self.layout:
            raise ValueError("cannot compare tokens of two different sync key layouts")

    # -- string form -------------------------------------------------------------------------------

    def serialize(self, id_for: Callable[[str], int]) -> str:
        """The string form; ``id_for`` maps writer names to instance IDs (synchronously)."""
        parts = []
        for key, value in self.items():
            if isinstance(value, int):
                parts.append(str(value))
            elif key.kind is SyncKeyKind.RETIRED:
                parts.append("0")
            else:
                parts.append(value.serialize(id_for))
        return "_".join(parts)

    async def to_string(self, ids: InstanceIds) -> str:
        """The string form, resolving (and if needed recording) writer IDs through ``ids``."""
        return self.serialize(await ids.id_lookup(writer_names(self.values)))

    @classmethod
    def deserialize(cls, text: str, layout: SyncKeyLayout, name_for: Callable[[int], str]) -> StreamToken:
        """Parse the string form (see the module docstring); raises only :class:`TokenError`.

        ``name_for`` maps instance IDs to names and raises ``LookupError`` for an unknown ID.
        """
        pieces = _split(text, layout)
        values: list[TokenValue] = []
        for position, key in enumerate(layout):
            piece = pieces[position] if position < len(pieces) else None
            values.append(_parse_field(piece, key, position, name_for))
        return cls(layout, tuple(values))

    @classmethod
    async def parse(cls, text: str, layout: SyncKeyLayout, ids: InstanceIds) -> StreamToken:
        """Parse the string form, resolving writer IDs through ``ids``; raises only :class:`TokenError`."""
        _split(text, layout)  # reject oversized input before touching the database
        return cls.deserialize(text, layout, await ids.name_lookup(instance_ids_in(text)))


def _split(text: str, layout: SyncKeyLayout) -> list[str]:
    if not isinstance(text, str):
        raise TokenError(f"a token must be a string, not {type(text).__name__}")
    if not text:
        raise TokenError("the token is empty")
    if len(text) > MAX_TOKEN_LENGTH:
        raise TokenError(f"the token is longer than {MAX_TOKEN_LENGTH} characters")
    pieces = text.split("_")
    if len(pieces) > len(layout):
        raise TokenError(f"the token has {len(pieces)} fields; this server knows only {len(layout)}")
    return pieces


def _parse_field(piece: str | None, key: SyncKey, position: int, name_for: Callable[[int], str]) -> TokenValue:
    if piece is None:
        return zero_value(key)  # a shorter token from before this key existed
    what = f"field {position + 1} ({key.name})"
    if not piece:
        raise TokenError(f"{what}: is empty")
    if key.kind is SyncKeyKind.ROOM:
        return RoomStreamToken.from_sync_field(piece, name_for, what=what)
    if key.kind is SyncKeyKind.MULTI_WRITER:
        return MultiWriterStreamToken.from_sync_field(piece, name_for, what=what)
    if key.kind is SyncKeyKind.INT:
        if piece.startswith("m"):
            # The stream had several writers when this token was minted and has one now: its
            # minimum is a position every writer had reached, so resuming from it skips nothing.
            return MultiWriterStreamToken.from_sync_field(piece, name_for, what=what).stream
        return parse_position(piece, what)
    # A retired key: accept whatever form it had, keep nothing (the value never reaches a stream).
    if piece[:1] in ("s", "t"):
        RoomStreamToken.deserialize(piece, lambda _id: str(_id), what=what)
    else:
        MultiWriterStreamToken.deserialize(piece, lambda _id: str(_id), what=what)
    return 0


# -- the current token and tokens from the future -------------------------------------------------------


def current_token_source(
    layout: SyncKeyLayout, sources: Mapping[str, PositionSource | Callable[[], TokenValue]]
) -> Callable[[], StreamToken]:
    """A function returning this process's current token, for :class:`~factstream.sync.notifier.Notifier`.

    ``sources`` maps every active key to its stream's ID generator (``MultiWriterIdGenerator``:
    multi-writer fields come from ``from_generator``, ``INT`` fields from ``get_current_token()``) or
    to a plain callable returning an int. A missing active key is a ``KeyError`` now, not a token
    silently stuck at 0 later: every field a client holds must follow a live stream.
    """
    missing = [k.name for k in layout.active_keys if k.name not in sources]
    if missing:
        raise KeyError(f"no position source for sync key(s) {', '.join(missing)}")

    def read(key: SyncKey) -> Callable[[], TokenValue]:
        source = sources.get(key.name)
        if source is None:
            return lambda: 0
        if not isinstance(source, PositionSource):
            return source
        gen = source
        if key.kind is SyncKeyKind.MULTI_WRITER:
            return lambda: MultiWriterStreamToken.from_generator(gen)
        if key.kind is SyncKeyKind.ROOM:
            return lambda: RoomStreamToken.from_generator(gen)
        return gen.get_current_token

    readers = [read(k) for k in layout]

    def current() -> StreamToken:
        return StreamToken(layout, tuple(r() for r in readers))

    return current


async def bound_future_token(
    token: StreamToken, current: StreamToken, max_allocated: Mapping[str, Callable[[], Awaitable[int]]]
) -> StreamToken:
    """``token`` with every field that is ahead of anything ever allocated clamped to the allocation.

    A field ahead of ``current`` is usually fine: the client was served by a process that had seen
    more, and the caller should wait for this process to catch up (``Notifier.wait_for_stream_token``).
    But a field ahead of the stream's *highest allocated ID* can never be reached (a tampered token,
    or one minted by a version that advanced a stream without persisting), and waiting for it would
    hang every /sync of that client. Such fields are clamped and logged as a warning
    ("Bounding token from the future").

    ``max_allocated`` maps each key to an async function returning the stream's highest allocated ID
    (``MultiWriterIdGenerator.get_max_allocated_token`` fits); it is called only for fields ahead of
    ``current``, so the common case touches no database. A field ahead of ``current`` whose key has
    no entry is a ``KeyError``. Keys that are not ``comparable`` (they can reset) are left alone.
    """
    token._check_layout(current)
    bounded = token
    for key, value, now in zip(token.layout, token.values, current.values, strict=True):
        if not key.comparable or key.kind is SyncKeyKind.RETIRED or _value_le(value, now):
            continue
        source = max_allocated.get(key.name)
        if source is None:
            raise KeyError(f"no max-allocated source for sync key {key.name!r}")
        ceiling = await source()
        if _max_pos(value) <= ceiling:
            continue
        log.warning("Bounding token from the future: sync key %s at %s, max allocated %s", key.name, value, ceiling)
        clamped: TokenValue = min(value, ceiling) if isinstance(value, int) else value.bound_stream_token(ceiling)
        bounded = bounded.replace(key.name, clamped)
    return bounded
