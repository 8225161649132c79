"""The position-tracking state machine of one stream, as seen by one process. No I/O.

All values here are *normalised*: positive and increasing, whatever the stream's direction (a backwards
stream's IDs -1, -2, ... are tracked as 1, 2, ...; the generator converts on the way in and out).

Vocabulary (see docs/idgen.md):

* A *writer's position* is the largest ID such that every ID that writer reserved at or below it has
  completed (committed or rolled back). This process knows its own exactly and other writers' from
  replication (:meth:`PositionTracker.advance`).
* The *watermark* ("persisted upto") is the largest ID such that every ID at or below it, from any
  writer, has completed. Readers may consume rows up to it without ever skipping one that commits later.

Why the watermark is safe:

1. Every ID at or below the minimum of all writers' positions has completed: each such ID belongs to
   some writer, and that writer's position is at or above it. This needs every writer that may hold IDs
   to be in ``positions``; a writer that joins must announce itself (be ``advance``d) before it
   reserves, and a writer removed from the configuration is kept until it is known to be gone.
2. This process does not count itself in that minimum when it has nothing reserved or being fetched:
   any ID it reserves later comes from the sequence and so is above everything already handed out.
3. Above the minimum, the watermark moves only through an unbroken run of IDs known to be complete
   (``_known``); an unfinished ID is never in that set, so a run stops below it.

Reserving happens in two steps because the sequence call is asynchronous: :meth:`begin_fetch` records
the highest ID seen so far *before* asking the sequence, and :meth:`end_fetch` records the IDs it gave.
While a fetch is in flight this process's position cannot pass the recorded value, since the IDs being
fetched may be anything above it.
"""

from __future__ import annotations

import heapq
from collections.abc import Iterable, Mapping


class PositionTracker:
    """Reserve/complete bookkeeping, per-writer positions and the watermark for one stream."""

    def __init__(
        self,
        *,
        local: str,
        positions: Mapping[str, int],
        persisted_upto: int,
        max_seen: int | None = None,
        known_complete: Iterable[int] = (),
    ) -> None:
        self.local = local
        self._positions: dict[str, int] = dict(positions)
        self._persisted_upto = persisted_upto
        self._max_seen = max(max_seen or 0, persisted_upto, *self._positions.values())
        self._max_local = self._max_seen
        #: The highest ID this process completed (0: none since it started).
        self._max_completed = 0
        self._unfinished: set[int] = set()
        self._unfinished_heap: list[int] = []
        self._in_flight: list[int] = []
        self._finished: set[int] = set()
        self._known: list[int] = []
        for stream_id in sorted(known_complete):
            self._note_complete(stream_id)

    # -- reserving ---------------------------------------------------------------------------------

    def begin_fetch(self) -> int:
        """Call before asking the sequence for IDs; pass the result to :meth:`end_fetch`.

        The result is the highest ID seen allocated so far. Every ID the sequence hands out after
        this call is above it, unless the sequence went back: the generator refuses such IDs
        before they reach :meth:`end_fetch`, which refuses them too.
        """
        token = self._max_seen
        self._in_flight.append(token)
        return token

    def end_fetch(self, token: int, ids: Iterable[int]) -> None:
        """Record the IDs the sequence returned (none if the fetch failed)."""
        ids = list(ids)
        if ids:
            floor = max(token, self._persisted_upto)
            clash = [i for i in ids if i <= floor or i in self._unfinished]
            if clash or len(set(ids)) != len(ids):
                stream_id = clash[0] if clash else ids[0]
                self._in_flight.remove(token)
                raise ValueError(
                    f"stream ID {stream_id} handed out twice (seen before the fetch: {token}, "
                    f"watermark {self._persisted_upto})"
                )
            self._unfinished.update(ids)
            heap = self._unfinished_heap
            if len(ids) > 8:
                heap.extend(ids)
                heapq.heapify(heap)
            else:
                for stream_id in ids:
                    heapq.heappush(heap, stream_id)
            self._max_seen = max(self._max_seen, max(ids))
        self._in_flight.remove(token)

    # -- completing --------------------------------------------------------------------------------

    def complete(self, ids: Iterable[int]) -> None:
        """Mark reserved IDs complete (committed or rolled back: both count)."""
        ids = list(ids)
        stray = [i for i in ids if i not in self._unfinished]
        if stray:
            raise ValueError(f"stream ID {stray[0]} completed but not reserved by {self.local}")
        self._unfinished.difference_update(ids)
        self._finished.update(ids)
        if ids:
            self._max_completed = max(self._max_completed, max(ids))

        limit = self._outstanding_floor()
        if limit is None:
            new_position = max(self._finished) if self._finished else None
            self._finished.clear()
        else:
            below = [i for i in self._finished if i < limit]
            new_position = max(below) if below else None
            self._finished = {i for i in self._finished if i >= limit}
        if new_position is not None:
            self._positions[self.local] = max(self._positions.get(self.local, 0), new_position)
            self._max_local = max(self._max_local, new_position)
        for stream_id in ids:
            heapq.heappush(self._known, stream_id)
        self._recompute()

    def advance(self, instance: str, position: int) -> None:
        """Another writer announced (through replication) that its position is ``position``."""
        self._positions[instance] = max(self._positions.get(instance, 0), position)
        self._max_seen = max(self._max_seen, position)
        self._note_complete(position)

    def advance_known(self, stream_id: int) -> None:
        """Record that ``stream_id`` is complete without knowing whose it is (a row seen in a table)."""
        self._max_seen = max(self._max_seen, stream_id)
        self._note_complete(stream_id)

    def seed(self, instance: str, position: int) -> None:
        """Start-up only: assume ``instance`` is at ``position`` (a writer with nothing recorded)."""
        self._positions[instance] = max(self._positions.get(instance, 0), position)
        self._max_seen = max(self._max_seen, position)
        self._max_local = max(self._max_local, self._max_seen)
        self._recompute()

    def assume_idle(self, instance: str, position: int) -> None:
        """Start-up only: ``instance`` is known to hold nothing unfinished (its process is gone), so
        any ID it hands out later comes from the sequence, above ``position`` (the sequence head read
        before its liveness was checked). Unlike :meth:`seed` this does not make ``position`` an ID
        this process may announce: it may be another writer's, still in flight."""
        if instance != self.local:
            self._positions[instance] = max(self._positions.get(instance, 0), position)
            self._recompute()

    def forget_writer(self, instance: str) -> None:
        """Stop counting a writer known to be gone for good (it holds no unfinished IDs)."""
        if instance != self.local:
            self._positions.pop(instance, None)
            self._recompute()

    # -- reading -----------------------------------------------------------------------------------

    @property
    def persisted_upto(self) -> int:
        return self._persisted_upto

    def position_for_writer(self, instance: str) -> int:
        """The maximal view of a writer's position; for this process, the position it announces."""
        if instance == self.local:
            return self._max_local
        return max(self._positions.get(instance, self._persisted_upto), self._persisted_upto)

    def minimal_local_position(self) -> int:
        """The position of this process's actual writes (what another process may wait for)."""
        return self._positions.get(self.local, self._persisted_upto)

    def positions(self) -> dict[str, int]:
        return dict(self._positions)

    def wrote_above(self, position: int) -> bool:
        """Whether this process completed an ID above ``position`` since it started (or its own
        position is above it): a streamer whose last send ended at ``position`` has rows to send, not
        only a position to announce.

        The own position alone does not tell: it stays below a reservation whose sequence call is
        in flight, while a later reservation's ID completes above it, and the watermark and the
        announced position pass that ID (through the run of IDs known to be complete).
        """
        return self._max_completed > position or self.minimal_local_position() > position

    @property
    def max_seen(self) -> int:
        return self._max_seen

    @property
    def unfinished(self) -> frozenset[int]:
        return frozenset(self._unfinished)

    @property
    def in_flight(self) -> int:
        return len(self._in_flight)

    def has_outstanding(self) -> bool:
        return bool(self._unfinished or self._in_flight)

    # -- internals ---------------------------------------------------------------------------------

    def _min_unfinished(self) -> int | None:
        heap = self._unfinished_heap
        while heap and heap[0] not in self._unfinished:
            heapq.heappop(heap)
        return heap[0] if heap else None

    def _outstanding_floor(self) -> int | None:
        """The lowest ID this process may still complete: its position must stay below it."""
        candidates = []
        first = self._min_unfinished()
        if first is not None:
            candidates.append(first)
        if self._in_flight:
            candidates.append(min(self._in_flight) + 1)
        return min(candidates) if candidates else None

    def _note_complete(self, stream_id: int) -> None:
        heapq.heappush(self._known, stream_id)
        self._recompute()

    def _recompute(self) -> None:
        ours = self._positions.get(self.local, 0)
        others = [p for w, p in self._positions.items() if w != self.local]
        floor = min(others) if others else ours
        outstanding = self._outstanding_floor()
        if outstanding is not None:
            # Never reach our own first outstanding ID, even before we have a position of our own.
            floor = min(floor, outstanding - 1, ours or outstanding)
        self._persisted_upto = max(self._persisted_upto, floor)

        # Above the minimum, move only through an unbroken run of completed IDs.
        known = self._known
        while known and known[0] <= self._persisted_upto:
            heapq.heappop(known)
        while known and known[0] == self._persisted_upto + 1:
            self._persisted_upto = heapq.heappop(known)
            while known and known[0] <= self._persisted_upto:
                heapq.heappop(known)

        self._max_local = max(self._max_local, self._persisted_upto)
        if not self.has_outstanding():
            self._max_local = max(self._max_local, self._max_seen)
