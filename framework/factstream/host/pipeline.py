"""The reader pipeline: what happens, in one place and in one order, to every token's rows in a host.

For rows another process wrote (the replication reader hands them over, per stream, in token order)::

    1. cache invalidations   the InvalidationSpecs of the stream
    2. on_rows hooks         plugins react (local=False)
    3. (the reader advances the stream's position)
    4. wake                  /sync long polls of the users the rows concern, then position waiters

Why this order: a plugin reading a cache inside ``on_rows`` must not read what the rows made stale
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
* the ``on_rows`` hooks (``local=True``) and the wake-ups run in this writer's token order, once
  every earlier ID of this writer is complete: commits can finish out of order, a plugin must not
  see them so. Long polls wake from the rows in memory; nothing is read back from the database.

Fast paths are stages of the same pipeline: :meth:`ReaderPipeline.run` delivers a run of tokens with
one row each (the common replicated batch) with one cache pass and one plugin frame (:class:`RunStage`:
every ``on_rows`` implementation called directly, token after token, making exactly the calls
:meth:`RowsHook.deliver <factstream.plugin.rows.RowsHook.deliver>` would make); each stream's plan
(which stages apply to it) is computed once, so a stream nobody reacts to costs a lookup.
"""

from __future__ import annotations

import asyncio
import heapq
import inspect
import itertools
import logging
import operator
from collections.abc import Awaitable, Iterable
from dataclasses import dataclass, field
from typing import Any

from factstream.caches.registry import CacheRegistry
from factstream.plugin.rows import RowsHook
from factstream.replication.stream import ReplicatedStream
from factstream.sync.wakeups import SyncedStream, WakeRouter

log = logging.getLogger(__name__)
#: A failing ``on_rows`` implementation is logged where the plugin stage logs it (factstream.plugin.rows).
hook_log = logging.getLogger("factstream.plugin.manager")


@dataclass(frozen=True)
class _Plan:
    """Which stages apply to one stream's rows: the invalidations, the ``on_rows`` implementations that
    want the stream (None: none does), the /sync wake-ups."""

    invalidate: bool
    hook: RowsHook | None
    run_stage: RunStage | RowsHook | None
    synced: SyncedStream | None


class ReaderPipeline:
    """Stages 1, 2 and 4 for replicated rows (see the module docstring)."""

    def __init__(self, caches: CacheRegistry, hook: RowsHook, router: WakeRouter | None) -> None:
        self.caches = caches
        self.hook = hook
        self.router = router
        self._invalidated = caches.applier.streams()
        self._plans: dict[str, _Plan] = {}

    def plan(self, stream: str) -> _Plan:
        plan = self._plans.get(stream)
        if plan is None:
            synced = self.router.synced.get(stream) if self.router is not None else None
            hook = self.hook.for_stream(stream)
            plan = self._plans[stream] = _Plan(
                stream in self._invalidated,
                hook if hook else None,
                RunStage.of(hook) if hook else None,
                synced,
            )
        return plan

    def rows(self, stream: ReplicatedStream, instance: str, token: int, rows: list[Any]) -> Awaitable[None] | None:
        """Stages 1 and 2 for one token's rows (and remember them for stage 4); an awaitable if a hook
        must be awaited before the reader may advance."""
        name = stream.name
        plan = self._plans.get(name) or self.plan(name)
        if plan.invalidate:
            self.caches.apply_rows(name, rows)
        waiting = plan.hook.deliver(name, instance, token, rows, False) if plan.hook is not None else None
        if plan.synced is not None:
            self.router.remember(name, rows)  # type: ignore[union-attr]
        return waiting

    def run(
        self, stream: ReplicatedStream, instance: str, tokens: list[int], rows: list[Any]
    ) -> Awaitable[None] | None:
        """:meth:`rows` for a run of tokens with one row each, in order: one pass per stage."""
        name = stream.name
        plan = self._plans.get(name) or self.plan(name)
        if plan.invalidate:
            self.caches.apply_rows(name, rows)
        waiting = plan.run_stage.run(name, instance, tokens, rows, False) if plan.run_stage is not None else None
        if plan.synced is not None:
            self.router.remember(name, rows)  # type: ignore[union-attr]
        return waiting

    def advanced(self, stream: ReplicatedStream, instance: str, token: int) -> None:
        """Stage 4, after the reader advanced ``stream``: wake the long polls the rows concern."""
        if self.router is not None:
            self.router.on_position(stream, instance, token)


class RunStage:
    """Stage 2 for a run of tokens with one row each: every ``on_rows`` implementation, in hook order,
    for each ``(token, [row])`` in token order, in one frame.

    The same calls, arguments and order as :meth:`RowsHook.deliver` token by token, with the same
    logging of a failing implementation; only the per-call machinery is gone (this runs for every
    replicated row: two more Python frames per row and implementation cost a reader about 0.05 µs
    each, a tenth of its CPU per row with two plugins). Built by :meth:`of` when every
    implementation takes the spec's arguments positionally (the usual case); otherwise the pipeline
    runs :meth:`RowsHook.run`.
    """

    def __init__(self, hook: RowsHook) -> None:
        self.hook = hook
        self.host = hook.host
        impls = list(hook.impls)
        #: ``(plugin, function, arity, the implementations after it)``, in hook order.
        self.steps = [(*impl, impls[index + 1 :]) for index, impl in enumerate(impls)]

    @staticmethod
    def of(hook: RowsHook) -> RunStage | RowsHook:
        """The stage for ``hook``'s implementations, or ``hook`` itself if one takes keywords."""
        if all(arity in (5, 6) for _, _, arity in hook.impls):
            return RunStage(hook)
        return hook

    def run(
        self, stream: str, instance: str, tokens: list[int], rows: list[Any], local: bool
    ) -> Awaitable[None] | None:
        """``deliver`` for each ``(token, [row])``; once an implementation returns an awaitable, an
        awaitable that awaits it and delivers the rest of the run."""
        # The call of one implementation is written out in each loop on purpose: a
        # helper function would be the frame per row and implementation this stage exists to save.
        host = self.host
        steps = self.steps
        pairs = zip(tokens, rows, strict=True)
        if len(steps) == 1:  # one plugin (the usual case): no loop over the implementations
            plugin, function, arity, later = steps[0]
            for token, row in pairs:
                try:
                    if arity == 6:
                        result = function(host, stream, instance, token, [row], local)
                    else:
                        result = function(host, stream, instance, token, [row])
                except Exception as exc:
                    _hook_failed(plugin, exc)
                    continue
                if result is not None and inspect.isawaitable(result):
                    return self.hook.resume(result, plugin, later, stream, instance, token, [row], pairs, local)
            return None
        for token, row in pairs:
            group = [row]
            for plugin, function, arity, later in steps:
                try:
                    if arity == 6:
                        result = function(host, stream, instance, token, group, local)
                    else:
                        result = function(host, stream, instance, token, group)
                except Exception as exc:
                    _hook_failed(plugin, exc)
                    continue
                if result is not None and inspect.isawaitable(result):
                    return self.hook.resume(result, plugin, later, stream, instance, token, group, pairs, local)
        return None


def _hook_failed(plugin: str, exc: Exception) -> None:
    hook_log.error("plugin %r failed in hook on_rows: %s: %s", plugin, type(exc).__name__, exc)


@dataclass
class _Pending:
    """One written stream's committed rows waiting for every earlier ID of this writer."""

    heap: list[tuple[int, int, list[Any]]] = field(default_factory=list)
    #: A task awaiting a hook's coroutine; later tokens wait for it.
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
        if committed and (plan.hook is not None or plan.synced is not None):
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
            if plan.hook is not None:
                waiting = plan.hook.deliver(name, local, token, rows, True)
                if waiting is not None:
                    pending.busy = asyncio.get_running_loop().create_task(
                        self._after(name, waiting, batches, token), name=f"local-rows:{name}"
                    )
                    return
        self._wake(plan, current, batches)

    async def _after(self, name: str, waiting: Awaitable[None], batches: list[list[Any]], token: int) -> None:
        """A hook returned a coroutine: await it, wake for what was delivered, then go on in order."""
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
