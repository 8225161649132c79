"""The ``receipts`` stream: its wire row, its table, whose long polls a row wakes, and its cache.

The row is the reference's ``ReceiptsStreamRow``, field for field and in its order, so a process that
speaks the reference's replication protocol parses it::

    RDATA receipts main 7 ["!room:hs","m.read","@bob:hs","$event",null,{"ts":1700000000000}]
"""

from __future__ import annotations

from typing import Any

import msgspec

from factstream import InvalidationSpec, StreamTable, Wake

STREAM = "receipts"
#: One current row per (room, receipt type, user, thread): the stream's facts (the reference's name).
TABLE = "receipts_linearized"
SEQUENCE = "receipts_sequence"
#: The field of the ``/sync`` token that follows the stream (the reference's ``StreamToken`` field).
SYNC_KEY = "receipt_key"
#: The cache of a room's current receipts, by ``(room_id,)`` (``ReceiptsStore.room_receipts``).
ROOM_RECEIPTS = "receipts_room"

READ = "m.read"
READ_PRIVATE = "m.read.private"
FULLY_READ = "m.fully_read"
#: The receipt types this plugin stores.
RECEIPT_TYPES = (READ, READ_PRIVATE)
#: The thread ID of the main timeline (the reference's ``MAIN_TIMELINE``).
MAIN_THREAD = "main"


class ReceiptsRow(msgspec.Struct, frozen=True):
    """One receipt as replication sends it: the reference's ``ReceiptsStreamRow``.

    ``thread_id`` is ``None`` for an unthreaded receipt (``null`` on the wire); ``data`` is the
    receipt's data, ``{"ts": <ms>}`` for the receipts this plugin stores.
    """

    room_id: str
    receipt_type: str
    user_id: str
    event_id: str
    thread_id: str | None
    data: dict[str, Any]


TABLES = (StreamTable(TABLE, "instance_name", "stream_id"),)


def wake(row: ReceiptsRow) -> Wake:
    """A private receipt wakes its owner only; any other wakes every user following the room."""
    if row.receipt_type == READ_PRIVATE:
        return Wake(users=(row.user_id,))
    return Wake(rooms=(watch_key(row.room_id),))


def room_receipts_keys(row: ReceiptsRow) -> list[tuple[str]]:
    """A new receipt changes its room's current receipts, and nothing else."""
    return [(row.room_id,)]


#: Run on every instance for every row, written there or replicated, before anyone can read past it.
ROOM_RECEIPTS_INVALIDATION = InvalidationSpec(stream=STREAM, cache=ROOM_RECEIPTS, keys=room_receipts_keys)


def watch_key(room_id: str) -> str:
    """The notifier key a public receipt of ``room_id`` wakes, watched by the room's joined members only
    (the events plugin's own key, the room ID, is watched by invitees too, whom a receipt does not reach)."""
    return f"receipts|{room_id}"
