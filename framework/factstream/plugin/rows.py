"""Delivering rows to the plugins' rows handlers: the pipeline's plugin stage.

Plugins register one handler per stream (``register_rows_handlers``, a :class:`RowsHandlerSpec`).
This runs for every token of every handled stream a process reads or writes, so each stream's
handlers are bound to the host once (:func:`bind_handlers`), in a :class:`StreamHandlers`:

* every handler is called positionally, ``handler(host, instance, token, rows, local)``: there is
  one signature, so there is no per-call dispatch;
* no coroutine is made unless a handler returns an awaitable: only then does the call return an
  awaitable that awaits it and goes on with the remaining handlers, in order;
* :meth:`StreamHandlers.run` delivers a run of tokens with one row each (a busy reader's usual
  batch) in one frame, making exactly the calls :meth:`StreamHandlers.deliver` would make token by
  token;
* a stream nobody handles has no :class:`StreamHandlers` at all: the pipeline skips the stage.

A handler that raises is logged with the plugin's name and the stream's; the stream goes on.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Awaitable, Callable, Iterable, Iterator
from typing import Any

from factstream.plugin.registry import Registered
from factstream.plugin.streams import RowsHandlerSpec

log = logging.getLogger("factstream.plugin.manager")
trace_log = logging.getLogger("factstream.hooks")

#: A bound handler: ``(host, instance, token, rows, local) -> None or an awaitable``.
Handler = Callable[[Any, str, int, list[Any], bool], Any]
#: ``(plugin name, handler, the steps after it)``, in call order.
Step = tuple[str, Handler, list[Any]]


class StreamHandlers:
    """The handlers of one stream's rows, in call order, bound to one host (module docstring)."""

    def __init__(self, host: object, stream: str, handlers: Iterable[tuple[str, Handler]]) -> None:
        self.host = host
        self.stream = stream
        pairs = list(handlers)
        #: Each step carries the steps after it, so that a handler returning an awaitable can hand
        #: the rest of the token to :meth:`_finish` without slicing on the hot path.
        self.steps: list[Step] = [(plugin, handler, []) for plugin, handler in pairs]
        for index, step in enumerate(self.steps):
            step[2].extend(self.steps[index + 1 :])

    def __bool__(self) -> bool:
        return bool(self.steps)

    def failed(self, plugin: str, exc: Exception) -> None:
        log.error("plugin %r failed handling rows of stream %r: %s: %s", plugin, self.stream, type(exc).__name__, exc)

    def deliver(self, instance: str, token: int, rows: list[Any], local: bool) -> Awaitable[None] | None:
        """Every handler for one token's rows, in order; an awaitable if one must be awaited."""
        host = self.host
        for plugin, handler, later in self.steps:
            try:
                result = handler(host, instance, token, rows, local)
            except Exception as exc:
                self.failed(plugin, exc)
                continue
            if result is not None and inspect.isawaitable(result):
                return self._finish(result, plugin, later, instance, token, rows, local)
        return None

    async def _finish(
        self,
        first: Awaitable[Any],
        plugin: str,
        rest: list[Step],
        instance: str,
        token: int,
        rows: list[Any],
        local: bool,
    ) -> None:
        """Await the handler ``plugin``'s result, then call the handlers ``rest`` for the same token."""
        try:
            await first
        except Exception as exc:
            self.failed(plugin, exc)
        for later_plugin, handler, _ in rest:
            try:
                result = handler(self.host, instance, token, rows, local)
                if result is not None and inspect.isawaitable(result):
                    await result
            except Exception as exc:
                self.failed(later_plugin, exc)

    def run(self, instance: str, tokens: list[int], rows: list[Any], local: bool) -> Awaitable[None] | None:
        """:meth:`deliver` for each ``(token, [row])`` of a run, in order, in one frame; once a handler
        returns an awaitable, an awaitable that awaits it and delivers the rest of the run."""
        # The call of a handler is written out in each loop on purpose: a helper function would be a
        # frame per row and handler (about 0.05 µs each), which this path exists to save.
        host = self.host
        steps = self.steps
        pairs = zip(tokens, rows, strict=True)
        if len(steps) == 1:  # one handler (the usual case): no loop over the handlers
            plugin, handler, _ = steps[0]
            for token, row in pairs:
                try:
                    result = handler(host, instance, token, [row], local)
                except Exception as exc:
                    self.failed(plugin, exc)
                    continue
                if result is not None and inspect.isawaitable(result):
                    return self._run_rest(
                        self._finish(result, plugin, [], instance, token, [row], local), instance, pairs, local
                    )
            return None
        for token, row in pairs:
            group = [row]
            for plugin, handler, later in steps:
                try:
                    result = handler(host, instance, token, group, local)
                except Exception as exc:
                    self.failed(plugin, exc)
                    continue
                if result is not None and inspect.isawaitable(result):
                    return self._run_rest(
                        self._finish(result, plugin, later, instance, token, group, local), instance, pairs, local
                    )
        return None

    async def _run_rest(
        self, first: Awaitable[None], instance: str, pairs: Iterator[tuple[int, Any]], local: bool
    ) -> None:
        await first
        for token, row in pairs:
            waiting = self.deliver(instance, token, [row], local)
            if waiting is not None:
                await waiting


def bind_handlers(
    host: object, handlers: Iterable[Registered[RowsHandlerSpec[Any]]], *, trace: bool = False
) -> dict[str, StreamHandlers]:
    """Each handled stream's :class:`StreamHandlers`, bound to ``host``, the handlers in the given order.

    With ``trace``, every call is logged on the ``factstream.hooks`` logger (``FACTSTREAM_TRACE_HOOKS``).
    """
    by_stream: dict[str, list[tuple[str, Handler]]] = {}
    for reg in handlers:
        stream = reg.spec.stream.name
        handler: Handler = reg.spec.handler
        if trace:
            handler = _traced(reg.plugin, stream, handler)
        by_stream.setdefault(stream, []).append((reg.plugin, handler))
    return {stream: StreamHandlers(host, stream, pairs) for stream, pairs in by_stream.items()}


#: A kept stream's plugins' resets in one call: ``(writer, epoch)``, awaited before the new run's rows.
Reset = Callable[[str, int], Awaitable[None]]


def bind_resets(host: object, handlers: Iterable[Registered[RowsHandlerSpec[Any]]]) -> dict[str, Reset]:
    """Per kept stream, one call of the ``reset`` of each rows handler that has one, bound to ``host``, in
    order; a plugin that raises is logged with its name (as :meth:`StreamHandlers.failed`) and the others
    still run."""
    by_stream: dict[str, list[tuple[str, Any]]] = {}
    for reg in handlers:
        if reg.spec.reset is not None:
            by_stream.setdefault(reg.spec.stream.name, []).append((reg.plugin, reg.spec.reset))

    def bound(stream: str, resets: list[tuple[str, Any]]) -> Reset:
        async def reset(writer: str, epoch: int) -> None:
            for plugin, function in resets:
                try:
                    result = function(host, writer, epoch)
                    if inspect.isawaitable(result):
                        await result
                except Exception as exc:
                    log.error(
                        "plugin %r failed resetting its view of %s on stream %r: %s: %s",
                        plugin,
                        writer,
                        stream,
                        type(exc).__name__,
                        exc,
                    )

        return reset

    return {stream: bound(stream, resets) for stream, resets in by_stream.items()}


def _traced(plugin: str, stream: str, handler: Handler) -> Handler:
    def call(host: object, instance: str, token: int, rows: list[Any], local: bool) -> Any:
        trace_log.info(
            "call %s.rows[%s](instance=%r, token=%d, %d row(s), local=%s)",
            plugin,
            stream,
            instance,
            token,
            len(rows),
            local,
        )
        result = handler(host, instance, token, rows, local)
        trace_log.info("done %s.rows[%s] -> %r", plugin, stream, result)
        return result

    return call
