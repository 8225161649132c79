"""The writer side of replication: send what this process wrote, in order, to every peer.

The streamer is woken (:meth:`ReplicationStreamer.poke`) whenever one of its streams completes a
fact, and once a second in any case (positions also move without local data, e.g. an idle writer's
announced position follows the others). Each wake-up, per stream:

* rows written here since the last send are sent as RDATA, every row but the last of one token with
  the token ``batch``. Rows appended to a table-backed stream are captured as they commit (``INSERT
  ... RETURNING`` the stored values) and sent from memory; anything else is read back through the
  stream's update function (see :meth:`ReplicatedStream.get_wire_updates`);
* if the position moved past the last row (or there were no rows), a ``POSITION last current`` says
  that nothing was written in between.

``REPLICATE`` from a peer sets a flag rather than answering at once: the announcement
(``POSITION s me t t`` per stream) goes out on the next loop iteration, after any backlog of rows
that precedes it, so a POSITION never overtakes the RDATA it would make a reader skip (PR #16639 of
the reference). With nobody connected, the cursors simply jump to the current positions: readers
that connect later catch up from the database.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Iterable
from typing import Protocol

from factstream.replication import wire
from factstream.replication.stream import ReplicatedStream

log = logging.getLogger(__name__)


class Outlet(Protocol):
    """Where the streamer's commands go (a transport)."""

    def send(self, command: wire.Command) -> None: ...

    def send_lines(self, lines: list[bytes]) -> None:
        """Send encoded lines, each ending in :attr:`line_end` if the outlet has one, else ``b"\\n"``."""

    def has_peers(self) -> bool: ...


class ReplicationStreamer:
    """Sends this process's streams (those it may write) to every peer of a transport."""

    def __init__(
        self,
        instance_name: str,
        streams: Iterable[ReplicatedStream],
        outlet: Outlet,
        *,
        tick: float = 1.0,
        linger: float = 0.0,
        linger_rows: int = 50,
    ) -> None:
        self.instance_name = instance_name
        self.streams = [s for s in streams if s.id_gen.is_writer]
        self.attach(outlet)
        self.tick = tick
        #: After a pass that sent at least ``linger_rows`` rows, wait ``linger`` seconds before the
        #: next one: while a writer appends in bulk, rows then go out in fewer, larger sends (each
        #: send wakes every reader). A pass sending fewer rows goes out at once, so a writer of
        #: single facts sees no added latency.
        self.linger = linger
        self.linger_rows = linger_rows
        self._wake = asyncio.Event()
        self._announce = False
        # A kept stream's writer starts a new run (its facts went with the last process): its first
        # pass announces every position before any row, so a reader still linked (Redis) sees the new
        # run's epoch and resets before it accepts the run's rows (factstream.replication.kept).
        self._skipped = any(s.kept is not None for s in self.streams)
        self._task: asyncio.Task[None] | None = None
        self.rows_sent = 0
        #: The wall clock its POSITIONs are stamped with (docs/replication.md, "Lag"); tests skew it.
        self.clock: Callable[[], float] = time.time
        for stream in self.streams:
            stream.id_gen.add_completion_listener(self.poke)

    def attach(self, outlet: Outlet) -> None:
        """Send through ``outlet`` from now on (a new transport after a reconnection)."""
        self.send = outlet.send
        self.send_lines = outlet.send_lines
        self.line_end: bytes = getattr(outlet, "line_end", b"\n")
        self.has_peers = outlet.has_peers

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="repl-streamer")

    def poke(self) -> None:
        self._wake.set()

    def mark_gap(self) -> None:
        """Commands this streamer sent were lost: send every stream's ``POSITION t t`` now.

        Called by a transport before it sends anything else; a reader behind ``t`` then catches up
        from the database instead of accepting later rows across the gap.
        """
        self._send_positions()

    def _send_positions(self) -> None:
        """``POSITION s me t t`` for every stream, ``t`` the last token sent."""
        stamp = self._stamp()
        for stream in self.streams:
            last = stream.last_token
            self.send(wire.PositionCommand(stream.name, self.instance_name, last, last, stamp))

    def _stamp(self) -> int:
        """This process's clock in milliseconds, for the POSITIONs it sends (see :attr:`clock`)."""
        return int(self.clock() * 1000)

    def announce(self) -> None:
        """Announce every stream's position on the next iteration (after any backlog)."""
        self._announce = True
        self._wake.set()

    async def _run(self) -> None:
        while True:
            # asyncio.timeout, not wait_for: on Python 3.11 wait_for can swallow a cancellation that
            # arrives as the event is set, and close() would then wait for ever.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.tick):
                    await self._wake.wait()
            self._wake.clear()
            try:
                sent = self.rows_sent
                await self.send_pending()
                if self.linger and self.rows_sent - sent >= self.linger_rows:
                    await asyncio.sleep(self.linger)
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("replication streamer failed; retrying on the next wake-up")
                await asyncio.sleep(0.5)

    async def send_pending(self) -> None:
        """One pass: backlog first, then the announcement if one was asked for."""
        if not self.has_peers():
            for stream in self.streams:
                stream.set_capturing(False)
                stream.discard_updates_and_advance()
            self._announce = False
            self._skipped = True
            return
        if self._skipped:
            # Rows were skipped while we thought nobody listened. If someone did (a transport can
            # only estimate that), rows sent now would carry them past the gap: announce the
            # position first, so a reader behind it catches up from the database.
            self._skipped = False
            self._send_positions()
        for stream in self.streams:
            stream.set_capturing(True)
        more = True
        while more:
            more = False
            for stream in self.streams:
                if stream.last_token == stream.current_token(self.instance_name):
                    continue
                last = stream.last_token
                tokens, rows, current, limited = await stream.get_wire_updates()
                more |= limited
                if not tokens:
                    if current > last:
                        self.send(wire.PositionCommand(stream.name, self.instance_name, last, current, self._stamp()))
                    continue
                last = tokens[-1]
                self.send_lines(
                    wire.encode_rdata_run(stream.name, self.instance_name, _batched(tokens), rows, self.line_end)
                )
                self.rows_sent += len(tokens)
                if last < current:
                    self.send(wire.PositionCommand(stream.name, self.instance_name, last, current, self._stamp()))
        if self._announce:
            self._announce = False
            self._send_positions()

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None


def _batched(tokens: list[int]) -> list[int | None]:
    """The wire tokens: every row but the last of one token marked ``batch`` (``None``)."""
    if len(set(tokens)) == len(tokens):
        return list(tokens)  # one row per token, the usual case
    last = len(tokens) - 1
    return [t if i == last or tokens[i + 1] != t else None for i, t in enumerate(tokens)]
