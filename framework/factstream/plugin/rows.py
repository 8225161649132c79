"""Delivering rows to the plugins' ``on_rows`` hooks: the pipeline's plugin stage.

This runs for every token of every stream a process reads or writes, so it is built once per host
(:meth:`factstream.plugin.manager.PluginHost.rows_hook`) with the implementations resolved:

* an implementation whose parameters are the spec's, in the spec's order (the usual case), is
  called positionally; one that takes a subset is called with keywords, as pluggy would;
* no coroutine is made unless an implementation returns an awaitable: only then does the call
  return an awaitable that awaits it and goes on with the remaining implementations, in order;
* :meth:`RowsHook.run` delivers a run of tokens with one row each (a busy reader's usual batch) in
  one frame, making exactly the calls :meth:`RowsHook.deliver` would make token by token;
* :meth:`RowsHook.for_stream` leaves out the plugins whose ``on_rows_streams`` does not name the
  stream: the pipeline delivers each stream's rows through its own.

An implementation that raises is logged with the plugin's name; the stream goes on.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from typing import Any

from factstream.errors import PluginError

log = logging.getLogger("factstream.plugin.manager")

#: The spec's parameters, in order; the five-parameter form predates ``local``.
FULL_PARAMETERS = ("host", "stream", "instance", "token", "rows", "local")

#: ``(plugin name, function, how to call it)``: ``6`` or ``5`` positional arguments, or ``0`` (keywords).
Impl = tuple[str, Callable[..., Any], int]


def positional_arity(function: Callable[..., Any]) -> int:
    """How many of the spec's arguments ``function`` takes positionally (0: call it with keywords)."""
    params = tuple(inspect.signature(function).parameters)
    if params == FULL_PARAMETERS:
        return 6
    if params == FULL_PARAMETERS[:5]:
        return 5
    return 0


class RowsHook:
    """The ``on_rows`` implementations of the loaded plugins, bound to one host (module docstring)."""

    def __init__(
        self,
        host: object,
        impls: Sequence[Impl],
        call: Callable[..., Any],
        streams: Mapping[str, frozenset[str]] | None = None,
    ) -> None:
        self.host = host
        self.impls = list(impls)
        #: ``call(plugin, hook, function, **kwargs)``: the manager's keyword call (tracing, errors).
        self._call = call
        #: The streams each plugin that answered ``on_rows_streams`` wants (the others want every stream).
        self.streams = dict(streams or {})
        self._for: dict[str, RowsHook] = {}

    def for_stream(self, stream: str) -> RowsHook:
        """The implementations that want ``stream``'s rows (``on_rows_streams``), in the same order."""
        hook = self._for.get(stream)
        if hook is None:
            wanted = [i for i in self.impls if i[0] not in self.streams or stream in self.streams[i[0]]]
            hook = self if len(wanted) == len(self.impls) else RowsHook(self.host, wanted, self._call)
            self._for[stream] = hook
        return hook

    def __bool__(self) -> bool:
        return bool(self.impls)

    def _one(self, impl: Impl, stream: str, instance: str, token: int, rows: list[Any], local: bool) -> Any:
        plugin_name, function, arity = impl
        try:
            if arity == 6:
                return function(self.host, stream, instance, token, rows, local)
            if arity == 5:
                return function(self.host, stream, instance, token, rows)
        except Exception as exc:
            log.error("plugin %r failed in hook on_rows: %s: %s", plugin_name, type(exc).__name__, exc)
            return None
        try:
            return self._call(
                plugin_name,
                "on_rows",
                function,
                host=self.host,
                stream=stream,
                instance=instance,
                token=token,
                rows=rows,
                local=local,
            )
        except PluginError as exc:
            log.error("%s", exc)
            return None

    def deliver(self, stream: str, instance: str, token: int, rows: list[Any], local: bool) -> Awaitable[None] | None:
        """Every implementation for one token's rows, in order; an awaitable if one must be awaited."""
        impls = self.impls
        for index, impl in enumerate(impls):
            result = self._one(impl, stream, instance, token, rows, local)
            if result is not None and inspect.isawaitable(result):
                return self._finish(result, impl[0], impls[index + 1 :], stream, instance, token, rows, local)
        return None

    async def _finish(
        self,
        first: Awaitable[Any],
        plugin: str,
        rest: list[Impl],
        stream: str,
        instance: str,
        token: int,
        rows: list[Any],
        local: bool,
    ) -> None:
        await _awaited(plugin, first)
        for impl in rest:
            result = self._one(impl, stream, instance, token, rows, local)
            if result is not None and inspect.isawaitable(result):
                await _awaited(impl[0], result)

    def resume(
        self,
        first: Awaitable[Any],
        plugin: str,
        rest: list[Impl],
        stream: str,
        instance: str,
        token: int,
        rows: list[Any],
        pairs: Iterator[tuple[int, Any]],
        local: bool,
    ) -> Awaitable[None]:
        """A run delivered up to ``plugin``'s implementation for ``token``, which returned ``first``: await
        it, call the implementations ``rest`` for that token, then deliver the rest of the run
        (``pairs``) token by token (the run stage's rare path, ``host/pipeline.py``)."""
        return self._run_rest(
            self._finish(first, plugin, rest, stream, instance, token, rows, local), stream, instance, pairs, local
        )

    def run(
        self, stream: str, instance: str, tokens: list[int], rows: list[Any], local: bool
    ) -> Awaitable[None] | None:
        """:meth:`deliver` for each ``(token, [row])`` of a run, in order, in one frame."""
        if len(self.impls) != 1:
            return self._run_each(stream, instance, iter(zip(tokens, rows, strict=True)), local)
        impl = self.impls[0]
        one = self._one
        pairs = zip(tokens, rows, strict=True)
        for token, row in pairs:
            result = one(impl, stream, instance, token, [row], local)
            if result is not None and inspect.isawaitable(result):
                return self._run_rest(_awaited(impl[0], result), stream, instance, pairs, local)
        return None

    def _run_each(
        self, stream: str, instance: str, pairs: Iterator[tuple[int, Any]], local: bool
    ) -> Awaitable[None] | None:
        for token, row in pairs:
            waiting = self.deliver(stream, instance, token, [row], local)
            if waiting is not None:
                return self._run_rest(waiting, stream, instance, pairs, local)
        return None

    async def _run_rest(
        self, first: Awaitable[None], stream: str, instance: str, pairs: Iterator[tuple[int, Any]], local: bool
    ) -> None:
        await first
        for token, row in pairs:
            waiting = self.deliver(stream, instance, token, [row], local)
            if waiting is not None:
                await waiting


async def _awaited(plugin_name: str, awaitable: Awaitable[Any]) -> None:
    """Await an implementation's result, logging (not raising) its failure with the plugin's name."""
    try:
        await awaitable
    except Exception as exc:
        log.error("plugin %r failed in hook on_rows: %s: %s", plugin_name, type(exc).__name__, exc)
