"""Start-up state of a stream's positions, computed from what the database says. No I/O.

The generator reads the inputs (:class:`DurableState`) and this module decides what the process
starts from. Crash safety rests on durable facts only: the sequence (never goes back, except after a
failover, which :func:`plan_sequence_repair` handles at start-up and :func:`plan_reissue_repair` while
running), the rows in the backing tables, and the
``stream_positions`` rows, which are only ever a lower bound because they are written lazily.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from factstream.idgen.positions import PositionTracker


@dataclass(frozen=True)
class DurableState:
    """What the database says about one stream (values normalised: positive, increasing)."""

    #: ``sequence last_value`` (0 when the sequence was never called).
    sequence_last: int
    #: Highest ID in any backing table (0 when empty).
    table_max: int
    #: ``stream_positions`` rows: instance -> position.
    stored_positions: Mapping[str, int]
    #: ``(id, instance)`` of rows above the lowest stored position of a counted writer, any order.
    rows_above: Sequence[tuple[int, str]] = field(default_factory=tuple)


@dataclass(frozen=True)
class SequenceRepair:
    """The sequence is behind IDs already used or announced: move it to ``new_last``."""

    old_last: int
    new_last: int
    reason: str


def plan_sequence_repair(state: DurableState, margin: int) -> SequenceRepair | None:
    """Decide whether the sequence must jump forward (and where to), or ``None`` if it is fine.

    A sequence behind the table is possible after a restore or a manual edit; behind
    ``stream_positions`` after a failover to a replica that had not seen the last sequence WAL records
    (PostgreSQL logs sequence advances 32 at a time and only flushes them with a commit). Positions
    announced over replication may exceed what ``stream_positions`` holds by whatever was allocated
    during one persistence interval, so the sequence jumps ``margin`` past the highest known ID: a gap
    costs nothing, a reused ID would make readers skip a fact.
    """
    highest_stored = max(state.stored_positions.values(), default=0)
    if state.sequence_last >= state.table_max and state.sequence_last >= highest_stored:
        return None
    reasons = []
    if state.table_max > state.sequence_last:
        reasons.append(f"the backing tables hold ID {state.table_max}")
    if highest_stored > state.sequence_last:
        writer = max(state.stored_positions, key=lambda w: state.stored_positions[w])
        reasons.append(f"stream_positions holds {highest_stored} for writer {writer!r}")
    target = max(state.table_max, highest_stored) + margin
    return SequenceRepair(state.sequence_last, target, " and ".join(reasons))


def plan_reissue_repair(state: DurableState, margin: int, *, seen: int, reissued: int | None) -> SequenceRepair:
    """Where to move a sequence that handed a running writer an ID at or below ``seen``.

    ``seen`` is the highest ID the writer had seen allocated (reserved by itself, announced by
    another writer, or found at start-up); a sequence that never goes back hands out only IDs above
    it. One that went back (a failover to a replica that lacked its last advances) re-issues IDs that
    may already be committed. ``reissued`` is the offending ID, ``None`` when the statement that got
    it did not say which. The sequence jumps ``margin`` past everything known, as at start-up
    (:func:`plan_sequence_repair`), and past ``seen`` too: that ID may not be in any table yet.
    """
    handed = "an ID" if reissued is None else f"ID {reissued}"
    reason = f"it handed out {handed} at or below ID {seen}, which this process had already seen allocated"
    highest_stored = max(state.stored_positions.values(), default=0)
    return SequenceRepair(state.sequence_last, max(seen, state.table_max, highest_stored) + margin, reason)


def counted_writers(writers: Sequence[str], stored: Mapping[str, int], alive: set[str] | None) -> list[str]:
    """Writers whose positions bound the watermark at start-up.

    Configured writers always count. Any other instance with a ``stream_positions`` row (a writer
    removed from the configuration, or an instance of a stream anyone may write) counts while it is
    alive, because it may hold unfinished IDs; the reference deleted such rows at once and could pass
    them. A dead one holds none (its transactions died with its connections). ``alive=None`` means
    liveness is unknown: every stored writer counts.
    """
    extra = [w for w in stored if w not in writers and (alive is None or w in alive)]
    return list(writers) + sorted(extra)


def initial_tracker(
    *,
    local: str,
    writers: Sequence[str],
    state: DurableState,
    counted: Sequence[str],
    dead: Sequence[str] = (),
) -> PositionTracker:
    """The tracker a process starts with, from the durable state (after any sequence repair).

    ``writers`` empty means anyone may write. ``state`` must have been read sequence first: then any
    writer that reserved an ID at or below ``state.sequence_last`` had already registered its row.
    ``dead`` lists configured writers whose process is known to be gone (checked after that read).

    Every position a writer announces must be an ID known to be complete (readers add announced
    positions to their run of completed IDs). So a restarting writer does not take the sequence head
    as its position, as the reference did: that ID may be another writer's, still in flight. Nothing
    of its own is in flight at start-up, so it may take the highest ID known to be complete.
    """
    positions = {w: p for w, p in state.stored_positions.items() if w in counted}
    if positions:
        floor = min(positions.values())
        tracker = PositionTracker(local=local, positions=positions, persisted_upto=floor)
        for stream_id, _ in sorted(state.rows_above):
            if stream_id > floor:
                tracker.advance_known(stream_id)
    else:
        tracker = PositionTracker(local=local, positions={}, persisted_upto=max(state.table_max, 1))

    for writer in writers:
        if writer not in positions:
            # A configured writer with no row never reserved anything (it registers before it does).
            tracker.seed(writer, tracker.persisted_upto)
    if not writers or local in writers:
        others_gone = all(w in dead for w in counted if w != local)
        # With every other counted writer gone, every ID up to the sequence head is complete (ours)
        # or abandoned (theirs), so the head itself is safe to announce.
        tracker.seed(local, max(tracker.max_seen, state.sequence_last) if others_gone else tracker.max_seen)
    for writer in dead:
        # A configured writer whose process is gone holds nothing unfinished: it cannot hold the
        # watermark below the sequence head (the reference kept readers waiting for it to return).
        tracker.assume_idle(writer, state.sequence_last)
    return tracker
