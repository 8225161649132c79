"""Routing the replication commands plugins handle (``factstream.plugin.commands`` says the rules).

:class:`CommandRouter` sits beside the reader (``ReplicationHandler`` hands it every command that is
not RDATA, POSITION or REPLICATE), runs the plugins' handlers one command at a time in arrival order,
sends what ``host.send_command`` is given, and calls ``forget`` for instances that are gone.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
from collections.abc import Callable, Iterable
from typing import Any, Protocol

from factstream.errors import ConfigError, FactstreamError
from factstream.idgen.leases import WriterLeases
from factstream.plugin.commands import LIVENESS_SECONDS, CommandHandlerSpec, speaks_for
from factstream.plugin.registry import Registered
from factstream.replication import wire
from factstream.replication.senders import Connection
from factstream.replication.wire import ProtocolError

log = logging.getLogger(__name__)

#: The lease key every host holds for its instance name while it runs (``WriterLeases``).
INSTANCE_LEASE = "_instance"


class Sender(Protocol):
    def send(self, command: wire.Command) -> None: ...


class CommandRouter:
    """The plugins' command handlers in one host (module docstring)."""

    def __init__(
        self,
        instance: str,
        specs: Iterable[Registered[CommandHandlerSpec[Any]]],
        *,
        writers_of: Callable[[str], list[str]],
        leases: WriterLeases | None,
        tcp_main: str | None,
    ) -> None:
        self.instance = instance
        self.specs = {reg.spec.name: reg for reg in specs}
        self._writers_of = writers_of
        self._leases = leases
        if tcp_main is not None:
            for reg in self.specs.values():
                writers = writers_of(reg.spec.stream)
                if writers != [tcp_main]:
                    raise ConfigError(
                        f"plugin {reg.plugin!r} handles {reg.spec.name} on the writers of stream {reg.spec.stream!r} "
                        f"({', '.join(writers) or 'every instance'}): with TCP replication commands reach the main "
                        f"instance only, so stream_writers.{reg.spec.stream} must be [{tcp_main}] (or use Redis)"
                    )
        self.host: Any = None
        self.outlet: Sender | None = None
        #: Per command name, the other instances whose commands were handled here (what ``forget`` undoes).
        self._heard: dict[str, set[str]] = {}
        self._queue: asyncio.Queue[tuple[Registered[CommandHandlerSpec[Any]], str, Any]] = asyncio.Queue()
        self._worker: asyncio.Task[None] | None = None
        self._watcher: asyncio.Task[None] | None = None

    def __bool__(self) -> bool:
        return bool(self.specs)

    def _handles(self, reg: Registered[CommandHandlerSpec[Any]]) -> bool:
        writers = self._writers_of(reg.spec.stream)
        return not writers or self.instance in writers

    # -- inbound -----------------------------------------------------------------------------------

    def received(self, conn: Connection, cmd: wire.Command) -> None:
        """A command from a link: queue its handler here if this instance handles it (else ignore it,
        as every command nobody handles is ignored); ProtocolError for one that speaks for another peer."""
        reg = self.specs.get(cmd.NAME)
        if reg is None or not self._handles(reg):
            return
        claimed = speaks_for(cmd)
        if claimed == self.instance:
            return  # our own, come back over Redis (handled when sent); nobody else speaks for us
        peer = None if conn.relays else conn.peer
        if peer is not None and claimed is not None and claimed != peer:
            raise ProtocolError(f"{cmd.NAME} for instance {claimed!r} on the link of {peer!r}")
        sender = claimed or peer or ""
        if sender:
            self._heard.setdefault(cmd.NAME, set()).add(sender)
            self._watch()
        self._enqueue(reg, sender, cmd)

    def lost(self, conn: Connection) -> None:
        """A link closed: a peer that is one instance (a TCP client of the main one) is gone from here."""
        if not conn.relays and conn.peer is not None:
            self.forget(conn.peer)

    # -- outbound ----------------------------------------------------------------------------------

    def send(self, cmd: wire.Command) -> None:
        """``host.send_command``: handle it here if this instance handles it, send it where others do."""
        reg = self.specs.get(cmd.NAME)
        if reg is None:
            raise FactstreamError(f"no plugin handles {cmd.NAME} commands (register_command_handlers)")
        if not isinstance(cmd, reg.spec.command):
            raise FactstreamError(f"{cmd.NAME}: expected a {reg.spec.command.__name__}, not {cmd!r}")
        claimed = speaks_for(cmd)
        if claimed is not None and claimed != self.instance:
            raise FactstreamError(
                f"{cmd.NAME}: this instance is {self.instance!r} and speaks for itself, not {claimed!r}"
            )
        cmd.to_line()  # a command that cannot be sent fails here, in the caller, not in the transport
        if self._handles(reg):
            self._enqueue(reg, self.instance, cmd)
        if any(w != self.instance for w in self._writers_of(reg.spec.stream)) and self.outlet is not None:
            self.outlet.send(cmd)

    def connected(self) -> None:
        """The replication link (re)connected: send what each spec's ``resend`` gives again."""
        for reg in self.specs.values():
            if reg.spec.resend is None:
                continue
            try:
                commands = list(reg.spec.resend(self.host))
                for cmd in commands:
                    self.send(cmd)
            except Exception as exc:
                log.error("plugin %r failed re-sending %s: %s: %s", reg.plugin, reg.spec.name, type(exc).__name__, exc)

    # -- handling, in order ------------------------------------------------------------------------

    def _enqueue(self, reg: Registered[CommandHandlerSpec[Any]], sender: str, cmd: Any) -> None:
        self._queue.put_nowait((reg, sender, cmd))
        if self._worker is None:
            self._worker = asyncio.get_running_loop().create_task(self._work(), name="plugin-commands")

    async def _work(self) -> None:
        while True:
            reg, sender, cmd = await self._queue.get()
            spec = reg.spec
            try:
                if cmd is None:
                    assert spec.forget is not None
                    result = spec.forget(self.host, sender)
                else:
                    result = spec.handler(self.host, sender, cmd)
                if inspect.isawaitable(result):
                    await result
            except Exception as exc:
                what = "forgetting" if cmd is None else "handling"
                log.error(
                    "plugin %r failed %s %s of %s: %s: %s", reg.plugin, what, spec.name, sender, type(exc).__name__, exc
                )

    # -- forgetting the gone -----------------------------------------------------------------------

    def forget(self, instance: str) -> None:
        """``instance`` is gone: queue ``forget`` of every spec whose commands it sent here."""
        for name, heard in self._heard.items():
            if instance in heard:
                heard.discard(instance)
                reg = self.specs[name]
                log.info("instance %s is gone: %s forgets its %s commands", instance, reg.plugin, name)
                if reg.spec.forget is not None:
                    self._enqueue(reg, instance, None)

    def _watch(self) -> None:
        if self._watcher is None and self._leases is not None:
            self._watcher = asyncio.get_running_loop().create_task(self._check_liveness(), name="command-senders")

    async def _check_liveness(self) -> None:
        assert self._leases is not None
        while True:
            await asyncio.sleep(LIVENESS_SECONDS)
            heard = set().union(*self._heard.values()) if self._heard else set()
            if not heard:
                continue
            try:
                alive = await self._leases.alive(INSTANCE_LEASE, heard)
            except Exception as exc:
                log.warning("cannot check which instances are alive: %s", exc)
                continue
            for instance in sorted(heard - alive):
                self.forget(instance)

    async def close(self) -> None:
        for task in (self._worker, self._watcher):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task
        self._worker = self._watcher = None
