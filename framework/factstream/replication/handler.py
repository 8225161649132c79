"""The reader side of replication: turn incoming commands into ordered, gap-free stream updates.

Guarantees, per stream:

* Commands are processed strictly in arrival order, one at a time (one queue and one task per
  stream; different streams proceed in parallel). A catch-up query and a later RDATA can never race.
* A writer's rows are only accepted once a POSITION of that stream *from that writer* has been
  processed on the connection they arrive on: before that, this process may have missed rows, and
  the POSITION's catch-up fills the gap from the database. RDATA arriving earlier is dropped (the
  POSITION that follows re-reads it). Keyed by writer, not by stream alone (the reference's key): an
  idle writer announces a POSITION each time another writer's IDs move its own position, and on a
  hub with several client writers one writer's POSITION must not make the hub drop another's rows.
* ``batch`` rows are buffered per (stream, writer) until the row carrying the numeric token arrives;
  with several writers on one channel, two writers' batches can interleave (the reference keyed the
  buffer by stream only).
* A POSITION ``prev new`` says the writer wrote nothing in ``(prev, new]``. If this process's view of
  that writer is outside ``[prev, new]`` it has missed something (or the writer restarted), so it
  reads the writer's rows after its current view through the stream's update function, in token
  order, looping while the function is limited.
* For every token: first the host's pipeline sees the rows (:meth:`RowSink.rows`: cache
  invalidations, rows handlers), then the ID generator advances, then the pipeline wakes long
  polls (:meth:`RowSink.advanced`) and the handler its position waiters. A reader that waits for a
  position therefore never reads state that the rows at that position made stale. The stages
  themselves live in ``factstream.host.pipeline``.

Peers speak only for themselves (docs/security.md). RDATA and POSITION are accepted only under the
name of an instance configured to write that stream (or any, for streams anyone writes), never under
this process's own name, and, on a link whose peer is one instance (a TCP client seen from the
server), only under that peer's name. A refusal raises :class:`ProtocolError` on such a link (TCP
answers ``ERROR`` and closes); on a link that carries many instances' commands (Redis, the hub seen
from a client) the command is dropped and logged. A POSITION can never move a position past what the
stream's sequence has handed out: one beyond what this process knows to be allocated is checked
against the sequence first (:meth:`ReplicationHandler.check_position`).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import itertools
import logging
import time
from collections import defaultdict
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, Protocol, cast

from factstream.replication import wire
from factstream.replication.commands import CommandRouter
from factstream.replication.links import LagTracker, StreamLag, untrack
from factstream.replication.senders import Connection, Senders
from factstream.replication.stream import ReplicatedStream, RowError
from factstream.replication.waiters import PositionWaiters
from factstream.replication.wire import ProtocolError, RdataRun

log = logging.getLogger(__name__)

#: Rows per update-function call when catching up from the database.
CATCH_UP_PAGE_ROWS = 2_000


class RowSink(Protocol):
    """Where the reader delivers rows: the host's pipeline (``factstream.host.pipeline``).

    ``rows`` and ``run`` are called before the stream advances past the rows and may return an
    awaitable the reader awaits before it advances; ``advanced`` after every advance (rows or not).
    """

    def rows(self, stream: ReplicatedStream, instance: str, token: int, rows: list[Any]) -> Awaitable[None] | None:
        """One token's rows."""
        ...

    def run(
        self, stream: ReplicatedStream, instance: str, tokens: list[int], rows: list[Any]
    ) -> Awaitable[None] | None:
        """A run of tokens with one row each, in order (the same as ``rows`` for each)."""
        ...

    def advanced(self, stream: ReplicatedStream, instance: str, token: int) -> None:
        """``stream`` advanced to ``token`` for ``instance``."""
        ...


class NoSink:
    """A reader whose rows nobody reacts to (positions still advance and waiters wake)."""

    def rows(self, stream: ReplicatedStream, instance: str, token: int, rows: list[Any]) -> None:
        return None

    def run(self, stream: ReplicatedStream, instance: str, tokens: list[int], rows: list[Any]) -> None:
        return None

    def advanced(self, stream: ReplicatedStream, instance: str, token: int) -> None:
        return None


class _StreamQueue:
    """One stream's inbound commands, drained by that stream's task."""

    __slots__ = ("idle", "items", "wake")

    def __init__(self) -> None:
        self.items: collections.deque[tuple[Connection, wire.Command | RdataRun]] = collections.deque()
        self.wake = asyncio.Event()
        self.idle = asyncio.Event()
        self.idle.set()


class ReplicationHandler:
    """Processes RDATA and POSITION for the streams of this process (see the module docstring)."""

    def __init__(
        self,
        instance_name: str,
        streams: Iterable[ReplicatedStream],
        *,
        sink: RowSink | None = None,
        max_backlog: int = 10_000,
    ) -> None:
        self.instance_name = instance_name
        self.streams = {s.name: s for s in streams}
        self.sink: RowSink = sink if sink is not None else NoSink()
        self.connections: list[Connection] = []
        #: Per link, the (stream, writer) pairs whose RDATA it accepts (a POSITION was processed).
        self._connected: dict[Connection, set[tuple[str, str]]] = defaultdict(set)
        self._batches: dict[tuple[str, str], list[Any]] = {}
        self._queues: dict[str, _StreamQueue] = {}
        self._backlog = 0
        self._workers: dict[str, asyncio.Task[None]] = {}
        self.waiters = PositionWaiters()
        self.on_replicate: Callable[[Connection], None] | None = None
        #: The plugins' command handlers (``factstream.replication.commands``); every other command is
        #: ignored without one.
        self.commands: CommandRouter | None = None
        self.rows_processed = 0
        #: Above this many queued commands, transports stop reading until processing catches up:
        #: the backlog then builds on the sender, which disconnects a reader that cannot keep up.
        self.max_backlog = max_backlog
        self._capacity = asyncio.Event()
        self._capacity.set()
        self.senders = Senders(instance_name, self.streams)
        #: What each writer announced and when (see :class:`LagTracker`); off with ``metrics.enabled: false``.
        self.lag = LagTracker(lambda stream, writer: self.streams[stream].current_token(writer))
        self.tracking = True
        #: Per stream, the catch-up pages and rows read from the database since start.
        self._catch_ups: dict[str, list[int]] = {}

    # -- connections -------------------------------------------------------------------------------

    def new_connection(self, conn: Connection) -> None:
        self.connections.append(conn)

    def lost_connection(self, conn: Connection) -> None:
        if conn in self.connections:
            self.connections.remove(conn)
        self._connected.pop(conn, None)
        if self.commands is not None:
            self.commands.lost(conn)

    def connected_streams(self, conn: Connection) -> set[str]:
        return {stream for stream, _ in self._connected.get(conn, ())}

    def following(self, stream: str) -> bool:
        """Whether some link has processed a POSITION of ``stream``: its rows are now accepted there."""
        return any(stream == name for pairs in self._connected.values() for name, _ in pairs)

    # -- inbound -----------------------------------------------------------------------------------

    def on_command(self, conn: Connection, cmd: wire.Command) -> None:
        """Dispatch one parsed command; raises :class:`ProtocolError` for what must close a TCP link.

        Returns normally having accepted the command or, on a relaying link, having dropped a
        refused one; only an accepted command may be passed on to others (the TCP hub relays it).
        The reader acts on RDATA, POSITION and REPLICATE; it ignores every other command.
        """
        kind = type(cmd)
        if kind is wire.RdataCommand or kind is wire.PositionCommand:
            cmd = cast("wire.RdataCommand | wire.PositionCommand", cmd)
            stream = self.streams.get(cmd.stream_name)
            if stream is None:
                raise ProtocolError(f"unknown stream {cmd.stream_name!r}")
            if not self.senders.accept(conn, stream, cmd.instance_name, cmd.NAME):
                return
            if self.tracking:
                if kind is wire.PositionCommand:
                    position = cast(wire.PositionCommand, cmd)
                    self.lag.heard_token(stream.name, position.instance_name, position.new_token, position.stamp)
                elif cmd.token is not None:  # type: ignore[union-attr]
                    self.lag.heard_token(cmd.stream_name, cmd.instance_name, cmd.token)  # type: ignore[union-attr]
            if (
                isinstance(cmd, wire.PositionCommand)
                and (cmd.stream_name, cmd.instance_name) in self._connected.get(conn, ())
                and stream.can_discard_position(cmd.instance_name, cmd.new_token)
            ):
                return
            self._enqueue(conn, cmd)
        elif isinstance(cmd, wire.ReplicateCommand):
            if self.on_replicate is not None:
                self.on_replicate(conn)
        elif self.commands is not None:
            self.commands.received(conn, cmd)  # the plugins' commands (ProtocolError for a forged one)

    def on_rdata_run(self, conn: Connection, run: RdataRun) -> None:
        """Dispatch a run of RDATA lines (see :class:`RdataRun`); raises :class:`ProtocolError` like ``on_command``."""
        stream = self.streams.get(run.stream_name)
        if stream is None:
            raise ProtocolError(f"unknown stream {run.stream_name!r}")
        if self.senders.accept(conn, stream, run.instance_name, "RDATA"):
            if self.tracking:
                last = run.tokens[-1]
                if last is not None:
                    self.lag.heard_token(run.stream_name, run.instance_name, last)
            self._enqueue(conn, run, len(run.tokens))

    # -- who may say what --------------------------------------------------------------------------

    @property
    def refused(self) -> int:
        """Commands refused because of who sent them or what they claimed, since start."""
        return self.senders.refused

    def position_known(self, conn: Connection, cmd: wire.PositionCommand) -> bool:
        """See :meth:`Senders.position_known` (transports call this before dispatching a POSITION)."""
        return self.senders.position_known(conn, cmd)

    async def check_position(self, conn: Connection, cmd: wire.PositionCommand) -> str | None:
        """See :meth:`Senders.check_position`."""
        return await self.senders.check_position(conn, cmd)

    # -- lag ---------------------------------------------------------------------------------------

    def lags(self) -> list[StreamLag]:
        """How far this instance is behind each other writer it heard of, per stream (see :class:`StreamLag`)."""
        return [
            self.lag.lag(name, writer, self.streams[name].current_token(writer))
            for name, writer in sorted(self.lag.heard)
            if writer != self.instance_name
        ]

    def positions(self) -> dict[str, int]:
        """Per stream, the position every writer has reached as this instance sees it (for log lines)."""
        return {name: stream.id_gen.get_current_token() for name, stream in self.streams.items()}

    def catch_ups(self) -> dict[str, tuple[int, int]]:
        """Per stream, the pages and rows read from the database to catch up since start."""
        return {name: (pages, rows) for name, (pages, rows) in self._catch_ups.items()}

    def _enqueue(self, conn: Connection, cmd: wire.Command | RdataRun, weight: int = 1) -> None:
        name = cmd.stream_name  # type: ignore[union-attr]
        queue = self._queues.get(name)
        if queue is None:
            queue = self._queues[name] = _StreamQueue()
            self._workers[name] = asyncio.get_running_loop().create_task(self._drain(name, queue), name=f"repl:{name}")
        queue.items.append((conn, cmd))
        if not queue.wake.is_set():
            queue.idle.clear()
            queue.wake.set()
        self._backlog += weight
        if self._backlog >= self.max_backlog:
            self._capacity.clear()

    def backlog(self) -> int:
        """Commands received and not yet processed, over all streams."""
        return self._backlog

    def has_capacity(self) -> bool:
        """False while the backlog is at ``max_backlog``: transports then await :meth:`wait_for_capacity`."""
        return self._capacity.is_set()

    async def wait_for_capacity(self) -> None:
        """Return once the backlog is below ``max_backlog`` (transports await this between reads)."""
        if not self._capacity.is_set():
            await self._capacity.wait()

    async def _drain(self, name: str, queue: _StreamQueue) -> None:
        """Process a stream's commands in arrival order, taking everything queued at once.

        Working on the whole queue lets a run of RDATA advance the stream once, at its end, instead
        of once per token: the plugins still see every token's rows, in order, before the position
        moves past them, and waiters wake after both.
        """
        stream = self.streams[name]
        while True:
            if not queue.items:
                queue.idle.set()
                await queue.wake.wait()
                queue.wake.clear()
                continue
            commands = list(queue.items)
            queue.items.clear()
            try:
                await self._process(stream, commands)
            finally:
                self._backlog -= sum(len(cmd.tokens) if type(cmd) is RdataRun else 1 for _, cmd in commands)
                if not self._capacity.is_set() and self._backlog < self.max_backlog // 2:
                    self._capacity.set()

    async def _process(
        self, stream: ReplicatedStream, commands: list[tuple[Connection, wire.Command | RdataRun]]
    ) -> None:
        #: Per writer, the last token whose rows the plugins have seen but the position not yet passed.
        pending: dict[str, int] = {}
        for conn, cmd in commands:
            try:
                if type(cmd) is RdataRun:
                    await self._process_run(stream, conn, cmd, pending)
                elif type(cmd) is wire.RdataCommand:
                    await self._process_rdata(stream, conn, cmd, pending)
                elif isinstance(cmd, wire.PositionCommand):
                    await self._advance_pending(stream, pending)
                    await self._process_position(conn, cmd)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("failed to process %s on stream %s", type(cmd).__name__, stream.name)
        await self._advance_pending(stream, pending)

    async def _advance_pending(self, stream: ReplicatedStream, pending: dict[str, int]) -> None:
        for instance, token in pending.items():
            await self._deliver(stream, instance, token, [])
        pending.clear()

    async def _process_rdata(
        self, stream: ReplicatedStream, conn: Connection, cmd: wire.RdataCommand, pending: dict[str, int]
    ) -> None:
        try:
            row = stream.parse_row(cmd.row)
        except RowError:
            log.warning("dropping RDATA with a bad row from %s: %s", cmd.instance_name, cmd.to_line()[:500])
            return
        instance = cmd.instance_name
        if (cmd.stream_name, instance) not in self._connected.get(conn, ()):
            return  # wait for the POSITION, whose catch-up reads this row from the database
        key = (cmd.stream_name, instance)
        if cmd.token is None:
            self._batches.setdefault(key, []).append(row)
            return
        rows = self._batches.pop(key, None)
        if rows is None:
            rows = [row]
        else:
            rows.append(row)
        if cmd.token <= max(pending.get(instance, 0), stream.current_token(instance)):
            return  # already seen (a catch-up read it first)
        waiting = self._rows(stream, instance, cmd.token, rows)
        if waiting is not None:
            await waiting
        pending[instance] = cmd.token

    async def _process_run(
        self, stream: ReplicatedStream, conn: Connection, run: RdataRun, pending: dict[str, int]
    ) -> None:
        instance = run.instance_name
        if (run.stream_name, instance) not in self._connected.get(conn, ()):
            return  # wait for the POSITION, whose catch-up reads these rows from the database
        rows = stream.decode_rows(run.texts, run.array)
        key = (run.stream_name, instance)
        seen = max(pending.get(instance, 0), stream.current_token(instance))
        batch = self._batches.pop(key, None)
        if batch is None and None not in run.tokens and None not in rows:
            plain = cast("list[int]", run.tokens)
            if plain[0] > seen and _increasing(plain):
                # The common case, kept lean: one good row per new token, in order.
                await self._deliver_plain_run(stream, instance, plain, rows)
                pending[instance] = plain[-1]
                return
        call = self._rows
        for token, row, text in zip(run.tokens, rows, run.texts, strict=True):
            if row is None:
                log.warning("dropping RDATA with a bad row from %s on %s: %r", instance, stream.name, text[:500])
                continue
            if token is None:
                if batch is None:
                    batch = [row]
                else:
                    batch.append(row)
                continue
            if batch is None:
                group = [row]
            else:
                batch.append(row)
                group, batch = batch, None
            if token <= seen:
                continue  # already seen (a catch-up read it first)
            waiting = call(stream, instance, token, group)
            if waiting is not None:
                await waiting
            seen = pending[instance] = token
        if batch is not None:
            self._batches[key] = batch

    async def _deliver_plain_run(
        self, stream: ReplicatedStream, instance: str, tokens: list[int], rows: list[Any]
    ) -> None:
        """The pipeline's run stage for ``(token, [row])`` pairs, in order (one call for the run)."""
        self.rows_processed += len(tokens)
        try:
            waiting = self.sink.run(stream, instance, tokens, rows)
            if waiting is not None:
                await waiting
        except Exception:
            log.exception("the reader pipeline failed on a run of %s from %s", stream.name, instance)

    async def _process_position(self, conn: Connection, cmd: wire.PositionCommand) -> None:
        stream = self.streams[cmd.stream_name]
        key = (cmd.stream_name, cmd.instance_name)
        if key in self._connected.get(conn, ()) and stream.can_discard_position(cmd.instance_name, cmd.new_token):
            return
        if not stream.position_allowed(cmd.new_token):
            # TCP checks before dispatching; Redis cannot wait in its read callback, so here.
            reason = await self.check_position(conn, cmd)
            if reason is not None:
                self.senders.log_refusal(
                    conn, cmd.stream_name, cmd.instance_name, f"dropping {reason} (from {conn.name})"
                )
                return
        for pairs in self._connected.values():
            pairs.discard(key)
        self._batches.pop((cmd.stream_name, cmd.instance_name), None)
        current = stream.current_token(cmd.instance_name)
        if not cmd.prev_token <= current <= cmd.new_token:
            await self._catch_up(stream, cmd, current)
        await self._deliver(stream, cmd.instance_name, cmd.new_token, [])
        self._connected[conn].add(key)

    async def _catch_up(self, stream: ReplicatedStream, cmd: wire.PositionCommand, current: int) -> None:
        """Read the writer's rows after ``current`` from the database, a page at a time: every
        token's rows to the plugins, then one advance to the page's end (logged, with counts)."""
        writer = cmd.instance_name
        fields = {"stream": stream.name, "writer": writer, "from": current, "to": cmd.new_token}
        log.info("catch-up begun", extra={"fields": fields})
        started = time.monotonic()
        pages = rows = 0
        missing = True
        while missing:
            updates, upto, missing = await stream.get_updates_since(
                writer, current, cmd.new_token, limit=CATCH_UP_PAGE_ROWS
            )
            pages += 1
            rows += len(updates)
            for token, group in itertools.groupby(updates, key=lambda u: u[0]):
                waiting = self._rows(stream, writer, token, [row for _, row in group])
                if waiting is not None:
                    await waiting
            if missing:
                await self._deliver(stream, writer, upto, [])
            current = upto
        counts = self._catch_ups.setdefault(stream.name, [0, 0])
        counts[0] += pages
        counts[1] += rows
        seconds = round(time.monotonic() - started, 3)
        fields = {"stream": stream.name, "writer": writer, "pages": pages, "rows": rows, "seconds": seconds}
        log.info("catch-up finished", extra={"fields": fields})

    # -- delivery ----------------------------------------------------------------------------------

    def _rows(self, stream: ReplicatedStream, instance: str, token: int, rows: list[Any]) -> Awaitable[None] | None:
        """The pipeline's rows stage for one token; an awaitable if it must be awaited before advancing."""
        self.rows_processed += len(rows)
        try:
            return self.sink.rows(stream, instance, token, rows)
        except Exception:
            log.exception("the reader pipeline failed on %s from %s at %s", stream.name, instance, token)
            return None

    async def _deliver(self, stream: ReplicatedStream, instance: str, token: int, rows: list[Any]) -> None:
        """Plugins first, then the position, then waiters: the order readers rely on."""
        if rows:
            waiting = self._rows(stream, instance, token, rows)
            if waiting is not None:
                await waiting
        stream.advance(instance, token)
        try:
            self.sink.advanced(stream, instance, token)
        except Exception:
            log.exception("the reader pipeline failed waking for %s at %s", stream.name, token)
        self._wake(stream.name, instance, token)

    # -- waiting -----------------------------------------------------------------------------------

    def _wake(self, stream: str, instance: str, token: int) -> None:
        self.waiters.wake(stream, instance, token)

    async def wait_for_stream_position(self, instance: str, stream: str, position: int, timeout: float = 5.0) -> bool:
        """Wait until this process has processed ``stream`` from ``instance`` up to ``position``.

        Returns True when reached, False after ``timeout`` seconds (logged, not raised, as in the
        reference: the caller proceeds with possibly stale data rather than failing).
        """
        if instance == self.instance_name:
            return True
        s = self.streams.get(stream)
        if s is None:
            raise KeyError(f"unknown stream {stream!r}")
        if s.current_token(instance) >= position:
            return True
        return await self.waiters.wait(stream, instance, position, timeout)

    async def close(self) -> None:
        untrack(self)
        for task in self._workers.values():
            task.cancel()
        for task in self._workers.values():
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._workers.clear()
        self._queues.clear()

    async def drained(self) -> None:
        """Wait until every queued command has been processed (tests and orderly shutdown)."""
        for queue in list(self._queues.values()):
            await queue.idle.wait()


def _increasing(tokens: list[int]) -> bool:
    """Whether the tokens strictly increase (C-level checks: this runs for every run of rows)."""
    return len(set(tokens)) == len(tokens) and tokens == sorted(tokens)
