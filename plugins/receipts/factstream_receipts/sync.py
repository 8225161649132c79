"""Receipts in ``/sync``: each joined room's ``m.receipt`` event, under ``rooms.join.<room>.ephemeral``.

The stream fills the ``rooms`` section (``sync_section="rooms"``), which it shares with the events
plugin: the core merges the two (``factstream.sync.sections``), so a room with new events and new
receipts shows both, and neither plugin knows of the other. On every request:

1. tell the notifier the user's joined rooms (``request.watch_rooms``), so that a later public receipt
   of any of them (``Wake(rooms=...)`` of the room's ``receipts|<room>`` key) wakes this user's long poll;
2. read the receipts: for an initial sync (no ``since``) every current receipt of each joined room, as
   the reference sends a room's receipts from the start; otherwise those whose stream IDs are in the
   request's range ``(since[w], upto[w]]`` for their writer ``w``;
3. keep what the user may see (:func:`visible`) and merge each room's into one event (:func:`content`).

Privacy: only rooms the user is joined to *now* are read, so a user who left a room, or who is only
invited, sees none of its receipts; and an ``m.read.private`` receipt is shown to its owner alone.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from factstream_events import Memberships

from factstream import SyncRequest
from factstream_receipts.rows import READ_PRIVATE, ReceiptsRow, watch_key
from factstream_receipts.store import Receipt, ReceiptsStore

RECEIPT_EVENT = "m.receipt"


def visible(rows: Iterable[ReceiptsRow], viewer: str) -> list[ReceiptsRow]:
    """The receipts ``viewer`` may see, among receipts of rooms they are joined to: every public one,
    and their own private ones."""
    return [row for row in rows if row.receipt_type != READ_PRIVATE or row.user_id == viewer]


def content(rows: Iterable[ReceiptsRow]) -> dict[str, dict[str, dict[str, dict[str, Any]]]]:
    """One room's receipts as an ``m.receipt`` event's content: ``event_id -> receipt_type -> user_id ->
    data``, a threaded receipt's data with its ``thread_id``. Later rows replace earlier ones of the
    same place; a threaded receipt is left out where the same user has an unthreaded receipt on the
    same event (MSC4102, as the reference merges them)."""
    rows = list(rows)
    unthreaded = {(row.user_id, row.event_id) for row in rows if row.thread_id is None}
    out: dict[str, dict[str, dict[str, dict[str, Any]]]] = {}
    for row in rows:
        data = dict(row.data)
        if row.thread_id is not None:
            if (row.user_id, row.event_id) in unthreaded:
                continue
            data["thread_id"] = row.thread_id
        out.setdefault(row.event_id, {}).setdefault(row.receipt_type, {})[row.user_id] = data
    return out


def rooms_section(by_room: Mapping[str, Iterable[ReceiptsRow]], viewer: str) -> dict[str, Any]:
    """The ``rooms`` part for ``viewer``: ``{"join": {room: {"ephemeral": {"events": [m.receipt]}}}}``,
    rooms with nothing to show left out (an empty mapping: nothing at all)."""
    join: dict[str, Any] = {}
    for room_id, rows in sorted(by_room.items()):
        shown = content(visible(rows, viewer))
        if shown:
            join[room_id] = {"ephemeral": {"events": [{"type": RECEIPT_EVENT, "content": shown}]}}
    return {"join": join} if join else {}


def _in_range(receipt: Receipt, upto: Mapping[str, int]) -> bool:
    return receipt.stream_id <= upto.get(receipt.instance, 0)


async def sync_receipts(request: SyncRequest) -> dict[str, Any]:
    """``sync_rows`` of the receipts stream: its part of the ``rooms`` section (module docstring)."""
    host = request.host
    joined = await host.state(Memberships).joined_rooms(request.user)
    if request.watch_rooms is not None:
        request.watch_rooms(watch_key(room) for room in joined)
    store = host.state(ReceiptsStore)
    by_room: dict[str, list[ReceiptsRow]] = {}
    if request.initial:
        for room_id in joined:
            # a receipt past the token comes with the next range instead
            by_room[room_id] = [r.row for r in await store.room_receipts(room_id) if _in_range(r, request.upto)]
    else:
        for receipt in await store.between(joined, request.since, request.upto):
            by_room.setdefault(receipt.row.room_id, []).append(receipt.row)
    return rooms_section(by_room, request.user)
