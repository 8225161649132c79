"""The write steps of a batch: one function per table, each adding its statement to the batch's writes.

Most writes are parts of one statement (``combine``), sent with the ``COMMIT`` in one round trip:
whatever must undo the batch fails that statement. The rare writes that go row by row (an outlier
written normally, a redaction, a key dropped from the current state) are sent first, in the same
pipeline. A batch's rows go in one statement per table as one JSON array of row objects
(``%(rows)s``, read by ``json_to_recordset``): one parameter, whatever the number of rows.

=========================================  ==============================================================
table                                      step
=========================================  ==============================================================
``events``                                 :func:`events` (inserted), :func:`deoutliered` (updated)
``event_json``                             :func:`event_json`
``event_edges``                            :func:`edges`
``room_memberships``                       :func:`memberships`
``redactions`` (and ``events.redacted_by``) :func:`redactions`
``ex_outlier_stream``                      :func:`deoutliered`
``event_backward_extremities``             :func:`backward_extremities`
``event_forward_extremities``              :func:`forward_extremities`
``current_state_events``                   :func:`current_state`
``current_state_delta_stream``             :func:`current_state`
``state_groups`` and their entries         written by ``statestore`` (its plan), added by the caller
``rooms``                                  :func:`room_row`
``event_txn_ids``                          :func:`txn_claim` (a local send's transaction ID)
=========================================  ==============================================================
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import msgspec

from factstream_events.rules.validate import NEVER_SHOWN
from factstream_events.write.batch import NewEvent
from factstream_events.write.combine import Writes
from factstream_events.write.create import Txn
from factstream_events.write.plan import BatchPlan, EventRow, RoomAfter

_encode_json = msgspec.json.Encoder().encode


def _rows(rows: Sequence[Any]) -> str:
    """``rows`` as the JSON text ``json_to_recordset`` reads (fields it is not asked for are ignored)."""
    return _encode_json(rows).decode()


@dataclass(slots=True)
class BatchWrites:
    """The statements of one batch: the row-by-row writes, sent first, then the one combined statement."""

    room_id: str
    combined: Writes = field(default_factory=Writes)
    #: ``(SQL, the parameters of each row)``, in order.
    row_by_row: list[tuple[str, Sequence[Mapping[str, Any]]]] = field(default_factory=list)


# An event redacted before it arrived is redacted by the first such redaction (``redacted_by`` of the
# row: one in the same batch).
_INSERT_EVENTS = """
INSERT INTO events (event_id, room_id, stream_ordering, instance_name, topological_ordering, type, state_key,
    sender, origin_server_ts, received_ts, outlier, backfilled, state_group, visibility, membership,
    prev_membership, redacts, relates_to, redacted_by)
SELECT e.event_id, %(room_id)s, e.stream, %(instance)s, e.depth, e.type, e.state_key, e.sender, e.ts, %(received)s,
    e.outlier, %(backfilled)s, e.state_group, e.visibility, e.membership,
    COALESCE(e.prev_membership, (SELECT p.membership FROM events p WHERE p.event_id = e.prev_member_event)),
    e.redacts, e.relates_to,
    COALESCE(CASE WHEN e.type <> 'm.room.create' THEN (
        SELECT r.event_id FROM redactions r WHERE r.redacts = e.event_id AND r.room_id = %(room_id)s
        ORDER BY r.received_ts, r.event_id LIMIT 1) END, e.redacted_by)
FROM json_to_recordset(%(rows)s::json) AS e(event_id text, stream bigint, depth bigint, type text, state_key text,
    sender text, ts bigint, outlier boolean, state_group bigint, visibility text, membership text,
    prev_membership text, prev_member_event text, redacts text, relates_to text, redacted_by text)
"""


def events(w: BatchWrites, plan: BatchPlan, *, instance: str, received: int, backfill: bool) -> None:
    """Insert the batch's new events (an event held as an outlier is updated by :func:`deoutliered`)."""
    rows = plan.new_rows
    if rows:
        params = {"room_id": w.room_id, "instance": instance, "received": received, "backfilled": backfill}
        w.combined.add(_INSERT_EVENTS, {**params, "rows": _rows(rows)})


_INSERT_JSON = """
INSERT INTO event_json (event_id, room_id, json)
SELECT j.event_id, %(room_id)s, j.json FROM unnest(%(event_id)b::text[], %(json)b::bytea[]) AS j(event_id, json)
"""


def event_json(w: BatchWrites, plan: BatchPlan, ordered: Sequence[NewEvent]) -> None:
    """Keep the JSON of the batch's new events as received (byte for byte)."""
    fresh = [e for e in ordered if e.event_id not in plan.deoutliered]
    if fresh:
        params = {"room_id": w.room_id, "event_id": [e.event_id for e in fresh], "json": [e.raw for e in fresh]}
        w.combined.add(_INSERT_JSON, params)


_DEOUTLIER = """
UPDATE events SET outlier = FALSE, state_group = %(state_group)s, visibility = %(visibility)s,
    prev_membership = COALESCE(%(prev_membership)s::text,
        (SELECT p.membership FROM events p WHERE p.event_id = %(prev_member_event)s::text)),
    redacted_by = COALESCE(redacted_by, %(redacted_by)s)
WHERE event_id = %(event_id)s
"""
_INSERT_EX_OUTLIER = (
    "INSERT INTO ex_outlier_stream (stream_id, instance_name, event_id) VALUES (%(stream)s, %(instance)s, %(event_id)s)"
)


def deoutliered(w: BatchWrites, plan: BatchPlan, orderings: Sequence[int], *, instance: str) -> None:
    """Update the events held as outliers and now written normally (they keep their stream ordering),
    and tell readers with a row of ``ex_outlier_stream`` each (at ``orderings``, reserved for them)."""
    rows = plan.deoutliered_rows
    if rows:
        w.row_by_row.append((_DEOUTLIER, [msgspec.structs.asdict(r) for r in rows]))
        ex = [{"stream": s, "instance": instance, "event_id": r.event_id} for r, s in zip(rows, orderings, strict=True)]
        w.row_by_row.append((_INSERT_EX_OUTLIER, ex))


_INSERT_EDGES = """
INSERT INTO event_edges (event_id, prev_event_id, room_id)
SELECT g.e, g.p, %(room_id)s FROM json_to_recordset(%(rows)s::json) AS g(e text, p text)
ON CONFLICT DO NOTHING
"""


def edges(w: BatchWrites, ordered: Sequence[NewEvent]) -> None:
    """The graph's edges: each (non-outlier) event to its prev_events."""
    rows = [{"e": e.event_id, "p": p} for e in ordered if not e.outlier for p in e.fields.prev_events]
    if rows:
        w.combined.add(_INSERT_EDGES, {"room_id": w.room_id, "rows": _rows(rows)})


_INSERT_MEMBERSHIPS = """
INSERT INTO room_memberships (event_id, user_id, sender, room_id, membership, stream_ordering,
    topological_ordering, outlier)
SELECT m.event_id, m.state_key, m.sender, %(room_id)s, m.membership, m.stream, m.depth, m.outlier
FROM json_to_recordset(%(rows)s::json)
    AS m(event_id text, state_key text, sender text, membership text, stream bigint, depth bigint, outlier boolean)
ON CONFLICT (event_id) DO UPDATE SET outlier = EXCLUDED.outlier
"""


def memberships(w: BatchWrites, plan: BatchPlan) -> None:
    """A row of ``room_memberships`` per member event (updated for one written normally at last)."""
    rows = [r for r in plan.rows if r.membership is not None]
    if rows:
        w.combined.add(_INSERT_MEMBERSHIPS, {"room_id": w.room_id, "rows": _rows(rows)})


_INSERT_REDACTION = """
INSERT INTO redactions (event_id, redacts, room_id, received_ts) VALUES (%(event_id)s, %(redacts)s, %(room_id)s, %(ts)s)
ON CONFLICT (event_id) DO NOTHING
"""
_APPLY_REDACTION = """
UPDATE events SET redacted_by = %(event_id)s
WHERE event_id = %(redacts)s AND room_id = %(room_id)s AND redacted_by IS NULL AND type <> 'm.room.create'
"""


def redactions(w: BatchWrites, plan: BatchPlan, *, received: int) -> None:
    """Record the batch's redactions, and apply each to its target held before the batch (one of its own
    room, never a create event; a target in the batch carries ``redacted_by`` in its row)."""
    rows = [r for r in plan.rows if r.redacts]
    if not rows:
        return
    room_id = w.room_id
    recorded = [{"event_id": r.event_id, "redacts": r.redacts, "room_id": room_id, "ts": received} for r in rows]
    w.row_by_row.append((_INSERT_REDACTION, recorded))
    in_batch = {r.event_id for r in plan.rows}
    applied = [
        {"event_id": r.event_id, "redacts": r.redacts, "room_id": room_id} for r in rows if r.redacts not in in_batch
    ]
    if applied:
        w.row_by_row.append((_APPLY_REDACTION, applied))


_DROP_BACKWARD = """
DELETE FROM event_backward_extremities WHERE room_id = %(room_id)s AND event_id = ANY(%(ids)b::text[])
"""
_ADD_BACKWARD = """
INSERT INTO event_backward_extremities (room_id, event_id) SELECT %(room_id)s, unnest(%(ids)b::text[])
ON CONFLICT DO NOTHING
"""


def backward_extremities(w: BatchWrites, plan: BatchPlan, ordered: Sequence[NewEvent], *, local: bool) -> None:
    """The room's backward extremities: the batch's events are held now (a local batch's events are new:
    none was one), and its prev_events not held are added."""
    normal = [e.event_id for e in ordered if not e.outlier]
    if normal and not local:
        w.combined.add(_DROP_BACKWARD, {"room_id": w.room_id, "ids": normal})
    if plan.backward:
        w.combined.add(_ADD_BACKWARD, {"room_id": w.room_id, "ids": sorted(plan.backward)})


#: The room's forward extremities replaced by ``ids``: both parts of one statement (they see the same
#: snapshot: the delete keeps the rows the insert would meet).
_DROP_FORWARD = """
DELETE FROM event_forward_extremities WHERE room_id = %(room_id)s AND event_id <> ALL(%(ids)b::text[])
"""
_ADD_FORWARD = """
INSERT INTO event_forward_extremities (room_id, event_id) SELECT %(room_id)s, unnest(%(ids)b::text[])
ON CONFLICT DO NOTHING
"""


def forward_extremities(w: BatchWrites, after: RoomAfter) -> None:
    """Replace the room's forward extremities with those after the batch."""
    forward = {"room_id": w.room_id, "ids": list(after.extremities)}
    w.combined.add(_DROP_FORWARD, forward)
    w.combined.add(_ADD_FORWARD, forward)


_SET_STATE = """
INSERT INTO current_state_events (room_id, type, state_key, event_id, membership)
SELECT %(room_id)s, s.type, s.state_key, s.event_id, s.membership
FROM json_to_recordset(%(rows)s::json) AS s(type text, state_key text, event_id text, membership text)
ON CONFLICT (room_id, type, state_key) DO UPDATE SET event_id = EXCLUDED.event_id, membership = EXCLUDED.membership
"""
_DROP_STATE = """
DELETE FROM current_state_events WHERE room_id = %(room_id)s AND type = %(type)s AND state_key = %(state_key)s
"""
_STATE_DELTA = """
INSERT INTO current_state_delta_stream (stream_id, instance_name, room_id, type, state_key, event_id, prev_event_id)
SELECT %(stream)s, %(instance)s, %(room_id)s, d.type, d.state_key, d.event_id, d.prev_event_id
FROM json_to_recordset(%(rows)s::json) AS d(type text, state_key text, event_id text, prev_event_id text)
"""


def current_state(w: BatchWrites, after: RoomAfter, *, stream: int, instance: str) -> None:
    """The room's current state after the batch, and its deltas (at ``stream``, the batch's first ID)."""
    room_id = w.room_id
    if after.sets:
        w.combined.add(_SET_STATE, {"room_id": room_id, "rows": _rows(after.sets)})
    if after.drops:  # row by row, before the statement (other keys than the sets)
        drops = [{"room_id": room_id, "type": t, "state_key": k} for t, k in after.drops]
        w.row_by_row.append((_DROP_STATE, drops))
    if after.deltas:
        params = {"room_id": room_id, "stream": stream, "instance": instance, "rows": _rows(after.deltas)}
        w.combined.add(_STATE_DELTA, params)


_UPDATE_ROOM = """
UPDATE rooms SET writes = writes + 1, current_state_group = %(current)s,
    last_stream_ordering = COALESCE(%(last_stream)s, last_stream_ordering),
    last_event_id = COALESCE(%(last_event)s, last_event_id)
WHERE room_id = %(room_id)s
"""


def room_row(w: BatchWrites, plan: BatchPlan, current: int | None, *, backfill: bool) -> None:
    """The room's row: one more write, its current state group, its last event shown in timelines."""
    last: EventRow | None = None
    if not backfill:
        shown = [r for r in plan.rows if not r.outlier and r.type not in NEVER_SHOWN]
        last = max(shown, key=lambda r: r.stream, default=None)
    params = {
        "room_id": w.room_id,
        "current": current,
        "last_stream": last.stream if last is not None else None,
        "last_event": last.event_id if last is not None else None,
    }
    w.combined.add(_UPDATE_ROOM, params)


_CLAIM_TXN = """
INSERT INTO event_txn_ids (user_id, txn_id, request_hash, event_id, inserted_ts)
VALUES (%(user_id)s, %(txn_id)s, %(hash)s, %(event_id)s, %(ts)s)
"""
#: The key a concurrent request under the same transaction ID violates (its batch then fails).
TXN_KEY = "event_txn_ids_pkey"


def txn_claim(w: BatchWrites, plan: BatchPlan, txn: Txn, *, received: int) -> None:
    """The transaction ID's claim of the batch's first event, a part of the batch's statement (nothing
    when the batch stores nothing)."""
    if plan.rows:
        params = {"user_id": txn.user, "txn_id": txn.txn_id, "hash": txn.digest, "ts": received}
        w.combined.add(_CLAIM_TXN, {**params, "event_id": plan.rows[0].event_id})
