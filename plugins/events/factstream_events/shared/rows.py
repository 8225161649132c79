"""The ``events`` and ``backfill`` streams: their wire rows, tables and specs.

Wire rows follow the reference exactly (docs/plugins/events.md, Streams), so anything that reads its replication
reads ours:

* ``events``: ``["ev", [event_id, room_id, type, state_key, redacts, relates_to, membership, rejected,
  outlier]]`` per newly persisted event (and per outlier persisted again, at its new ID);
  ``["state", [room_id, type, state_key, event_id | null]]`` per current-state change (null: the key
  was removed); ``["state-all", [room_id]]`` instead of a room's ``state`` rows when one ID carries
  :data:`STATE_ALL_THRESHOLD` or more of them.
* ``backfill`` (a backwards stream: IDs -2, -3, ... in the tables, positive on the wire):
  ``[event_id, room_id, type, state_key, redacts, relates_to]`` per backfilled event.
"""

from __future__ import annotations

from typing import Any

import msgspec

from factstream import StreamTable

STREAM = "events"
BACKFILL_STREAM = "backfill"
EVENTS_SEQUENCE = "events_stream_seq"
BACKFILL_SEQUENCE = "events_backfill_seq"
#: One ID carrying this many ``state`` rows of one room sends one ``state-all`` row instead.
STATE_ALL_THRESHOLD = 150

EV = "ev"
STATE = "state"
STATE_ALL = "state-all"


class EventsRow(msgspec.Struct, frozen=True):
    """One row of the ``events`` stream: ``[kind, data]`` (see the module docstring)."""

    kind: str
    data: tuple[Any, ...]


class EventRowData(msgspec.Struct, frozen=True, array_like=True):
    """The ``data`` of an ``ev`` row."""

    event_id: str
    room_id: str
    type: str
    state_key: str | None
    redacts: str | None
    relates_to: str | None
    membership: str | None
    rejected: bool
    outlier: bool


class StateRowData(msgspec.Struct, frozen=True, array_like=True):
    """The ``data`` of a ``state`` row (``event_id`` None: the key was removed)."""

    room_id: str
    type: str
    state_key: str
    event_id: str | None


class BackfillRow(msgspec.Struct, frozen=True):
    """One row of the ``backfill`` stream."""

    event_id: str
    room_id: str
    type: str
    state_key: str | None
    redacts: str | None
    relates_to: str | None


def ev_row(data: EventRowData) -> EventsRow:
    return EventsRow(EV, tuple(msgspec.structs.astuple(data)))


def state_row(data: StateRowData) -> EventsRow:
    return EventsRow(STATE, tuple(msgspec.structs.astuple(data)))


def state_all_row(room_id: str) -> EventsRow:
    return EventsRow(STATE_ALL, (room_id,))


def event_data(row: EventsRow) -> EventRowData:
    """The typed data of an ``ev`` row."""
    return EventRowData(*row.data)


def state_data(row: EventsRow) -> StateRowData:
    """The typed data of a ``state`` row."""
    return StateRowData(*row.data)


EVENTS_TABLES = (
    StreamTable("events", "instance_name", "stream_ordering"),
    StreamTable("current_state_delta_stream", "instance_name", "stream_id"),
    StreamTable("ex_outlier_stream", "instance_name", "stream_id"),
)
BACKFILL_TABLES = (StreamTable("events", "instance_name", "stream_ordering"),)
