"""The worked examples of the reference, on the pure position tracker and start-up planning."""

from __future__ import annotations

import pytest

from factstream.idgen.positions import PositionTracker
from factstream.idgen.recovery import DurableState, counted_writers, initial_tracker, plan_sequence_repair


class Writer:
    """A tracker plus a fake sequence, to drive reserve/complete by hand."""

    def __init__(self, tracker: PositionTracker, sequence: list[int]) -> None:
        self.t = tracker
        self.sequence = sequence

    def reserve(self, n: int = 1) -> list[int]:
        token = self.t.begin_fetch()
        ids = [self.sequence[0] + i + 1 for i in range(n)]
        self.sequence[0] += n
        self.t.end_fetch(token, ids)
        return ids


def single_writer() -> Writer:
    return Writer(PositionTracker(local="master", positions={"master": 1}, persisted_upto=1), [1])


def test_single_writer_table_from_the_reference():
    w = single_writer()
    steps = []

    [two] = w.reserve()
    steps.append(w.t.persisted_upto)
    [three] = w.reserve()
    steps.append(w.t.persisted_upto)
    w.t.complete([three])
    steps.append(w.t.persisted_upto)
    w.t.complete([two])
    steps.append(w.t.persisted_upto)
    four, five, six = w.reserve(3)
    steps.append(w.t.persisted_upto)
    w.t.complete([five])
    steps.append(w.t.persisted_upto)
    w.t.complete([four])
    steps.append(w.t.persisted_upto)
    w.t.complete([six])
    steps.append(w.t.persisted_upto)

    assert (two, three, four, five, six) == (2, 3, 4, 5, 6)
    assert steps == [1, 1, 1, 3, 3, 3, 5, 6]


def test_in_flight_fetch_holds_the_local_position_below_unknown_ids():
    w = single_writer()
    [two] = w.reserve()
    token = w.t.begin_fetch()  # a nextval is on its way; it may return anything above 2
    w.t.complete([two])

    assert w.t.positions()["master"] == 2
    assert w.t.persisted_upto == 2
    w.t.end_fetch(token, [3])
    w.t.complete([3])
    assert w.t.persisted_upto == 3


def test_watermark_over_several_writers_from_the_reference():
    t = PositionTracker(local="worker", positions={"first": 3, "second": 5}, persisted_upto=3)
    seen = [t.persisted_upto]
    for writer, position in [("first", 6), ("second", 7), ("second", 9), ("first", 8)]:
        t.advance(writer, position)
        seen.append(t.persisted_upto)
    t.advance("first", 11)
    t.advance("second", 15)
    seen.append(t.persisted_upto)

    assert seen == [3, 6, 7, 7, 9, 11]


def test_announced_position_with_nothing_in_flight_from_the_reference():
    sequence = [7]
    positions = {"first": 7, "second": 7, "third": 7}
    first = Writer(PositionTracker(local="first", positions=positions, persisted_upto=7), sequence)
    second = Writer(PositionTracker(local="second", positions=positions, persisted_upto=7), sequence)

    ids = first.reserve(2)
    first.t.complete(ids)
    second.t.advance("first", first.t.position_for_writer("first"))
    assert ids == [8, 9]
    assert second.t.position_for_writer("first") == 9
    assert second.t.position_for_writer("second") == 9  # nothing in flight: it may announce 9
    assert second.t.persisted_upto == 7  # third never wrote: the watermark waits for it

    [held] = second.reserve()
    [eleven] = first.reserve()
    first.t.complete([eleven])
    second.t.advance("first", 11)
    assert second.t.position_for_writer("second") == 9  # it holds 10 unfinished
    second.t.complete([held])
    assert second.t.position_for_writer("second") == 11
    assert second.t.persisted_upto == 7


def test_backwards_streams_are_tracked_normalised():
    # The generator multiplies by -1 on the way in and out; the tracker sees 1, 2, 3...
    w = single_writer()
    ids = w.reserve(2)
    w.t.complete([ids[1]])
    assert w.t.persisted_upto == 1
    w.t.complete([ids[0]])
    assert [-i for i in ids] == [-2, -3]
    assert -w.t.persisted_upto == -3


def test_restart_with_rows_beyond_stream_positions():
    # first stored 3 but its rows reach 6 (the lazy upsert had not run); second stored 5.
    state = DurableState(
        sequence_last=8,
        table_max=6,
        stored_positions={"first": 3, "second": 5},
        rows_above=[(4, "first"), (5, "second"), (6, "first")],
    )
    t = initial_tracker(local="worker", writers=["first", "second"], state=state, counted=["first", "second"])

    assert t.persisted_upto == 6  # 4, 5, 6 are rows, so complete
    assert t.positions() == {"first": 3, "second": 5}


def test_restarting_writer_takes_the_highest_complete_id_not_the_sequence_head():
    # The sequence handed out 39 and 40 to "second", still in flight: they must not be announced.
    state = DurableState(
        sequence_last=40,
        table_max=38,
        stored_positions={"first": 30, "second": 35},
        rows_above=[(36, "first"), (37, "second"), (38, "first")],
    )
    t = initial_tracker(local="first", writers=["first", "second"], state=state, counted=["first", "second"])

    assert t.positions()["first"] == 38
    assert t.position_for_writer("first") == 38
    assert t.persisted_upto == 38


def test_configured_writer_without_a_row_is_seeded_at_the_watermark():
    state = DurableState(sequence_last=12, table_max=12, stored_positions={"first": 12})
    t = initial_tracker(local="reader", writers=["first", "second"], state=state, counted=["first", "second"])

    assert t.positions() == {"first": 12, "second": 12}
    assert t.persisted_upto == 12


def test_removed_writer_still_counts_while_alive():
    stored = {"first": 20, "retired": 9}

    assert counted_writers(["first"], stored, alive={"retired"}) == ["first", "retired"]
    assert counted_writers(["first"], stored, alive=set()) == ["first"]
    assert counted_writers(["first"], stored, alive=None) == ["first", "retired"]


def test_no_repair_when_the_sequence_is_ahead():
    assert plan_sequence_repair(DurableState(10, 9, {"a": 10}), margin=100) is None


@pytest.mark.parametrize(
    ("state", "reason"),
    [
        (DurableState(10, 42, {"a": 10}), "the backing tables hold ID 42"),
        (DurableState(10, 9, {"a": 42}), "stream_positions holds 42 for writer 'a'"),
    ],
)
def test_sequence_behind_tables_or_positions_jumps_past_both(state, reason):
    repair = plan_sequence_repair(state, margin=100)

    assert repair is not None
    assert (repair.old_last, repair.new_last, repair.reason) == (10, 142, reason)


def test_an_id_handed_out_twice_is_refused():
    w = single_writer()
    [two] = w.reserve()
    w.t.complete([two])
    token = w.t.begin_fetch()

    with pytest.raises(ValueError, match="stream ID 2 handed out twice"):
        w.t.end_fetch(token, [2])
