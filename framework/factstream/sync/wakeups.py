"""Who to wake when rows of a synced stream arrive: replicated rows and this process's own writes.

Waiting ``/sync`` requests park in the :class:`~factstream.sync.Notifier`. Something has to tell it,
per row, which users (and rooms) the row concerns, and it must do so only *after* the row is visible
in this process, that is after the stream's position advanced (the reader's order is: invalidate
caches, advance positions, wake waiters).

* **Replicated rows**: the reader pipeline (``factstream.host.pipeline``) calls
  :meth:`WakeRouter.remember` before the advance, which only keeps a reference to the rows, and
  :meth:`WakeRouter.on_position` after it, which computes the targets and notifies. Streams without
  a ``sync_key`` never reach the router, and targets are only computed while some user has a stream
  in the notifier.

  Rows are remembered per *writer*, and an advance wakes for that writer's rows only. The reader
  advances one writer at a time (a backlog that holds rows of two writers ends in two advances), and
  a woken request reads up to the current token, which holds a writer's rows once that writer's
  position passed them. Rows woken for at another writer's advance, before their own, were read at a
  token without them; their own advance then woke nobody, and the request slept on past rows it
  would return until something else woke it (the missed wake-up of docs/sync.md).
* **Rows written here** never come back through replication: the pipeline's local side hands the
  committed rows, from memory and in this writer's token order, to :meth:`WakeRouter.wake`.

Why waking "only while the notifier has user streams" is safe: a user stream is created with the
current token, which already includes every row whose position advanced before. Both decisions
(skip, or compute and notify) are taken synchronously right after the advance, so no request can
slip in between them.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from factstream.plugin.streams import StreamSpec, Wake
from factstream.replication.stream import ReplicatedStream
from factstream.sync.notifier import Notifier

log = logging.getLogger(__name__)


def wake_function(spec: StreamSpec[Any]) -> Callable[[Any], Wake] | None:
    """The stream's ``wake``, or the default from ``user_field``; ``None`` when rows wake nobody."""
    if spec.wake is not None:
        return spec.wake
    field = spec.user_field
    if field is None:
        return None

    def wake_owner(row: Any) -> Wake:
        return Wake(users=(getattr(row, field),))

    return wake_owner


@dataclass(frozen=True)
class SyncedStream:
    """A stream clients follow through ``/sync``: its spec, replication state and token field."""

    spec: StreamSpec[Any]
    stream: ReplicatedStream
    key: str
    wake: Callable[[Any], Wake] | None

    @property
    def name(self) -> str:
        return self.spec.name


class WakeRouter:
    """Turns rows of synced streams into ``Notifier.on_new_event`` calls (see the module docstring)."""

    def __init__(self, notifier: Notifier, synced: Iterable[SyncedStream]) -> None:
        self.notifier = notifier
        self.synced = {s.name: s for s in synced}
        #: Per (stream, writer), the rows waiting for that writer's advance.
        self._pending: dict[tuple[str, str], list[list[Any]]] = {}
        #: (stream, writer) pairs whose next advance wakes every long poll (a kept stream's reset).
        self._everyone: set[tuple[str, str]] = set()

    # replicated rows: remembered before the advance, woken after it --------------------------------

    def remember(self, stream: str, instance: str, rows: list[Any]) -> None:
        """Before the advance: remember ``instance``'s rows (a reference, no work per row)."""
        key = (stream, instance)
        pending = self._pending.get(key)
        if pending is None:
            self._pending[key] = [rows]
        else:
            pending.append(rows)

    def on_position(self, stream: ReplicatedStream, instance: str, token: int) -> None:
        """After ``instance``'s advance: wake the users its remembered rows concern (module docstring)."""
        synced = self.synced.get(stream.name)
        if synced is not None:
            batches = self._pending.pop((stream.name, instance), None)
            if self._everyone and (stream.name, instance) in self._everyone:
                self._everyone.discard((stream.name, instance))
                self.notifier.wake_everyone(synced.key, token)
                return
            self.wake(synced, token, batches)

    def reset(self, stream: str, instance: str) -> None:
        """A kept stream's view of ``instance`` was reset: its next advance wakes every long poll, whose
        answers may all have changed (what the writer said before is gone)."""
        self._pending.pop((stream, instance), None)
        if stream in self.synced:
            self._everyone.add((stream, instance))

    # both paths ------------------------------------------------------------------------------------

    def wake(self, synced: SyncedStream, token: int, batches: list[list[Any]] | None) -> int:
        """Notify for ``batches`` of rows of ``synced`` (already visible); returns requests woken.

        Always notifies, even with nothing to wake: ``wait_for_stream_token`` waiters are woken by
        any notification, and they wait for positions, not rows.
        """
        notifier = self.notifier
        if not batches or synced.wake is None or not notifier.user_stream_count:
            return notifier.on_new_event(synced.key, token)
        users: set[str] = set()
        rooms: set[str] = set()
        wake = synced.wake
        for rows in batches:
            for row in rows:
                try:
                    targets = wake(row)
                except Exception:
                    log.exception("wake function of stream %s failed on %r", synced.name, row)
                    continue
                users.update(targets.users)
                rooms.update(targets.rooms)
        return notifier.on_new_event(synced.key, token, users=users, rooms=rooms)
