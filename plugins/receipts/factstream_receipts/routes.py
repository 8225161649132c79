"""HTTP route: ``POST /rooms/{room_id}/receipt/{receipt_type}/{event_id}``, as in the Matrix client API.

The caller (any user token) sends a receipt of their own, on a configured writer of the stream (421
``M_MISDIRECTED`` elsewhere, naming the writers). The body is optional: ``{}`` or ``{"thread_id": T}``.
Refusals, each a 4xx ``{"errcode", "error"}`` decided before anything is written:

1. 400 ``M_INVALID_PARAM``: the room ID is not ``!...:server``, the event ID does not start with ``$``;
2. 400 ``M_INVALID_PARAM``: a receipt type other than ``m.read`` and ``m.read.private`` (``m.fully_read``
   is a read marker, kept as account data in the reference: not supported here);
3. 400 ``M_NOT_JSON`` / ``M_BAD_JSON`` / ``M_INVALID_PARAM``: a body that is not a JSON object, or whose
   ``thread_id`` is not a non-empty string, or is neither ``"main"`` nor an event ID;
4. 403 ``M_FORBIDDEN``: the caller is not joined to the room;
5. 404 ``M_NOT_FOUND``: the event is not an event of the room here;
6. 400 ``M_INVALID_PARAM``: the event is not in the thread (``factstream_receipts.events.in_thread``).

A receipt that would move the caller's receipt of that type and thread back to an older event, or
that repeats it, changes nothing and answers ``{}`` like any other (idempotent, as the reference).
"""

from __future__ import annotations

import json

from factstream_events import Memberships
from starlette.requests import Request

from factstream import HostApi, HttpError, RouteSpec, calling_user, json_object_text, read_body, require_writer
from factstream_receipts.events import in_thread, target_event
from factstream_receipts.rows import FULLY_READ, MAIN_THREAD, RECEIPT_TYPES, STREAM, ReceiptsRow
from factstream_receipts.store import ReceiptsStore, now_ms

#: The largest body, in bytes (413 beyond): it holds a thread ID at most.
MAX_BODY_BYTES = 4096
MAX_ID = 255


def _param(request: Request, name: str, sigil: str, what: str) -> str:
    value = str(request.path_params[name])
    if not (1 < len(value) <= MAX_ID and value.startswith(sigil)) or "\x00" in value:
        raise HttpError(400, "M_INVALID_PARAM", f"{name} must be {what}, not {value[:60]!r}")
    return value


def _receipt_type(request: Request) -> str:
    receipt_type = str(request.path_params["receipt_type"])
    if receipt_type == FULLY_READ:
        raise HttpError(400, "M_INVALID_PARAM", f"{FULLY_READ} (a read marker) is not supported here")
    if receipt_type not in RECEIPT_TYPES:
        raise HttpError(
            400, "M_INVALID_PARAM", f"receipt type must be one of {', '.join(RECEIPT_TYPES)}, not {receipt_type[:60]!r}"
        )
    return receipt_type


async def _thread_id(request: Request) -> str | None:
    body = await read_body(request, MAX_BODY_BYTES)
    if not body.strip():
        return None
    parsed = json.loads(json_object_text(body))
    if "thread_id" not in parsed:
        return None
    thread_id = parsed["thread_id"]
    if not isinstance(thread_id, str) or not thread_id:
        raise HttpError(400, "M_INVALID_PARAM", "thread_id must be a non-empty string")
    if thread_id != MAIN_THREAD and not (thread_id.startswith("$") and 1 < len(thread_id) <= MAX_ID):
        raise HttpError(
            400, "M_INVALID_PARAM", f"thread_id must be {MAIN_THREAD!r} or an event ID, not {thread_id[:60]!r}"
        )
    return thread_id


async def send_receipt(request: Request, host: HostApi) -> dict[str, object]:
    """Store the caller's receipt (module docstring); answers ``{}``."""
    user = calling_user(request)
    room_id = _param(request, "room_id", "!", "a room ID ('!opaque:server')")
    if ":" not in room_id:
        raise HttpError(400, "M_INVALID_PARAM", f"room_id must be a room ID ('!opaque:server'), not {room_id[:60]!r}")
    event_id = _param(request, "event_id", "$", "an event ID ('$...')")
    receipt_type = _receipt_type(request)
    require_writer(host, STREAM)
    thread_id = await _thread_id(request)
    memberships = host.state(Memberships)
    if not await memberships.is_joined(user, room_id):
        if not await memberships.joined_members(room_id):
            raise HttpError(404, "M_NOT_FOUND", f"room {room_id} is not known here")
        raise HttpError(403, "M_FORBIDDEN", f"{user} is not joined to {room_id}")
    event = await target_event(host, event_id)
    if event is None or event.room_id != room_id or event.outlier:
        raise HttpError(404, "M_NOT_FOUND", f"event {event_id} is not an event of room {room_id} here")
    if thread_id is not None and not await in_thread(host, event, thread_id):
        raise HttpError(400, "M_INVALID_PARAM", f"event_id {event_id} is not related to thread {thread_id}")
    row = ReceiptsRow(room_id, receipt_type, user, event_id, thread_id, {"ts": now_ms()})
    await host.state(ReceiptsStore).receive(row, event.stream_ordering)
    return {}


ROUTES = (
    RouteSpec(
        "/rooms/{room_id}/receipt/{receipt_type}/{event_id}",
        send_receipt,
        methods=("POST",),
        name="receipts_send",
        access="user",
    ),
)
