"""The fields of a sync token and their order: ``SyncKey`` and ``SyncKeyLayout``.

A ``StreamToken`` string is its fields joined by ``_`` with no names (``5_m3~1.4_0``), so the
*position* of a field is what says which stream it follows. That position must not change while
clients hold tokens: not across a restart, not when a plugin is installed, not when one is removed.
So the order is recorded in the ``sync_token_keys`` table: a key that is recorded keeps its position
forever; a new key is appended after every recorded one; a recorded key whose plugin is gone keeps
its slot as a *retired* field, serialised as ``0`` and ignored when parsed.

Each key has a kind, which decides the form of its field:

* ``INT``: a plain stream position (a stream with one writer).
* ``MULTI_WRITER``: a :class:`~factstream.sync.tokens.MultiWriterStreamToken` (a stream with more
  than one writer, or ``writers="any"``).
* ``ROOM``: a :class:`~factstream.sync.tokens.RoomStreamToken` (a room-style stream whose positions
  may also be topological).
* ``RETIRED``: a recorded key nothing provides any more.

A key may also be declared not ``comparable``: its stream can reset (as typing notifications do),
so :meth:`StreamToken.is_before_or_eq` and ``bound_future_token`` skip it.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from factstream.db.database import Database
    from factstream.plugin.streams import StreamSpec


class SyncKeyKind(enum.Enum):
    """The form of one token field (see the module docstring)."""

    INT = "int"
    MULTI_WRITER = "multi_writer"
    ROOM = "room"
    RETIRED = "retired"


@dataclass(frozen=True)
class SyncKey:
    """One field of the sync token: its key name, its kind, and whether it is ordered."""

    name: str
    kind: SyncKeyKind = SyncKeyKind.INT
    comparable: bool = True

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name:
            raise ValueError(f"a sync key needs a non-empty name, not {self.name!r}")
        if not isinstance(self.kind, SyncKeyKind):
            raise ValueError(f"sync key {self.name!r}: kind must be a SyncKeyKind, not {self.kind!r}")


@dataclass(frozen=True)
class SyncKeyLayout:
    """The token's fields in their fixed order. Build with :meth:`load` (a host) or :meth:`of` (tests).

    Immutable: a process uses one layout for its lifetime. Two layouts are equal when their keys
    are, so tokens from layouts loaded by different processes (or restarts) compare equal.
    """

    keys: tuple[SyncKey, ...]
    _index: dict[str, int] = field(init=False, repr=False, compare=False, hash=False)

    def __post_init__(self) -> None:
        keys = tuple(self.keys)
        object.__setattr__(self, "keys", keys)
        index: dict[str, int] = {}
        for position, key in enumerate(keys):
            if key.name in index:
                raise ValueError(f"sync key {key.name!r} appears twice in the layout")
            index[key.name] = position
        object.__setattr__(self, "_index", index)

    @classmethod
    def of(cls, *keys: SyncKey | str) -> SyncKeyLayout:
        """A layout with exactly these fields in this order (strings are ``INT`` keys); not recorded."""
        return cls(tuple(k if isinstance(k, SyncKey) else SyncKey(k) for k in keys))

    @classmethod
    async def load(cls, db: Database, keys: Iterable[SyncKey]) -> SyncKeyLayout:
        """The layout recorded in ``sync_token_keys``, after appending any of ``keys`` not yet there.

        Runs in one transaction holding a lock that only other layout loads wait for, so two
        processes starting at once cannot give one position to two keys. See :func:`plan_layout`.
        """
        wanted = list(keys)
        async with db.transaction() as txn:
            await txn.execute("LOCK TABLE sync_token_keys IN SHARE ROW EXCLUSIVE MODE")
            cur = await txn.execute("SELECT position, sync_key FROM sync_token_keys ORDER BY position")
            recorded = [(int(p), str(k)) for p, k in await cur.fetchall()]
            layout, new_rows = plan_layout(recorded, wanted)
            for position, name in new_rows:
                await txn.execute(
                    "INSERT INTO sync_token_keys (position, sync_key) VALUES (%(position)s, %(key)s)",
                    {"position": position, "key": name},
                )
        return layout

    def __len__(self) -> int:
        return len(self.keys)

    def __iter__(self) -> Iterator[SyncKey]:
        return iter(self.keys)

    def __contains__(self, name: object) -> bool:
        return name in self._index

    @property
    def names(self) -> tuple[str, ...]:
        """Every field's key name, in token order (retired ones included)."""
        return tuple(k.name for k in self.keys)

    @property
    def active_keys(self) -> tuple[SyncKey, ...]:
        """The keys that some plugin provides (every kind but ``RETIRED``), in token order."""
        return tuple(k for k in self.keys if k.kind is not SyncKeyKind.RETIRED)

    def index(self, name: str) -> int:
        """The field position of key ``name`` (``KeyError`` naming the known keys if absent)."""
        try:
            return self._index[name]
        except KeyError:
            raise KeyError(f"unknown sync key {name!r} (known: {', '.join(self.names) or 'none'})") from None

    def key(self, name: str) -> SyncKey:
        """The :class:`SyncKey` called ``name``."""
        return self.keys[self.index(name)]


def plan_layout(
    recorded: Sequence[tuple[int, str]], keys: Sequence[SyncKey]
) -> tuple[SyncKeyLayout, list[tuple[int, str]]]:
    """The layout for ``keys`` given the recorded ``(position, key)`` rows, and the rows to add.

    Recorded keys keep their positions; the ones not in ``keys`` become ``RETIRED``; new keys are
    appended after the highest recorded position in the order given. A gap in the recorded positions
    (a row deleted by hand) stays a retired slot, so later fields do not shift.
    """
    by_name = {k.name: k for k in keys}
    if len(by_name) != len(keys):
        raise ValueError("a sync key is listed twice")
    slots: dict[int, SyncKey] = {}
    for position, name in recorded:
        key = by_name.get(name)
        slots[position] = key if key is not None else SyncKey(name, SyncKeyKind.RETIRED, comparable=False)
    known = {name for _, name in recorded}
    next_position = max(slots, default=-1) + 1
    new_rows = []
    for key in keys:
        if key.name not in known:
            slots[next_position] = key
            new_rows.append((next_position, key.name))
            next_position += 1
    ordered = [
        slots.get(p, SyncKey(f"_unrecorded_{p}", SyncKeyKind.RETIRED, comparable=False)) for p in range(next_position)
    ]
    return SyncKeyLayout(tuple(ordered)), new_rows


def sync_keys_for_streams(
    streams: Iterable[StreamSpec[Any]], writers_for: Callable[[str], Sequence[str]]
) -> list[SyncKey]:
    """The sync keys the given streams declare, with the kind their writers call for.

    ``writers_for(stream_name)`` returns the configured writers (``Settings.writers_for`` fits).
    A stream written by any instance, or configured with more than one writer, gets a
    ``MULTI_WRITER`` field; a stream with one writer a plain ``INT`` field; a stream declared with
    ``room_tokens=True`` a ``ROOM`` field whatever its writers (``s5``, or ``m…`` with several).
    """
    out = []
    for spec in streams:
        if spec.sync_key is None:
            continue
        multi = spec.writers == "any" or len(writers_for(spec.name)) > 1
        kind = SyncKeyKind.ROOM if spec.room_tokens else SyncKeyKind.MULTI_WRITER if multi else SyncKeyKind.INT
        out.append(SyncKey(spec.sync_key, kind))
    return out
