"""The reader pipeline: what happens, in one place and in one order, to every token's rows in a host.

For rows another process wrote (the replication reader hands them over, per stream, in token order)::

    1. cache invalidations   the InvalidationSpecs of the stream
    2. rows handlers         plugins react (local=False; register_rows_handlers)
    3. (the reader advances the stream's position)
    4. wake                  /sync long polls of the users the rows concern, then position waiters
                             (per writer: an advance wakes for the rows of the writer it advanced)

Why this order: a plugin reading a cache inside a rows handler must not read what the rows made stale
(1 before 2); and anyone who observes the new position (a ``wait_for_stream_position`` caller, a
long poll that returns the new token) must find every cache already invalidated and every plugin's
reaction done (1 and 2 before 3, 3 before 4). The reader (``ReplicationHandler``) calls
:meth:`ReaderPipeline.rows` or :meth:`ReaderPipeline.run` before it advances and
:meth:`ReaderPipeline.advanced` after; it wakes its own position waiters last.

For rows this process wrote itself (:class:`LocalRows`, fed by the typed stream writers when a
transaction completes), the same stages run, without the advance (the ID generator moved the
position when the transaction committed):

* the invalidations run at once, when the transaction ends: the writer's own next read, possibly
  before the transaction's caller returns, must not hit a stale entry (invalidating is idempotent and
  order-free, so doing it early is safe; it also runs after a rollback, which costs only a reload);
* the rows handlers (``local=True``) and the wake-ups run in this writer's token order, once
  every earlier ID of this writer is complete: commits can finish out of order, a plugin must not
  see them so. Long polls wake from the rows in memory; nothing is read back from the database.

Fast paths are stages of the same pipeline: :meth:`ReaderPipeline.run` delivers a run of tokens with
one row each (the common replicated batch) with one cache pass and one plugin frame
(:meth:`StreamHandlers.run <factstream.plugin.rows.StreamHandlers.run>`: every handler called
directly, token after token, making exactly the calls ``deliver`` would make); each stream's plan
(which stages apply to it) is computed once, so a stream nobody reacts to costs a lookup.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import logging
import operator
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from factstream.caches.registry import CacheRegistry
from factstream.plugin.rows import Reset, StreamHandlers
from factstream.replication.stream import ReplicatedStream
from factstream.sync.wakeups import SyncedStream, WakeRouter

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class _Plan:
    """Which stages apply to one stream's rows: the invalidations, the stream's rows handlers (None:
    nobody handles it), the /sync wake-ups."""

    invalidate: bool
    handlers: StreamHandlers | None
    synced: SyncedStream | None


class ReaderPipeline:
    """Stages 1, 2 and 4 for replicated rows (see the module docstring)."""

    def __init__(
        self,
        caches: CacheRegistry,
        router: WakeRouter | None,
        handlers: Mapping[str, StreamHandlers] | None = None,
    ) -> None:
        self.caches = caches
        self.router = router
        self.handlers: dict[str, StreamHandlers] = dict(handlers or {})
        self._invalidated = caches.applier.streams()
        self._plans: dict[str, _Plan] = {}

    def add_handlers(self, handlers: Mapping[str, StreamHandlers]) -> None:
        """Add the plugins' rows handlers (bound to the plugin API, which writes through this pipeline,
        hence after it: ``factstream.host.parts.compose``), before any row flows."""
        if self._plans:
            raise RuntimeError("rows handlers must join the pipeline before any row flows through it")
        self.handlers.update(handlers)

    def plan(self, stream: str) -> _Plan:
        plan = self._plans.get(stream)
        if plan is None:
            synced = self.router.synced.get(stream) if self.router is not None else None
            handlers = self.handlers.get(stream)
            plan = self._plans[stream] = _Plan(stream in self._invalidated, handlers or None, synced)
        return plan

    def rows(self, stream: ReplicatedStream, instance: str, token: int, rows: list[Any]) -> Awaitable[None] | None:
        """Stages 1 and 2 for one token's rows (and remember them for stage 4); an awaitable if a handler
        must be awaited before the reader may advance."""
        name = stream.name
        plan = self._plans.get(name) or self.plan(name)
        if plan.synced is not None:  # first: a stage that raises must not lose the wake-up
            self.router.remember(name, instance, rows)  # type: ignore[union-attr]
        if plan.invalidate:
            self.caches.apply_rows(name, rows)
        return plan.handlers.deliver(instance, token, rows, False) if plan.handlers is not None else None

    def run(
        self, stream: ReplicatedStream, instance: str, tokens: list[int], rows: list[Any]
    ) -> Awaitable[None] | None:
        """:meth:`rows` for a run of tokens with one row each, in order: one pass per stage."""
        name = stream.name
        plan = self._plans.get(name) or self.plan(name)
        if plan.synced is not None:
            self.router.remember(name, instance, rows)  # type: ignore[union-attr]
        if plan.invalidate:
            self.caches.apply_rows(name, rows)
        return plan.handlers.run(instance, tokens, rows, False) if plan.handlers is not None else None

    def advanced(self, stream: ReplicatedStream, instance: str, token: int) -> None:
        """Stage 4, after the reader advanced ``stream``: wake the long polls the rows concern."""
        if self.router is not None:
            self.router.on_position(stream, instance, token)

    def attach_resets(self, streams: Iterable[ReplicatedStream], resets: Mapping[str, Reset]) -> None:
        """Wire each kept stream's reset (``factstream.replication.kept``): the plugins' ``reset``
        handlers, in order, then every long poll of the stream wakes at the writer's next advance."""
        for stream in streams:
            if stream.kept is not None:
                stream.kept.on_reset = self._reset_of(stream.name, resets.get(stream.name))

    def _reset_of(self, name: str, plugins: Reset | None) -> Callable[[str, int], Awaitable[None]]:
        async def reset(instance: str, epoch: int) -> None:
            log.info("kept stream %s: %s started a new run at %d; forgetting its earlier facts", name, instance, epoch)
            if plugins is not None:
                await plugins(instance, epoch)
            if self.router is not None:
                self.router.reset(name, instance)

        return reset


@dataclass
class _Pending:
    """One written stream's committed rows waiting for every earlier ID of this writer."""

    heap: list[tuple[int, int, list[Any]]] = field(default_factory=list)
    #: A task awaiting a handler's coroutine; later tokens wait for it.
    busy: asyncio.Task[None] | None = None


class LocalRows:
    """The pipeline for this process's own writes (see the module docstring)."""

    def __init__(self, pipeline: ReaderPipeline, streams: Iterable[ReplicatedStream]) -> None:
        self.pipeline = pipeline
        self.streams = {s.name: s for s in streams if s.id_gen.is_writer}
        self._pending = {name: _Pending() for name in self.streams}
        self._order = itertools.count()
        self._closed = False
        for name, stream in self.streams.items():
            stream.id_gen.add_completion_listener(lambda name=name: self.release(name))  # type: ignore[misc]

    def completed(self, stream: str, tokens: list[int], rows: list[Any], committed: bool) -> None:
        """A transaction that wrote ``rows`` (at wire ``tokens``, one per row) ended.

        Called by the stream writer from the transaction's completion callback, after the ID
        generator has counted the IDs complete.
        """
        if self._closed or stream not in self.streams:
            return
        plan = self.pipeline.plan(stream)
        if plan.invalidate:
            self.pipeline.caches.apply_rows(stream, rows)
        if committed and (plan.handlers is not None or plan.synced is not None):
            pending = self._pending[stream]
            # Rows at one token (a StreamWriter.reserve_groups group) are delivered together.
            for token, same in itertools.groupby(zip(tokens, rows, strict=True), key=operator.itemgetter(0)):
                heapq.heappush(pending.heap, (token, next(self._order), [row for _, row in same]))
        self.release(stream)

    def release(self, name: str) -> None:
        """Deliver, in token order, the pending rows of ``name`` this writer's position has passed."""
        pending = self._pending.get(name)
        if pending is None or pending.busy is not None or self._closed:
            return
        stream = self.streams[name]
        pipeline = self.pipeline
        plan = pipeline.plan(name)
        current = stream.current_token(stream.local)
        local = stream.local
        heap = pending.heap
        batches: list[list[Any]] = []
        while heap and heap[0][0] <= current:
            token, _, rows = heapq.heappop(heap)
            batches.append(rows)
            if plan.handlers is not None:
                waiting = plan.handlers.deliver(local, token, rows, True)
                if waiting is not None:
                    pending.busy = asyncio.get_running_loop().create_task(
                        self._after(name, waiting, batches, token), name=f"local-rows:{name}"
                    )
                    return
        self._wake(plan, current, batches)

    async def _after(self, name: str, waiting: Awaitable[None], batches: list[list[Any]], token: int) -> None:
        """A handler returned a coroutine: await it, wake for what was delivered, then go on in order."""
        pending = self._pending[name]
        try:
            await waiting
        finally:
            pending.busy = None
        self._wake(self.pipeline.plan(name), token, batches)
        self.release(name)

    def _wake(self, plan: _Plan, token: int, batches: list[list[Any]]) -> None:
        router = self.pipeline.router
        if plan.synced is not None and router is not None:
            router.wake(plan.synced, token, batches or None)

    async def close(self) -> None:
        self._closed = True
        for pending in self._pending.values():
            task = pending.busy
            if task is not None:
                task.cancel()
                try:
                    await task
                except asyncio.CancelledError:
                    pass
                except Exception:
                    log.exception("local rows delivery failed while stopping")
