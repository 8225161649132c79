"""``KeptPositions``: the positions of a stream whose facts its writer keeps (no table, no sequence).

A kept stream (``StreamSpec(kept=True)``: typing notifications, say) has no backing table, so there is
nothing to hand IDs out from nor to persist positions in. Its writer counts in memory instead, and
starts each run at an *epoch*: the wall clock in microseconds when it started (or one past the last
position it handed out, if the clock reads less). A position is therefore ``epoch + n`` after ``n``
writes, and every position of a run is above every position of the runs before it as long as a run
writes less than once per microsecond on average and the clock does not step back by more than the
time the writer was down (docs/writing-plugins.md, "Streams without a table", says what happens
then). So positions never go backwards across a restart: a sync token holding a position from before
the restart compares below every position after it (it neither stalls, waiting for a counter to
climb back, nor skips what the new run wrote), and a reader that finds its view of the writer below
the writer's epoch knows the writer restarted (``factstream.replication.kept``).

The class offers the reading side of :class:`~factstream.idgen.generator.MultiWriterIdGenerator`
(what replication, ``/sync`` and the health pages read), and :meth:`next` for the writer.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence

from factstream.idgen.errors import IdGeneratorError

#: How far ahead of every position it knows a reader accepts a client's token for a kept stream:
#: a day of writes at one per microsecond. Anything further is a tampered token and is clamped.
FUTURE_SLACK = 86_400 * 1_000_000


def clock_epoch() -> int:
    """The wall clock in microseconds: where a kept stream's writer starts its run."""
    return time.time_ns() // 1000


class KeptPositions:
    """Positions of a kept stream, in this process (module docstring).

    ``writers`` lists the instances allowed to write (empty: anyone). On a writer, the local position
    starts at :attr:`epoch`; elsewhere every writer is at 0 until replication says otherwise.
    """

    positive = True
    factor = 1
    #: Kept streams have no rows to read back: nothing is reserved before a start.
    reserved_before_start = 0
    capture = None

    def __init__(
        self,
        *,
        stream_name: str,
        writers: Sequence[str],
        instance_name: str,
        clock: Callable[[], int] = clock_epoch,
        floor: int = 0,
    ) -> None:
        self.stream_name = stream_name
        self.writers = list(writers)
        self.instance_name = instance_name
        self._clock = clock
        #: Where this process's run started (0 when it does not write the stream).
        self.epoch = max(clock(), floor + 1, 1) if self.is_writer else 0
        self._positions: dict[str, int] = {instance_name: self.epoch} if self.is_writer else {}
        self._listeners: list[Callable[[], None]] = []

    @property
    def is_writer(self) -> bool:
        return not self.writers or self.instance_name in self.writers

    async def start(self) -> KeptPositions:
        return self

    async def close(self) -> None:
        return None

    # -- writing -----------------------------------------------------------------------------------

    def next(self) -> int:
        """Move this writer's position one on and return it; listeners (the streamer) are called."""
        if not self.is_writer:
            raise IdGeneratorError(
                f"instance {self.instance_name!r} cannot write stream {self.stream_name!r} "
                f"(writers: {', '.join(self.writers)})"
            )
        position = self._positions[self.instance_name] + 1
        self._positions[self.instance_name] = position
        for listener in self._listeners:
            listener()
        return position

    def add_completion_listener(self, callback: Callable[[], None]) -> None:
        """Call ``callback()`` after every :meth:`next`."""
        self._listeners.append(callback)

    # -- reading -----------------------------------------------------------------------------------

    def get_current_token(self) -> int:
        """The lowest position of the writers this process knows of (every writer's facts up to it are
        here); 0 while it knows none."""
        known = [self._positions.get(w, 0) for w in self.writers] if self.writers else list(self._positions.values())
        return min(known, default=0)

    def get_persisted_upto_position(self) -> int:
        return self.get_current_token()

    def get_current_token_for_writer(self, instance: str) -> int:
        return self._positions.get(instance, 0)

    def get_slowest_writer_token(self) -> int:
        return self.get_current_token()

    def get_minimal_local_current_token(self) -> int:
        return self._positions.get(self.instance_name, 0)

    def wrote_after(self, token: int) -> bool:
        return self._positions.get(self.instance_name, 0) > token

    def get_positions(self) -> dict[str, int]:
        return dict(self._positions)

    def advance(self, instance: str, token: int) -> None:
        """Replication says ``instance`` has reached ``token``. Never moves anything backwards."""
        if token <= 0:
            raise ValueError(f"stream {self.stream_name!r}: position {token} is on the wrong side of zero")
        if token > self._positions.get(instance, 0):
            self._positions[instance] = token

    async def get_max_allocated_token(self) -> int:
        """The highest position a client's token may hold: nothing is allocated ahead of time, so the
        highest position known, or the clock, plus :data:`FUTURE_SLACK`."""
        return max([self._clock(), *self._positions.values()]) + FUTURE_SLACK

    async def check_retired_writers(self) -> list[str]:
        return []

    def __repr__(self) -> str:
        return f"<KeptPositions {self.stream_name} on {self.instance_name}>"
