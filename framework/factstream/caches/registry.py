"""``CacheRegistry``: this process's named caches, and the API that invalidates them everywhere.

Every cache the plugins registered (``register_caches``, or ``cached_specs`` of ``@cached`` methods)
exists once per process, as an :class:`~factstream.caches.lru.LruCache`. The host keeps the registry
as ``host.caches``.

Invalidating inside a write (``await host.caches.invalidate(txn, "cache", key)``) does two things:

* it writes a row to the caches stream *in the same transaction*, so the invalidation reaches every
  other process exactly when the write becomes visible (if the write rolls back, so does the row);
* it invalidates the local cache *after the transaction commits* (a rolled-back write changes
  nothing, so there is nothing to invalidate; invalidating earlier would let a concurrent reader
  re-cache the old value before the commit).

Without a caches stream (the ``caches`` plugin blocked or not installed) only the local
invalidation happens: fine for a single process, and logged once as a warning.
"""

from __future__ import annotations

import logging
from collections.abc import Hashable, Iterable, Iterator, Sequence
from typing import TYPE_CHECKING, Any

from factstream.caches import metrics
from factstream.caches.apply import InvalidationApplier
from factstream.caches.invalidate import Invalidation, InvalidationStream, room_state_rows
from factstream.caches.keys import check_key, key_to_wire
from factstream.caches.lru import LruCache
from factstream.errors import FactstreamError
from factstream.plugin.specs import SPECIAL_CACHE_NAMES, CacheSpec, InvalidationSpec

if TYPE_CHECKING:
    from factstream.db.database import Transaction
    from factstream.idgen.generator import MultiWriterIdGenerator
    from factstream.plugin.registry import Registry
    from factstream.plugin.streams import StreamSpec

log = logging.getLogger(__name__)


class UnknownCacheError(FactstreamError, KeyError):
    """No cache of that name is registered in this process."""

    def __str__(self) -> str:
        return str(self.args[0])


class CacheRegistry:
    """The named caches of one process (see the module docstring)."""

    def __init__(
        self,
        specs: Iterable[CacheSpec] = (),
        invalidations: Iterable[InvalidationSpec] = (),
        *,
        instance_name: str = "",
    ) -> None:
        self.instance_name = instance_name
        self._specs: dict[str, CacheSpec] = {}
        self._caches: dict[str, LruCache[Any]] = {}
        for spec in specs:
            if spec.name in self._specs:
                raise FactstreamError(f"cache {spec.name!r} is declared twice")
            self._specs[spec.name] = spec
            self._caches[spec.name] = LruCache(spec.name, spec.max_size)
        by_mode: dict[str | None, list[LruCache[Any]]] = {}
        for spec in self._specs.values():
            if spec.depends_on_room_state:
                by_mode.setdefault(spec.room_state_key, []).append(self._caches[spec.name])
        self._room_caches = by_mode.get("room", [])
        self._member_caches = by_mode.get("member", [])
        self._room_member_caches = by_mode.get("room_member", [])
        self._whole_caches = by_mode.get("all", [])
        self._invalidations = list(invalidations)
        self.stream: InvalidationStream | None = None
        self.applier = InvalidationApplier(self, self._invalidations)
        self._warned_no_stream = False
        metrics.track(self)

    @classmethod
    def from_registry(cls, registry: Registry, *, instance_name: str = "") -> CacheRegistry:
        """The caches and invalidations the loaded plugins registered."""
        return cls(
            [r.spec for r in registry.caches],
            [r.spec for r in registry.invalidations],
            instance_name=instance_name,
        )

    def attach_stream(self, spec: StreamSpec[Any], id_gen: MultiWriterIdGenerator) -> None:
        """Send invalidations on (and apply them from) the stream ``spec`` (the caches stream)."""
        self.stream = InvalidationStream(spec, id_gen)
        self.applier = InvalidationApplier(self, self._invalidations, caches_stream=spec.name)

    # -- lookup ------------------------------------------------------------------------------------

    def __contains__(self, name: object) -> bool:
        return name in self._caches

    def __iter__(self) -> Iterator[LruCache[Any]]:
        return iter(self._caches.values())

    def names(self) -> list[str]:
        return list(self._caches)

    def lookup(self, name: str) -> LruCache[Any] | None:
        """The cache called ``name``, or ``None``."""
        return self._caches.get(name)

    def get(self, name: str) -> LruCache[Any]:
        """The cache called ``name``; raises :class:`UnknownCacheError` naming the known ones."""
        cache = self._caches.get(name)
        if cache is None:
            raise UnknownCacheError(
                f"no cache named {name!r} is registered (known: {', '.join(self._caches) or 'none'}); "
                "register it in a plugin's register_caches hook"
            )
        return cache

    def spec(self, name: str) -> CacheSpec:
        self.get(name)
        return self._specs[name]

    # -- local invalidation ------------------------------------------------------------------------

    def invalidate_local(self, name: str, key: Sequence[Hashable]) -> bool:
        """Invalidate one key in this process only; returns whether a value was cached."""
        return self.get(name).invalidate(check_key(self.spec(name), key))

    def invalidate_all_local(self, name: str) -> int:
        """Clear one cache in this process only; returns how many values it held."""
        return self.get(name).invalidate_all()

    def invalidate_room_state_local(
        self, room_id: str, members_changed: Sequence[str] = (), *, every_member: bool = False
    ) -> None:
        """The ``cs_cache_fake`` fan-out: ``room_id``'s current state changed (and these members').

        Invalidates ``(room_id,)`` in every ``"room"`` cache, ``(member,)`` in every ``"member"``
        cache and ``(room_id, member)`` in every ``"room_member"`` cache for each changed member, and
        clears every ``"all"`` cache. Caches that do not depend on room state are not touched.

        ``every_member``: any member's membership may have changed, and which is not known (the
        events stream's ``state-all`` row): every ``"member"`` and ``"room_member"`` cache is cleared.
        """
        room_key = (room_id,)
        for cache in self._room_caches:
            cache.invalidate(room_key)
        if every_member:
            for cache in (*self._member_caches, *self._room_member_caches):
                cache.invalidate_all()
        elif members_changed:
            for cache in self._member_caches:
                for member in members_changed:
                    cache.invalidate((member,))
            for cache in self._room_member_caches:
                for member in members_changed:
                    cache.invalidate((room_id, member))
        for cache in self._whole_caches:
            cache.invalidate_all()

    # -- invalidation inside a write ---------------------------------------------------------------

    async def invalidate(self, txn: Transaction, name: str, key: Sequence[Hashable]) -> list[int]:
        """Invalidate one key of cache ``name`` everywhere, as part of the write ``txn``.

        ``key`` has one component per argument of the cached lookup. Returns the caches-stream IDs
        written (none without a caches stream).
        """
        return await self.invalidate_many(txn, name, [key])

    async def invalidate_many(self, txn: Transaction, name: str, keys: Iterable[Sequence[Hashable]]) -> list[int]:
        """Invalidate several keys of cache ``name`` everywhere (one caches-stream row per key)."""
        cache = self.get(name)
        spec = self._specs[name]
        checked = [check_key(spec, key) for key in keys]
        if not checked:
            return []

        def local() -> None:
            for key in checked:
                cache.invalidate(key)

        txn.after_commit(local)
        return await self._send(txn, [(name, key_to_wire(key)) for key in checked])

    async def invalidate_all(self, txn: Transaction, name: str) -> list[int]:
        """Clear cache ``name`` everywhere, as part of the write ``txn`` (a row with null keys)."""
        if name in SPECIAL_CACHE_NAMES:
            raise FactstreamError(f"{name!r} cannot be invalidated wholesale (a null key); it names a special row")
        cache = self.get(name)

        def clear() -> None:
            cache.invalidate_all()

        txn.after_commit(clear)
        return await self._send(txn, [(name, None)])

    async def invalidate_room_state(
        self, txn: Transaction, room_id: str, members_changed: Sequence[str] = ()
    ) -> list[int]:
        """``room_id``'s current state changes in ``txn``: fan out to every state-dependent cache.

        Sends ``cs_cache_fake`` rows (members in chunks of 50) and, after commit, runs the same
        fan-out locally (:meth:`invalidate_room_state_local`).
        """
        if type(room_id) is not str or not all(type(m) is str for m in members_changed):
            raise FactstreamError(f"room state invalidation needs string IDs, not {room_id!r}, {members_changed!r}")
        members = list(members_changed)
        txn.after_commit(lambda: self.invalidate_room_state_local(room_id, members))
        return await self._send(txn, room_state_rows(room_id, members))

    async def _send(self, txn: Transaction, rows: list[Invalidation]) -> list[int]:
        if self.stream is None:
            if not self._warned_no_stream:
                self._warned_no_stream = True
                log.warning(
                    "no caches stream is registered: invalidations stay in this process (install the caches plugin)"
                )
            return []
        return await self.stream.write(txn, rows)

    # -- replicated rows ---------------------------------------------------------------------------

    def apply_rows(self, stream: str, rows: list[Any]) -> None:
        """Apply one token's replicated rows of ``stream`` (see :mod:`factstream.caches.apply`)."""
        self.applier.apply(stream, rows)

    def close(self) -> None:
        metrics.untrack(self)
