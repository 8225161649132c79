"""Hypothesis stateful test: what writers' streamers send never lets a reader pass a row it lacks.

Two writers and a reader of one stream, each with the real :class:`PositionTracker`, over a model of
the database (a sequence and the committed rows) and of the transport (one FIFO inbox per process, fed
in send order, as a Redis channel or the TCP hub delivers). Each writer's streamer pass is the one
``ReplicatedStream.get_wire_updates`` and ``ReplicationStreamer.send_pending`` make: nothing to do when
the announced position has not moved; a bare ``POSITION last current`` when the tracker says this
process wrote nothing after ``last`` (:meth:`PositionTracker.wrote_above`); otherwise the committed
rows of the writer in ``(last, current]`` as ``RDATA`` (read back or captured: the same rows), then the
``POSITION``. Receivers advance the writer on ``POSITION`` after the ``RDATA`` before it.

Rules interleave sequence calls (asked and answered separately, in any order; the sequence hands
out its IDs as it answers, so a call asked later may get the lower ID), commits,
rollbacks, streamer passes and deliveries. Invariant after every step, for every process: each
committed row of another writer at or below its watermark, or at or below its view of that writer's
position, has been received, and no row was received twice. Before the fix (the shortcut judged by
the writer's own position) a row that completed while an earlier reservation of its writer waited
for the sequence went out as a bare POSITION and broke this (issue 30, point 6).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from factstream.idgen.positions import PositionTracker

WRITERS = ("a", "b")
PROCESSES = (*WRITERS, "r")

#: ``("rdata", writer, id)`` or ``("position", writer, new)``.
Message = tuple[str, str, int]


@dataclass
class Process:
    tracker: PositionTracker
    pending: set[int] = field(default_factory=set)
    #: Sequence calls asked and not answered: ``(token from begin_fetch, how many IDs)``.
    fetching: list[tuple[int, int]] = field(default_factory=list)
    #: The streamer's cursor (writers): the last token sent.
    last: int = 1
    inbox: deque[Message] = field(default_factory=deque)
    received: list[tuple[str, int]] = field(default_factory=list)


class StreamerModel(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.sequence_last = 1
        self.rows: dict[int, str] = {}
        self.processes = {
            name: Process(PositionTracker(local=name, positions=dict.fromkeys(WRITERS, 1), persisted_upto=1))
            for name in PROCESSES
        }

    @rule(writer=st.sampled_from(WRITERS), n=st.integers(1, 2))
    def fetch_begin(self, writer: str, n: int) -> None:
        p = self.processes[writer]
        p.fetching.append((p.tracker.begin_fetch(), n))

    @rule(writer=st.sampled_from(WRITERS), data=st.data())
    def fetch_end(self, writer: str, data: st.DataObject) -> None:
        p = self.processes[writer]
        if p.fetching:
            # The sequence hands out its IDs when the call reaches it: calls are answered in any order.
            token, n = p.fetching.pop(data.draw(st.integers(0, len(p.fetching) - 1)))
            ids = list(range(self.sequence_last + 1, self.sequence_last + n + 1))
            self.sequence_last += n
            p.tracker.end_fetch(token, ids)
            p.pending.update(ids)

    @rule(writer=st.sampled_from(WRITERS), data=st.data(), commit=st.booleans())
    def complete(self, writer: str, data: st.DataObject, commit: bool) -> None:
        p = self.processes[writer]
        if not p.pending:
            return
        stream_id = data.draw(st.sampled_from(sorted(p.pending)))
        if commit:
            self.rows[stream_id] = writer
        p.pending.discard(stream_id)
        p.tracker.complete([stream_id])

    @rule(writer=st.sampled_from(WRITERS))
    def stream(self, writer: str) -> None:
        """One streamer pass of ``writer`` (module docstring)."""
        p = self.processes[writer]
        current = p.tracker.position_for_writer(writer)
        if current == p.last:
            return
        messages: list[Message] = []
        if p.tracker.wrote_above(p.last):
            rows = sorted(i for i, w in self.rows.items() if w == writer and p.last < i <= current)
            messages += [("rdata", writer, i) for i in rows]
        if current > p.last:
            messages.append(("position", writer, current))
        p.last = max(p.last, current)
        for name, other in self.processes.items():
            if name != writer:
                other.inbox.extend(messages)

    @rule(name=st.sampled_from(PROCESSES))
    def deliver(self, name: str) -> None:
        p = self.processes[name]
        if not p.inbox:
            return
        kind, writer, token = p.inbox.popleft()
        if kind == "rdata":
            assert (writer, token) not in p.received, (name, writer, token)
            p.received.append((writer, token))
        else:
            p.tracker.advance(writer, token)

    @invariant()
    def no_row_is_passed_before_it_arrives(self) -> None:
        for name, p in self.processes.items():
            positions = p.tracker.positions()
            received = set(p.received)
            for stream_id, writer in self.rows.items():
                if writer == name:
                    continue
                passed = stream_id <= p.tracker.persisted_upto or stream_id <= positions.get(writer, 0)
                assert not passed or (writer, stream_id) in received, (
                    f"{name} is at {p.tracker.persisted_upto} (sees {writer} at {positions.get(writer)}) "
                    f"without {writer}'s row {stream_id}"
                )


TestStreamerModel = StreamerModel.TestCase
TestStreamerModel.settings = settings(max_examples=400, stateful_step_count=50, deadline=None)
