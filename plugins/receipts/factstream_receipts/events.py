"""What a receipt needs to know of the event it points at: its room, its place in the events stream,
and its thread.

The events plugin keeps events; a receipt reads three facts of one, in one query on the events
plugin's tables (as the reference's receipts store reads its ``events`` table): the room, the
``stream_ordering`` (a receipt never moves back to an older event) and the ``m.relates_to`` of its
content (the thread rules of :func:`in_thread`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from factstream import HostApi
from factstream_receipts.rows import MAIN_THREAD

THREAD_RELATION = "m.thread"
#: How many relations :func:`thread_of` follows from an event towards its thread.
MAX_HOPS = 3

_CHILDREN = """
SELECT j.json FROM events e JOIN event_json j ON j.event_id = e.event_id
WHERE e.room_id = %(room_id)s AND e.relates_to = %(event_id)s
"""
_EVENT = """
SELECT e.room_id, e.stream_ordering, e.outlier, j.json FROM events e
JOIN event_json j ON j.event_id = e.event_id WHERE e.event_id = %(event_id)s
"""


@dataclass(frozen=True, slots=True)
class TargetEvent:
    """The facts of a receipt's event: ``relation`` is ``(rel_type, event_id)`` of its ``m.relates_to``."""

    event_id: str
    room_id: str
    stream_ordering: int
    outlier: bool
    relation: tuple[str, str] | None


def _relation(raw: bytes) -> tuple[str, str] | None:
    try:
        relates = json.loads(raw).get("content", {}).get("m.relates_to")
    except (ValueError, AttributeError):
        return None
    if not isinstance(relates, dict):
        return None
    rel_type, target = relates.get("rel_type"), relates.get("event_id")
    return (rel_type, target) if isinstance(rel_type, str) and isinstance(target, str) else None


async def target_event(host: HostApi, event_id: str) -> TargetEvent | None:
    """The event ``event_id`` as stored here (None: not stored)."""
    rows = await host.database().fetchall(_EVENT, {"event_id": event_id})
    if not rows:
        return None
    room_id, stream_ordering, outlier, raw = rows[0]
    return TargetEvent(event_id, str(room_id), int(stream_ordering), bool(outlier), _relation(bytes(raw)))


async def is_thread_root(host: HostApi, event: TargetEvent) -> bool:
    """Whether an event of ``event``'s room is in a thread rooted at ``event`` (an ``m.thread``
    relation to it). Read through the room's index, among the room's events that relate to it."""
    rows = await host.database().fetchall(_CHILDREN, {"room_id": event.room_id, "event_id": event.event_id})
    return any(_relation(bytes(raw)) == (THREAD_RELATION, event.event_id) for (raw,) in rows)


async def thread_of(host: HostApi, event: TargetEvent) -> str:
    """The thread ``event`` belongs to: the root named by its ``m.thread`` relation; itself when it is
    a thread's root; else the thread of the event it relates to by another relation (up to
    :data:`MAX_HOPS` relations); else ``"main"``."""
    current: TargetEvent | None = event
    for _ in range(MAX_HOPS):
        if current is None:
            return MAIN_THREAD
        if current.relation is not None and current.relation[0] == THREAD_RELATION:
            return current.relation[1]
        if await is_thread_root(host, current):
            return current.event_id
        if current.relation is None:
            return MAIN_THREAD
        current = await target_event(host, current.relation[1])
    return MAIN_THREAD


async def in_thread(host: HostApi, event: TargetEvent, thread_id: str) -> bool:
    """Whether a receipt for ``thread_id`` may point at ``event`` (the reference's rules):

    1. ``"main"``: the event is not itself in a thread (no ``m.thread`` relation of its own);
    2. a thread's root: :func:`thread_of` the event is that root (the event is in the thread, is its
       root, or relates to an event that is).
    """
    if thread_id == MAIN_THREAD:
        return event.relation is None or event.relation[0] != THREAD_RELATION
    return await thread_of(host, event) == thread_id
