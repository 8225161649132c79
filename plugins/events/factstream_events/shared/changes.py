"""Stream change caches: "which of these rooms (users) changed after stream ID T?" without a query.

A :class:`ChangeCache` maps an entity (a room, a user) to the last ``events`` stream ID that touched
it. It knows every change after :attr:`ChangeCache.earliest`: asked about a position at or after
that, an entity it does not hold has not changed; asked about an earlier position it answers
"unsure" (``None``), and the caller queries the database. It is bounded: when full, the entries of
the oldest changes go and ``earliest`` moves up to the newest ID they had, so its answers stay
true. A cache made at start-up knows every change after the stream's position then (the changes after
it arrive as rows); :meth:`ChangeCache.prefill` then teaches it the latest changes before that
from the database, so a process that just started answers for recent tokens too.

Entries are kept in the order they were last changed (a change moves its entity to the end), which
is stream order up to the small reordering of several writers; :meth:`ChangeCache.changed` takes
the maximum, and eviction raises ``earliest`` to the maximum evicted ID, so a late-arriving lower
ID never makes an answer wrong.
"""

from __future__ import annotations

from collections.abc import Iterable

DEFAULT_MAX_ENTRIES = 100_000


class ChangeCache:
    """Entity -> last stream ID that changed it, with a lower bound of knowledge (module docstring)."""

    def __init__(self, name: str, earliest: int, max_entries: int = DEFAULT_MAX_ENTRIES) -> None:
        if max_entries < 1:
            raise ValueError(f"change cache {name}: max_entries must be at least 1, not {max_entries}")
        self.name = name
        #: Every change after this ID is known.
        self.earliest = earliest
        self.max_entries = max_entries
        self._last: dict[str, int] = {}

    def __len__(self) -> int:
        return len(self._last)

    def changed(self, entity: str, stream_id: int) -> None:
        """Record that ``entity`` changed at ``stream_id``."""
        if stream_id <= self.earliest:
            return  # already covered by the "unsure" answer below earliest
        last = self._last.pop(entity, None)
        self._last[entity] = stream_id if last is None else max(last, stream_id)
        while len(self._last) > self.max_entries:
            oldest = next(iter(self._last))
            self.earliest = max(self.earliest, self._last.pop(oldest))

    def unsure_before(self, stream_id: int) -> None:
        """Any entity may have changed at ``stream_id``, and which is not known (a ``state-all`` row):
        answer "unsure" for every earlier position from now on."""
        if stream_id <= self.earliest:
            return
        self.earliest = stream_id
        self._last = {e: s for e, s in self._last.items() if s > stream_id}

    def last_change(self, entity: str) -> int | None:
        """The last change of ``entity`` this cache knows (None: none after :attr:`earliest`)."""
        return self._last.get(entity)

    def has_changed_since(self, entity: str, stream_id: int) -> bool:
        """Whether ``entity`` may have changed after ``stream_id`` (True when unsure)."""
        if stream_id < self.earliest:
            return True
        last = self._last.get(entity)
        return last is not None and last > stream_id

    def changed_since(self, entities: Iterable[str], stream_id: int) -> set[str] | None:
        """The ``entities`` that changed after ``stream_id``; None when unsure (ask the database)."""
        if stream_id < self.earliest:
            return None
        last = self._last
        return {e for e in entities if last.get(e, stream_id) > stream_id}

    def prefill(self, changes: Iterable[tuple[str, int]], floor: int) -> None:
        """Learn older changes from the database: ``changes`` are ``(entity, stream ID)`` pairs that
        hold every change after ``floor`` (0: every change there is). Merged with what the cache
        learnt since it was made, so a change delivered meanwhile is not lost."""
        if floor >= self.earliest:
            return
        merged = dict(self._last)
        for entity, stream_id in changes:
            if stream_id > floor:
                merged[entity] = max(stream_id, merged.get(entity, stream_id))
        self._last = dict(sorted(merged.items(), key=lambda item: item[1]))
        self.earliest = floor
        while len(self._last) > self.max_entries:
            oldest = next(iter(self._last))
            self.earliest = max(self.earliest, self._last.pop(oldest))
