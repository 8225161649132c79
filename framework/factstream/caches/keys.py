"""Cache keys: checking them against a cache's spec, and their text form on the caches stream.

A key is a tuple with ``spec.key_arity`` components, each of the type ``spec.key_types`` gives
(``str`` or ``int``; a ``bool`` is not an ``int`` here). The caches stream stores keys as ``TEXT[]``
(as the reference does), so an ``int`` component travels as its decimal text and is converted back
on the reader. A reader also accepts the component's own JSON type (a peer may send ``5`` rather
than ``"5"`` in a live row).
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable
from typing import Any

from factstream.plugin.specs import CacheSpec


class BadKey(ValueError):
    """A key does not fit its cache (wrong arity or component type)."""


def check_key(spec: CacheSpec, key: Any) -> tuple[Hashable, ...]:
    """``key`` as a tuple if it fits ``spec``; raises :class:`BadKey` saying why not."""
    if not isinstance(key, tuple | list):
        raise BadKey(f"cache {spec.name!r}: a key must be a tuple, not {type(key).__name__} {key!r}")
    if len(key) != spec.key_arity:
        raise BadKey(
            f"cache {spec.name!r}: key {key!r} has {len(key)} component(s), the cache's keys have {spec.key_arity}"
        )
    for value, wanted in zip(key, spec.key_types, strict=True):
        if type(value) is not wanted:
            raise BadKey(
                f"cache {spec.name!r}: key {key!r} has a {type(value).__name__} where a {wanted.__name__} belongs"
            )
    return tuple(key)


def key_to_wire(key: Iterable[Hashable]) -> list[str]:
    """The ``TEXT[]`` form of a checked key."""
    return [value if type(value) is str else str(value) for value in key]


def key_from_wire(spec: CacheSpec, wire: Any) -> tuple[Hashable, ...]:
    """The key a caches-stream row names; raises :class:`BadKey` if it cannot be one of ``spec``'s."""
    if not isinstance(wire, list | tuple):
        raise BadKey(f"cache {spec.name!r}: keys must be a list, not {type(wire).__name__}")
    if len(wire) != spec.key_arity:
        raise BadKey(f"cache {spec.name!r}: {len(wire)} key component(s), the cache's keys have {spec.key_arity}")
    if all(type(v) is str for v in wire) and all(t is str for t in spec.key_types):
        return tuple(wire)  # the common case
    out: list[Hashable] = []
    for value, wanted in zip(wire, spec.key_types, strict=True):
        if type(value) is wanted:
            out.append(value)
        elif wanted is int and type(value) is str:
            try:
                out.append(int(value))
            except ValueError:
                raise BadKey(f"cache {spec.name!r}: key component {value!r} is not an int") from None
        else:
            raise BadKey(f"cache {spec.name!r}: key component {value!r} is not a {wanted.__name__}")
    return tuple(out)
