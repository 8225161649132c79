"""Hypothesis stateful test: several generators of one stream, over a model of the database.

Each instance runs the real :class:`PositionTracker` and starts through the real start-up planning
(:func:`counted_writers`, :func:`initial_tracker`), exactly as ``MultiWriterIdGenerator.start`` uses
them; only PostgreSQL is replaced by a model (sequence, committed rows, ``stream_positions``, live
leases). Rules interleave reserves (the sequence call and its answer are separate steps), commits,
rollbacks, replication of announced positions, lazy persistence, crashes, restarts and writers being
added to or removed from the configuration.

Invariants after every step:

* no instance's watermark is at or past an ID that a live writer reserved and has not completed,
  and no instance's view of a writer's position is at or past one of that writer's unfinished IDs;
* within one incarnation, the watermark and every writer position it knows never decrease;
* a fact commits only above every watermark (so no reader has already moved past it);
* at the end, once everything completes and every writer has announced, all instances agree and
  their watermark covers every committed fact.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from factstream.idgen.positions import PositionTracker
from factstream.idgen.recovery import DurableState, counted_writers, initial_tracker

INSTANCES = ["a", "b", "c", "d"]


@dataclass
class Incarnation:
    name: str
    writers: list[str]  # its configuration snapshot; [] = anyone may write
    tracker: PositionTracker
    pending: set[int] = field(default_factory=set)
    fetching: list[tuple[int, list[int]]] = field(default_factory=list)
    last_watermark: int = 0
    last_positions: dict[str, int] = field(default_factory=dict)

    @property
    def is_writer(self) -> bool:
        return not self.writers or self.name in self.writers

    def unfinished(self) -> set[int]:
        return self.pending | {i for _, ids in self.fetching for i in ids}


class StreamModel(RuleBasedStateMachine):
    any_writer = False  # True: a stream anyone may write (writers=[])

    def __init__(self) -> None:
        super().__init__()
        self.sequence_last = 1  # a new sequence is advanced once: the first ID is 2
        self.rows: dict[int, str] = {}
        self.stored: dict[str, int] = {}
        self.config: set[str] = set()
        self.running: dict[str, Incarnation] = {}

    # -- the database's view -------------------------------------------------------------------------

    def durable_state(self, floor: int | None) -> DurableState:
        rows_above = [(i, w) for i, w in self.rows.items() if floor is not None and i > floor]
        return DurableState(self.sequence_last, max(self.rows, default=0), dict(self.stored), rows_above)

    def start(self, name: str) -> None:
        writers = [] if self.any_writer else sorted(self.config)
        alive = self.leases() | {name}
        others = [w for w in self.stored if w not in writers and w != name]
        for dead in [w for w in others if w not in alive]:
            del self.stored[dead]
        counted = counted_writers(writers, self.stored, alive)
        dead = [w for w in writers if w not in alive]
        floor = min((self.stored[w] for w in counted if w in self.stored), default=None)
        state = self.durable_state(floor)
        tracker = initial_tracker(local=name, writers=writers, state=state, counted=counted, dead=dead)
        inc = Incarnation(name, writers, tracker)
        self.running[name] = inc
        if inc.is_writer:
            # Register the row before anything is reserved, then announce to every running reader.
            self.stored[name] = max(self.stored.get(name, 0), tracker.position_for_writer(name))
            # A joining writer's first announcement reaches every reader before it reserves.
            for other in self.running.values():
                if other is not inc:
                    other.tracker.advance(name, tracker.position_for_writer(name))
        self.remember(inc)

    def leases(self) -> set[str]:
        """Instances holding a writer lease: running, and a writer by their own configuration."""
        return {w for w, inc in self.running.items() if inc.is_writer}

    def remember(self, inc: Incarnation) -> None:
        inc.last_watermark = inc.tracker.persisted_upto
        inc.last_positions = {w: inc.tracker.position_for_writer(w) for w in inc.tracker.positions()}

    # -- rules ---------------------------------------------------------------------------------------

    @initialize(first=st.sampled_from(INSTANCES), second=st.sampled_from(INSTANCES))
    def setup(self, first: str, second: str) -> None:
        self.config = {first, second}
        self.start(first)

    @rule(name=st.sampled_from(INSTANCES))
    def start_instance(self, name: str) -> None:
        if name not in self.running:
            self.start(name)

    @rule(name=st.sampled_from(INSTANCES))
    def crash(self, name: str) -> None:
        # Its unfinished IDs die with its connections: they never become rows.
        self.running.pop(name, None)

    @rule(name=st.sampled_from(INSTANCES), add=st.booleans())
    def reconfigure(self, name: str, add: bool) -> None:
        if add:
            self.config.add(name)
        elif len(self.config) > 1:
            self.config.discard(name)

    @rule(data=st.data(), n=st.integers(1, 3))
    def fetch_begin(self, data: st.DataObject, n: int) -> None:
        writers = [inc for inc in self.running.values() if inc.is_writer]
        if not writers:
            return
        inc = data.draw(st.sampled_from(writers))
        token = inc.tracker.begin_fetch()
        ids = list(range(self.sequence_last + 1, self.sequence_last + n + 1))
        self.sequence_last += n
        inc.fetching.append((token, ids))

    @rule(data=st.data())
    def fetch_end(self, data: st.DataObject) -> None:
        busy = [inc for inc in self.running.values() if inc.fetching]
        if not busy:
            return
        inc = data.draw(st.sampled_from(busy))
        token, ids = inc.fetching.pop(data.draw(st.integers(0, len(inc.fetching) - 1)))
        inc.tracker.end_fetch(token, ids)
        inc.pending.update(ids)

    @rule(data=st.data(), commit=st.booleans())
    def complete(self, data: st.DataObject, commit: bool) -> None:
        busy = [inc for inc in self.running.values() if inc.pending]
        if not busy:
            return
        inc = data.draw(st.sampled_from(busy))
        stream_id = data.draw(st.sampled_from(sorted(inc.pending)))
        if commit:
            for reader in self.running.values():
                assert stream_id > reader.tracker.persisted_upto, (
                    f"{inc.name} commits {stream_id} but {reader.name} is already at {reader.tracker.persisted_upto}"
                )
            self.rows[stream_id] = inc.name
        inc.pending.discard(stream_id)
        inc.tracker.complete([stream_id])

    @rule(data=st.data())
    def replicate(self, data: st.DataObject) -> None:
        writers = [inc for inc in self.running.values() if inc.is_writer]
        if not writers or len(self.running) < 2:
            return
        source = data.draw(st.sampled_from(writers))
        target = data.draw(st.sampled_from([i for i in self.running.values() if i is not source]))
        target.tracker.advance(source.name, source.tracker.position_for_writer(source.name))

    @rule(name=st.sampled_from(INSTANCES))
    def persist(self, name: str) -> None:
        inc = self.running.get(name)
        if inc is not None and inc.is_writer:
            self.stored[name] = max(self.stored.get(name, 0), inc.tracker.position_for_writer(name))

    @rule(name=st.sampled_from(INSTANCES))
    def check_retired_writers(self, name: str) -> None:
        inc = self.running.get(name)
        if inc is None:
            return
        for writer in list(inc.tracker.positions()):
            if writer != name and writer not in inc.writers and writer not in self.leases():
                inc.tracker.forget_writer(writer)
                inc.last_positions.pop(writer, None)

    # -- invariants ----------------------------------------------------------------------------------

    @invariant()
    def nothing_unfinished_is_passed(self) -> None:
        unfinished = {w: inc.unfinished() for w, inc in self.running.items()}
        everything = set().union(*unfinished.values()) if unfinished else set()
        for reader in self.running.values():
            if everything:
                assert reader.tracker.persisted_upto < min(everything), (reader.name, reader.tracker.persisted_upto)
            for writer, ids in unfinished.items():
                if ids and writer in reader.tracker.positions():
                    assert reader.tracker.position_for_writer(writer) < min(ids), (reader.name, writer)

    @invariant()
    def positions_never_decrease(self) -> None:
        for inc in self.running.values():
            assert inc.tracker.persisted_upto >= inc.last_watermark
            for writer, before in inc.last_positions.items():
                if writer in inc.tracker.positions():
                    assert inc.tracker.position_for_writer(writer) >= before, (inc.name, writer)
            self.remember(inc)

    def teardown(self) -> None:
        # Settle: everything completes, every configured writer runs, dead writers are forgotten,
        # and every writer announces to everyone until nothing changes.
        for inc in self.running.values():
            for token, ids in inc.fetching:
                inc.tracker.end_fetch(token, ids)
                inc.pending.update(ids)
            inc.fetching.clear()
            for stream_id in sorted(inc.pending):
                self.rows[stream_id] = inc.name
                inc.tracker.complete([stream_id])
            inc.pending.clear()
        # The configuration roll-out finishes: every instance restarts on the current configuration.
        for name in sorted(self.running):
            self.crash(name)
            self.start(name)
        while missing := sorted({w for inc in self.running.values() for w in inc.writers} - set(self.running)):
            self.start(missing[0])
        if not self.running:
            return
        for inc in self.running.values():
            for writer in list(inc.tracker.positions()):
                if writer != inc.name and writer not in inc.writers and writer not in self.leases():
                    inc.tracker.forget_writer(writer)
        for _ in range(3):
            for source in self.running.values():
                if source.is_writer:
                    for target in self.running.values():
                        if target is not source:
                            target.tracker.advance(source.name, source.tracker.position_for_writer(source.name))
        watermarks = {inc.name: inc.tracker.persisted_upto for inc in self.running.values()}
        assert len(set(watermarks.values())) == 1, watermarks
        assert next(iter(watermarks.values())) >= max(self.rows, default=1)


class AnyWriterStreamModel(StreamModel):
    any_writer = True


TestConfiguredWriters = StreamModel.TestCase
TestConfiguredWriters.settings = settings(max_examples=300, stateful_step_count=60, deadline=None)
TestAnyWriter = AnyWriterStreamModel.TestCase
TestAnyWriter.settings = settings(max_examples=200, stateful_step_count=60, deadline=None)
