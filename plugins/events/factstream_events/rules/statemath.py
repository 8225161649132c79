"""A room's state as data: maps, deltas, their encoding and hash, and which group a new delta is based on.

A room's state maps ``(type, state_key)`` to the ID of the state event in force. In memory it is
nested, ``type -> state_key -> event_id`` (:data:`State`): a change to one member copies the members'
map and shares every other type's map with the state it came from, and :func:`diff` skips a shared
map without looking inside it.

A **delta** (:data:`Delta`) maps keys to their new event ID, or to ``None`` for a key the new state no
longer has (deltas can remove keys, unlike the reference's). Deltas are stored encoded with
:func:`encode_delta` (MessagePack, types and keys sorted, so equal deltas encode to equal bytes).

**Where a group's delta is based** (:func:`base_position`). Each state group has a *position*: how
many state changes lead to it from the empty state along its lineage (its parent's position plus
one). A group stores its delta against the ancestor at ``base_position(position)``. Written in base
:data:`BRANCHING`, a position whose lowest non-zero digit is at place ``k`` is based ``16**k`` changes
back: most groups hold one change against their parent, one in 16 holds the last 16 changes
against the group 16 back, one in 256 the last 256, and so on. So

* a change is stored about once per level (amortised), about 4 entries per change for 10,000 to 65,000
  changes, in **one row** per group;
* the walk from any group to the empty state follows at most ``15 * levels`` base links (its base-16
  digit sum: 45 hops at 4,095 changes), whatever the room's history, with no periodic full snapshot;
* the ancestor at a group's base position lies on the base walk from its parent (the walk lowers the
  parent's digits from the lowest up), so the writer finds it in the states it just loaded.

**Identical states are stored once**: :func:`state_hash` is a multiset hash (the sum of the SHA-256 of
every entry, modulo 2**256), updated from a delta in time proportional to the delta
(:func:`updated_hash`); the store keeps one group per ``(room, hash)``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Iterator, Mapping, Sequence

import msgspec

#: ``type -> state_key -> event_id``. Treat it as immutable: maps are shared between states.
State = Mapping[str, Mapping[str, str]]
#: ``type -> state_key -> event_id``, or ``None`` for a key the new state does not have.
Delta = Mapping[str, Mapping[str, str | None]]

EMPTY_STATE: State = {}
#: Base of the positions' digits (see the module docstring).
BRANCHING = 16
_MODULUS = 1 << 256
HASH_BYTES = 32
EMPTY_HASH = bytes(HASH_BYTES)

_encoder = msgspec.msgpack.Encoder()
_delta_decoder = msgspec.msgpack.Decoder(dict[str, dict[str, str | None]])


class StateMap(Mapping[tuple[str, str], str]):
    """A state seen flat, ``(type, state_key) -> event_id``, without copying it: a read-only view of the
    ``type -> state_key -> event_id`` maps (a 10,000-member state is not rebuilt for every read)."""

    __slots__ = ("_len", "_state")

    def __init__(self, state: State) -> None:
        self._state = state
        self._len = -1

    def __getitem__(self, key: tuple[str, str]) -> str:
        event_type, state_key = key
        return self._state[event_type][state_key]

    def __contains__(self, key: object) -> bool:
        if not isinstance(key, tuple) or len(key) != 2:
            return False
        return key[1] in self._state.get(key[0], {})

    def __iter__(self) -> Iterator[tuple[str, str]]:
        for event_type, keys in self._state.items():
            for state_key in keys:
                yield event_type, state_key

    def __len__(self) -> int:
        if self._len < 0:
            self._len = sum(len(keys) for keys in self._state.values())
        return self._len

    def __repr__(self) -> str:
        return f"StateMap({dict(self)!r})"


class StateDataError(ValueError):
    """A stored delta that does not decode."""


def apply_delta(state: State, delta: Delta) -> dict[str, Mapping[str, str]]:
    """``state`` changed by ``delta``; the maps of types the delta does not touch are shared."""
    new: dict[str, Mapping[str, str]] = dict(state)
    for event_type, changes in delta.items():
        inner = dict(new.get(event_type, {}))
        for state_key, event_id in changes.items():
            if event_id is None:
                inner.pop(state_key, None)
            else:
                inner[state_key] = event_id
        if inner:
            new[event_type] = inner
        else:
            new.pop(event_type, None)
    return new


def diff(old: State, new: State) -> dict[str, dict[str, str | None]]:
    """The delta that turns ``old`` into ``new`` (empty when they are equal)."""
    out: dict[str, dict[str, str | None]] = {}
    for event_type in old.keys() | new.keys():
        before = old.get(event_type, {})
        after = new.get(event_type, {})
        if before is after:
            continue
        changes: dict[str, str | None] = {k: v for k, v in after.items() if before.get(k) != v}
        for state_key in before.keys() - after.keys():
            changes[state_key] = None
        if changes:
            out[event_type] = changes
    return out


def delta_size(delta: Delta) -> int:
    """The number of entries (changed or removed keys) in ``delta``."""
    return sum(len(changes) for changes in delta.values())


def state_size(state: State) -> int:
    """The number of keys in ``state``."""
    return sum(len(inner) for inner in state.values())


def encode_delta(delta: Delta) -> bytes:
    """``delta`` as MessagePack, types and keys sorted (equal deltas give equal bytes)."""
    ordered = {t: dict(sorted(delta[t].items())) for t in sorted(delta)}
    return _encoder.encode(ordered)


def decode_delta(data: bytes) -> dict[str, dict[str, str | None]]:
    """The delta :func:`encode_delta` wrote; :class:`StateDataError` for anything else."""
    try:
        return _delta_decoder.decode(data)
    except msgspec.DecodeError as exc:
        raise StateDataError(f"a stored state delta does not decode: {exc}") from None


def _entry(event_type: str, state_key: str, event_id: str) -> int:
    digest = hashlib.sha256(_encoder.encode((event_type, state_key, event_id))).digest()
    return int.from_bytes(digest, "big")


def state_hash(state: State) -> bytes:
    """The multiset hash of ``state``'s entries (:data:`EMPTY_HASH` for the empty state)."""
    total = sum(_entry(t, k, e) for t, inner in state.items() for k, e in inner.items())
    return (total % _MODULUS).to_bytes(HASH_BYTES, "big")


def updated_hash(old_hash: bytes, old: State, delta: Delta) -> bytes:
    """``state_hash(apply_delta(old, delta))`` from ``old``'s hash, in time proportional to ``delta``."""
    total = int.from_bytes(old_hash, "big")
    for event_type, changes in delta.items():
        inner = old.get(event_type, {})
        for state_key, event_id in changes.items():
            previous = inner.get(state_key)
            if previous is not None:
                total -= _entry(event_type, state_key, previous)
            if event_id is not None:
                total += _entry(event_type, state_key, event_id)
    return (total % _MODULUS).to_bytes(HASH_BYTES, "big")


def base_position(position: int) -> int:
    """The position of the ancestor a group at ``position`` stores its delta against (0: the empty state)."""
    if position < 1:
        raise ValueError(f"a state group's position is at least 1, not {position}")
    step = 1
    while position % (step * BRANCHING) == 0:
        step *= BRANCHING
    return position - step


def walk_positions(position: int) -> list[int]:
    """The positions a load of the group at ``position`` walks through, from it to the empty state."""
    out = [position]
    while position > 0:
        position = base_position(position)
        out.append(position)
    return out


def default_resolve(states: Sequence[State]) -> dict[str, Mapping[str, str]]:
    """The default answer when the states before an event's ``prev_events`` differ.

    ``states`` come in order of preference: the state after the deepest prev_event first (ties: the
    later stream ordering first). Every key of every state is kept; where they disagree on a key,
    the first state holding it wins. Deterministic, and never drops state (a plugin implementing the
    ``resolve_state`` hook replaces it with a real algorithm).
    """
    out: dict[str, dict[str, str]] = {}
    for state in reversed(states):
        for event_type, inner in state.items():
            out.setdefault(event_type, {}).update(inner)
    return dict(out)


def flatten(state: State) -> dict[tuple[str, str], str]:
    """``state`` as a flat map ``(type, state_key) -> event_id``."""
    return {(t, k): e for t, inner in state.items() for k, e in inner.items()}


def nest(entries: Iterable[tuple[tuple[str, str], str]]) -> dict[str, Mapping[str, str]]:
    """A :data:`State` from ``((type, state_key), event_id)`` pairs."""
    out: dict[str, dict[str, str]] = {}
    for (event_type, state_key), event_id in entries:
        out.setdefault(event_type, {})[state_key] = event_id
    return dict(out)
