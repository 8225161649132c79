"""The read side: apply replicated rows to this process's caches, before the stream advances.

Two kinds of rows invalidate:

* rows of the caches stream (see :mod:`factstream.caches.invalidate`): ``(cache_func, keys)`` names
  a cache and one key, or the whole cache when ``keys`` is null; ``cs_cache_fake`` rows fan out to
  every cache that depends on a room's current state (:meth:`CacheRegistry.invalidate_room_state_local`);
* rows of any other stream with :class:`~factstream.plugin.specs.InvalidationSpec` s: each spec's ``keys(row)``
  names the keys of its cache that the row makes stale (``None``: the whole cache).

The host calls :meth:`InvalidationApplier.apply` from the replication handler's per-token rows
callback, which runs before the stream's position advances and before waiters wake: whatever a row
makes stale is gone before anyone can observe the row's position. A stream with nothing to
invalidate costs one dictionary lookup per token.

A row that cannot be applied (an unknown cache, a key of the wrong arity or type, a ``keys``
function that raises) is logged with the row and skipped; the other rows, and the stream, go on.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Protocol

from factstream.caches.keys import BadKey, check_key, key_from_wire
from factstream.caches.lru import LruCache
from factstream.plugin.specs import CURRENT_STATE_CACHE_NAME, SPECIAL_CACHE_NAMES, CacheSpec, InvalidationSpec


class Caches(Protocol):
    """What the applier needs of the caches it invalidates (:class:`~factstream.caches.CacheRegistry` is one).

    Defined beside its use: the registry builds an applier, so the applier must not import the registry.
    """

    def names(self) -> list[str]: ...

    def lookup(self, name: str) -> LruCache[Any] | None: ...

    def get(self, name: str) -> LruCache[Any]: ...

    def spec(self, name: str) -> CacheSpec: ...

    def invalidate_room_state_local(
        self, room_id: str, members_changed: Sequence[str] = (), *, every_member: bool = False
    ) -> None: ...


log = logging.getLogger(__name__)

RowsApplier = Callable[[list[Any]], None]


class BadRow(ValueError):
    """A caches-stream row this process cannot apply."""


class InvalidationApplier:
    """Per-stream appliers, built once when the host starts."""

    def __init__(
        self, caches: Caches, invalidations: Iterable[InvalidationSpec] = (), caches_stream: str | None = None
    ) -> None:
        self.caches = caches
        self.skipped = 0
        by_stream: dict[str, list[RowsApplier]] = {}
        for spec in invalidations:
            by_stream.setdefault(spec.stream, []).append(self._spec_applier(spec))
        if caches_stream is not None:
            by_stream.setdefault(caches_stream, []).insert(0, self.apply_caches_rows)
        self._dispatch: dict[str, RowsApplier] = {name: _chain(appliers) for name, appliers in by_stream.items()}

    def streams(self) -> list[str]:
        """The streams whose rows invalidate something here."""
        return sorted(self._dispatch)

    def apply(self, stream: str, rows: list[Any]) -> None:
        """Apply one token's rows of ``stream`` (the handler's per-token callback calls this)."""
        applier = self._dispatch.get(stream)
        if applier is not None:
            applier(rows)

    # -- the caches stream -------------------------------------------------------------------------

    def apply_caches_rows(self, rows: list[Any]) -> None:
        for row in rows:
            try:
                self.apply_invalidation(row.cache_func, row.keys)
            except (BadRow, BadKey, AttributeError) as exc:
                self.skipped += 1
                log.warning("skipped a caches-stream row that cannot be applied: %r: %s", row, exc)

    def apply_invalidation(self, cache_func: Any, keys: Any) -> None:
        """Apply what one caches-stream row says; raises :class:`BadRow` or :class:`BadKey`."""
        caches = self.caches
        if cache_func == CURRENT_STATE_CACHE_NAME:
            if not isinstance(keys, list | tuple) or not keys:
                raise BadRow(f"{CURRENT_STATE_CACHE_NAME} needs keys [room_id, *members_changed], not {keys!r}")
            if not all(type(k) is str for k in keys):
                raise BadRow(f"{CURRENT_STATE_CACHE_NAME} keys must be strings, not {keys!r}")
            caches.invalidate_room_state_local(keys[0], keys[1:])
            return
        if cache_func in SPECIAL_CACHE_NAMES:
            raise BadRow(f"{cache_func} rows are not supported by this version")
        cache = caches.lookup(cache_func)
        if cache is None:
            raise BadRow(f"no cache named {cache_func!r} here (known: {', '.join(caches.names()) or 'none'})")
        if keys is None:
            cache.invalidate_all()
        else:
            cache.invalidate(key_from_wire(caches.spec(cache_func), keys))

    # -- other streams' rows -----------------------------------------------------------------------

    def _spec_applier(self, spec: InvalidationSpec) -> RowsApplier:
        cache = self.caches.get(spec.cache)
        cache_spec = self.caches.spec(spec.cache)
        keys_of = spec.keys

        def skip(row: Any, exc: Exception) -> None:
            self.skipped += 1
            log.warning(
                "skipped invalidating cache %r for a row of stream %r: %r: %s: %s",
                spec.cache,
                spec.stream,
                row,
                type(exc).__name__,
                exc,
            )

        def apply(rows: list[Any]) -> None:
            for row in rows:
                try:
                    keys = keys_of(row)
                    if keys is None:
                        cache.invalidate_all()
                        continue
                    for key in keys:
                        try:
                            cache.invalidate(check_key(cache_spec, key))
                        except BadKey as exc:
                            skip(row, exc)
                except Exception as exc:  # the plugin's keys function failed
                    skip(row, exc)

        return apply


def _chain(appliers: list[RowsApplier]) -> RowsApplier:
    if len(appliers) == 1:
        return appliers[0]

    def apply_all(rows: list[Any]) -> None:
        for applier in appliers:
            applier(rows)

    return apply_all
