"""The writer side of replication: send what this process wrote, in order, to every peer.

The streamer is woken (:meth:`ReplicationStreamer.poke`) whenever one of its streams completes a
fact, and once a second in any case (positions also move without local data, e.g. an idle writer's
announced position follows the others). Each wake-up, per stream:

* rows written here since the last send are read back through the stream's update function and sent
  as RDATA, every row but the last of one token with the token ``batch``;
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
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from factstream.replication import commands as c
from factstream.replication.stream import ReplicatedStream

log = logging.getLogger(__name__)


class ReplicationStreamer:
    """Sends this process's streams (those it may write) to all connections through ``send``."""

    def __init__(
        self,
        instance_name: str,
        streams: Iterable[ReplicatedStream],
        send: Callable[[c.Command], None],
        has_peers: Callable[[], bool],
        *,
        send_lines: Callable[[list[bytes]], None] | None = None,
        tick: float = 1.0,
    ) -> None:
        self.instance_name = instance_name
        self.streams = [s for s in streams if s.id_gen.is_writer]
        self.send = send
        self.send_lines = send_lines or self._send_lines_one_by_one
        self.has_peers = has_peers
        self.tick = tick
        self._wake = asyncio.Event()
        self._announce = False
        self._skipped = False
        self._task: asyncio.Task[None] | None = None
        self.rows_sent = 0
        for stream in self.streams:
            stream.id_gen.add_completion_listener(self.poke)

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run(), name="repl-streamer")

    def poke(self) -> None:
        self._wake.set()

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
                await self.send_pending()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("replication streamer failed; retrying on the next wake-up")
                await asyncio.sleep(0.5)

    async def send_pending(self) -> None:
        """One pass: backlog first, then the announcement if one was asked for."""
        if not self.has_peers():
            for stream in self.streams:
                stream.discard_updates_and_advance()
            self._announce = False
            self._skipped = True
            return
        if self._skipped:
            # Rows were skipped while we thought nobody listened. If someone did (a transport can
            # only estimate that), rows sent now would carry them past the gap: announce the
            # position first, so a reader behind it catches up from the database.
            self._skipped = False
            for stream in self.streams:
                self.send(c.PositionCommand(stream.name, self.instance_name, stream.last_token, stream.last_token))
        more = True
        while more:
            more = False
            for stream in self.streams:
                if stream.last_token == stream.current_token(self.instance_name):
                    continue
                last = stream.last_token
                updates, current, limited = await stream.get_updates()
                more |= limited
                if not updates:
                    if current > last:
                        self.send(c.PositionCommand(stream.name, self.instance_name, last, current))
                    continue
                self.send_lines(c.encode_rdata_lines(stream.name, self.instance_name, _wire_rows(stream, updates)))
                self.rows_sent += len(updates)
                last = updates[-1][0]
                if last < current:
                    self.send(c.PositionCommand(stream.name, self.instance_name, last, current))
        if self._announce:
            self._announce = False
            for stream in self.streams:
                token = stream.last_token
                self.send(c.PositionCommand(stream.name, self.instance_name, token, token))

    def _send_lines_one_by_one(self, lines: list[bytes]) -> None:
        for line in lines:
            self.send(c.parse_command(line))

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None


def _wire_rows(stream: ReplicatedStream, updates: list[tuple[int, Any]]) -> Iterator[tuple[int | None, Any]]:
    """``(token, wire row)`` pairs, every row but the last of one token marked ``batch`` (``None``)."""
    encode = stream.encode_row
    last = len(updates) - 1
    for i, (token, row) in enumerate(updates):
        yield (token if i == last or updates[i + 1][0] != token else None), encode(row)
