"""The state of a room at any event, at scale: users join one by one, then a
fifth of them leave; the state after every event, read with a cold state cache, equals a replay of the
events in order, and each state change writes at most 2 rows to ``state_groups`` (the reference model
writes 1 + S/100, S the state's size). The figures are printed (``pytest -s``) and are in the messages.

The room is written as remote batches of 100 (``EventsStore.persist_remote``), the fastest public
path: about 1 ms an event at 10,000 members, where a local ``change_membership`` (one transaction
each) takes about 3 ms.
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass
from typing import Any

from factstream_events.store import RemoteEvent

from tests.bundled.events.conftest import reads_of, store_of
from tests.bundled.events.remote_history import RemoteRoom

BATCH = 100
#: The most bytes of state-group deltas a change may cost on average (the reference model writes
#: 1 + S/100 rows a change: 101 rows of about 100 bytes each at 10,000 members).
MAX_DELTA_BYTES_PER_CHANGE = 1_024


@dataclass
class Figures:
    changes: int
    rows: int
    max_rows_per_change_in_a_batch: float
    delta_bytes: int
    table_bytes: int
    reference_rows: float  # the reference model's rows, summed over the changes
    final_size: int
    seconds: float

    def __str__(self) -> str:
        c = self.changes
        return (
            f"{c:,} state changes (final state {self.final_size:,} entries) in {self.seconds:.1f} s: "
            f"state_groups rows per change {self.rows / c:.3f} (at most {self.max_rows_per_change_in_a_batch:.2f}"
            f" in any batch of {BATCH}); delta bytes per change {self.delta_bytes / c:.0f}; table and index"
            f" growth per change {self.table_bytes / c:.0f} bytes; reference model 1 + S/100 rows per change:"
            f" {self.reference_rows / c:.1f} on average, {1 + self.final_size / 100:.1f} at the last change"
        )


def build(joins: int, leaves: int) -> RemoteRoom:
    """The room: its first events, ``joins`` users joining one by one, then ``leaves`` of them (a random
    sample) leaving one by one."""
    room = RemoteRoom(f"!members-{joins}:elsewhere")
    room.create("@zed:elsewhere")
    users = [f"@u{i}:elsewhere" for i in range(joins)]
    for user in users:
        room.add("m.room.member", user, {"membership": "join", "displayname": user[1:]}, state_key=user)
    for user in random.Random(joins).sample(users, leaves):
        room.add("m.room.member", user, {"membership": "leave"}, state_key=user)
    return room


async def write(main: Any, room: RemoteRoom) -> Figures:
    """Persist the room in batches, measuring what the state tables gain."""
    store = store_of(main)
    db = main.api.database()
    [(table_before,)] = await db.fetchall("SELECT pg_total_relation_size('state_groups')")
    started = time.perf_counter()
    worst = 0.0
    size = 0
    reference = 0.0
    for start in range(0, len(room.events), BATCH):
        chunk = room.events[start : start + BATCH]
        before = store.states.stats()
        outcome = await store.persist_remote(room.room_id, [RemoteEvent(b.raw) for b in chunk])
        assert outcome.stored == [b.event_id for b in chunk]
        written = store.states.stats().groups - before.groups
        worst = max(worst, written / len(chunk))  # every event of this room is a state change
        for built in chunk:
            if built.type == "m.room.member" and built.event["content"]["membership"] == "leave":
                pass  # a leave replaces the entry: S unchanged
            else:
                size += 1
            reference += 1 + size / 100
    seconds = time.perf_counter() - started
    [(rows, delta_bytes)] = await db.fetchall(
        "SELECT count(*), COALESCE(sum(length(delta)), 0) FROM state_groups WHERE room_id = %(r)s",
        {"r": room.room_id},
    )
    [(table_after,)] = await db.fetchall("SELECT pg_total_relation_size('state_groups')")
    return Figures(len(room.events), rows, worst, delta_bytes, table_after - table_before, reference, size, seconds)


def check_figures(figures: Figures) -> None:
    print(f"\n{figures}")
    assert figures.rows <= 2 * figures.changes, str(figures)
    assert figures.max_rows_per_change_in_a_batch <= 2, str(figures)
    assert figures.delta_bytes / figures.changes <= MAX_DELTA_BYTES_PER_CHANGE, str(figures)
    # Far below the reference model's rows (the whole point of deltas without periodic snapshots).
    assert figures.rows * 10 <= figures.reference_rows, str(figures)


def replay(room: RemoteRoom):
    """(event ID, the state after it) for every event in order; the state is one dict, updated in place."""
    state: dict[tuple[str, str], str] = {}
    for built in room.events:
        if built.state_key is not None:
            state[(built.type, built.state_key)] = built.event_id
        yield built.event_id, state


async def test_state_at_every_event_2000_joins_400_leaves(main):
    """Every event's state through the public read, ``Reads.state_ids(room, at=event)``, from a cold cache."""
    room = build(2_000, 400)
    figures = await write(main, room)
    check_figures(figures)
    store, reads = store_of(main), reads_of(main)
    store.states.forget()
    started = time.perf_counter()
    checked = 0
    for event_id, expected in replay(room):
        assert await reads.state_ids(room.room_id, event_id) == expected, event_id
        checked += 1
    assert checked == len(room.events) == 2_405
    assert await reads.state_ids(room.room_id) == room.state
    print(f"state at {checked:,} events read and compared in {time.perf_counter() - started:.1f} s")


async def test_state_at_every_event_10000_joins_2000_leaves(main):
    """Every event's state group loaded from a cold cache (one query for the events' groups, then the
    store's loads, the read ``state_ids`` makes without flattening each 10,000-entry state), and the
    public read for 200 events in random order, each from an emptied cache."""
    room = build(10_000, 2_000)
    figures = await write(main, room)
    check_figures(figures)
    store, reads = store_of(main), reads_of(main)
    db = main.api.database()
    groups = dict(
        await db.fetchall("SELECT event_id, state_group FROM events WHERE room_id = %(r)s", {"r": room.room_id})
    )
    store.states.forget()
    started = time.perf_counter()
    nested: dict[str, dict[str, str]] = {}
    checked = 0
    async with db.autocommit() as conn:
        for built in room.events:
            nested.setdefault(built.type, {})[str(built.state_key)] = built.event_id
            group = await store.states.load(conn, room.room_id, int(groups[built.event_id]))
            assert group.state == nested, built.event_id
            checked += 1
    assert checked == len(room.events) == 12_005
    every = time.perf_counter() - started

    picked = set(random.Random(18).sample(range(len(room.events)), 200))
    states = {event_id: dict(state) for i, (event_id, state) in enumerate(replay(room)) if i in picked}
    started = time.perf_counter()
    for event_id in random.Random(19).sample(sorted(states), len(states)):
        store.states.forget()
        assert await reads.state_ids(room.room_id, event_id) == states[event_id], event_id
    assert await reads.state_ids(room.room_id) == room.state
    print(
        f"state at {checked:,} events loaded and compared in {every:.1f} s;"
        f" 200 cold public reads in {time.perf_counter() - started:.1f} s"
    )
