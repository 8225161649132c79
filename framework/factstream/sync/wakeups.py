"""Who to wake when rows of a synced stream arrive: replicated rows and this process's own writes.

Waiting ``/sync`` requests park in the :class:`~factstream.sync.Notifier`. Something has to tell it,
per row, which users (and rooms) the row concerns, and it must do so only *after* the row is visible
in this process, that is after the stream's position advanced (the reader's order is: invalidate
caches, advance positions, wake waiters).

* **Replicated rows** come through the :class:`~factstream.replication.handler.ReplicationHandler`:
  :meth:`WakeRouter.on_rows` (an ``on_rows`` callback, before the advance) only keeps a reference to
  the rows; :meth:`WakeRouter.on_position` (after the advance) computes the targets and notifies.
  Streams without a ``sync_key`` cost one dictionary lookup per token and nothing else, and targets
  are only computed while some user has a stream in the notifier.
* **Rows written here** never come back through replication. :class:`LocalTail` follows the
  completions of the synced streams this process writes, reads its own new rows back through the
  stream's update function (only while some user has a stream in the notifier; otherwise it just
  moves its cursor) and hands them to the same router.

Why waking "only while the notifier has user streams" is safe: a user stream is created with the
current token, which already includes every row whose position advanced before. Both decisions
(skip, or compute and notify) are taken synchronously right after the advance, so no request can
slip in between them.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from factstream.plugin.streams import StreamSpec, Wake
from factstream.replication.stream import ReplicatedStream
from factstream.sync.notifier import Notifier

log = logging.getLogger(__name__)

#: Rows per update-function call when the local tail reads this process's writes back.
LOCAL_TAIL_PAGE_ROWS = 1_000


def wake_function(spec: StreamSpec) -> Callable[[Any], Wake] | None:
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

    spec: StreamSpec
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
        self._pending: dict[str, list[list[Any]]] = {}

    # ReplicationHandler callbacks ------------------------------------------------------------------

    def on_rows(self, stream: ReplicatedStream, instance: str, token: int, rows: list[Any]) -> None:
        """Before the advance: remember the rows (a reference, no work per row)."""
        if stream.name in self.synced:
            pending = self._pending.get(stream.name)
            if pending is None:
                self._pending[stream.name] = [rows]
            else:
                pending.append(rows)

    def on_position(self, stream: ReplicatedStream, instance: str, token: int) -> None:
        """After the advance: wake the users the remembered rows concern."""
        synced = self.synced.get(stream.name)
        if synced is not None:
            self.wake(synced, token, self._pending.pop(stream.name, None))

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


class LocalTail:
    """Wakes long polls for the rows this process writes itself (see the module docstring).

    One task for all the synced streams this process writes; woken by their ID generators'
    completion listeners. ``start`` and ``close`` are called by the host.
    """

    def __init__(self, router: WakeRouter, streams: Iterable[SyncedStream]) -> None:
        self.router = router
        self.streams = [s for s in streams if s.stream.id_gen.is_writer]
        self._cursor = {s.name: s.stream.current_token(s.stream.local) for s in self.streams}
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        for s in self.streams:
            s.stream.id_gen.add_completion_listener(self._wake.set)

    def start(self) -> None:
        if self.streams and self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="sync-local-tail")

    async def _run(self) -> None:
        while True:
            await self._wake.wait()
            self._wake.clear()
            for synced in self.streams:
                try:
                    await self.catch_up(synced)
                except asyncio.CancelledError:
                    raise
                except Exception:
                    log.exception("could not read back local rows of %s to wake long polls", synced.name)
                    await asyncio.sleep(0.5)
                    self._wake.set()

    async def catch_up(self, synced: SyncedStream) -> None:
        """Wake the users of this process's rows of ``synced`` written since the last call."""
        stream = synced.stream
        current = stream.current_token(stream.local)
        last = self._cursor[synced.name]
        if current <= last:
            return
        if (
            synced.wake is None
            or not self.router.notifier.user_stream_count
            or last >= stream.minimal_local_current_token()
        ):
            # Nobody to wake, or the position moved only because other writers did (their rows
            # arrive through replication): no need to read anything.
            self._cursor[synced.name] = current
            self.router.wake(synced, current, None)
            return
        batches: list[list[Any]] = []
        while last < current:
            updates, upto, limited = await stream.get_updates_since(
                stream.local, last, current, limit=LOCAL_TAIL_PAGE_ROWS
            )
            batches.append([row for _, row in updates])
            last = upto
            if not limited:
                break
        self._cursor[synced.name] = current
        self.router.wake(synced, current, batches)

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
