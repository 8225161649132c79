"""HTTP routes, shaped like the Matrix client-server API where it has one (docs/plugins/events.md).

Local writes (any user token; the sender is always the calling user; on a writer of ``events``):
``POST /createRoom``, ``PUT /rooms/{room_id}/send/{type}/{txn_id}``,
``PUT /rooms/{room_id}/state/{type}[/{state_key}]``, ``POST /rooms/{room_id}/{join,leave,invite,kick,
ban,unban}``, ``PUT /rooms/{room_id}/redact/{event_id}/{txn_id}``. Remote writes (writer token):
``POST /rooms/{room_id}/remote_events``. Reads: ``GET /rooms/{room_id}/event/{event_id}``,
``GET /rooms/{room_id}/state[?at=]``, ``GET /rooms/{room_id}/messages``,
``GET /rooms/{room_id}/backfill`` (writer token); per user: ``GET /events?from=`` (what is new since a
stream token) and ``GET /recent`` (the newest events of the user's most recent rooms).

Every refusal is a 4xx ``{"errcode", "error"}`` whose message names the field, decided before
anything is stored.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from typing import Any

import msgspec
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from factstream import HostApi, HttpError, RouteSpec, caller_can_write, calling_user, read_body, require_writer
from factstream_events.read.reads import DEFAULT_PAGE, MAX_PAGE, Reads
from factstream_events.read.timeline import DEFAULT_TIMELINE, RoomTimeline
from factstream_events.rules.canonical import EventJsonError, parse_event_json
from factstream_events.rules.contentrules import REDACT_ROUTE, STATE_TYPES, is_user_id, state_route
from factstream_events.rules.errors import EventsError, MisdirectedWrite
from factstream_events.rules.validate import REDACTION
from factstream_events.shared.rows import BACKFILL_STREAM, STREAM
from factstream_events.shared.settings import EventsSettings
from factstream_events.shared.sharding import refuse_misdirected
from factstream_events.store import EventsStore, RemoteEvent

Endpoint = Callable[[Request, HostApi], Awaitable[Any]]
MAX_ID = 255


def answers(endpoint: Endpoint) -> Endpoint:
    """Turn the store's errors into HTTP answers (a misdirected write's names the room's writer)."""

    @functools.wraps(endpoint)
    async def wrapped(request: Request, host: HostApi) -> Any:
        try:
            return await endpoint(request, host)
        except MisdirectedWrite as exc:
            return misdirected(exc)
        except EventsError as exc:
            raise HttpError(exc.status, exc.errcode, str(exc)) from None

    return wrapped


def misdirected(exc: MisdirectedWrite) -> Response:
    """421 ``M_MISDIRECTED``: the API's error shape plus ``writer`` (and ``writer_url`` when known), so a
    client or a proxy resends to the room's writer without parsing the message."""
    body = {"errcode": exc.errcode, "error": str(exc), "writer": exc.writer}
    if exc.url is not None:
        body["writer_url"] = exc.url
    return JSONResponse(body, status_code=exc.status)


def _room_of_write(request: Request, host: HostApi) -> str:
    """The ``room_id`` of a write route, refused (421) at once on an instance that does not write it,
    before the body is read: the room's writer is the one to judge the rest."""
    room_id = _param(request, "room_id")
    refuse_misdirected(host, room_id)
    return room_id


def store(host: HostApi) -> EventsStore:
    return host.state(EventsStore)


def reads(host: HostApi) -> Reads:
    return host.state(EventsStore).reads


def json_response(body: bytes, status: int = 200) -> Response:
    return Response(body, status_code=status, media_type="application/json")


def _param(request: Request, name: str) -> str:
    value = str(request.path_params[name])
    if not value or len(value) > MAX_ID or "\x00" in value:
        raise HttpError(400, "M_INVALID_PARAM", f"{name} must be 1 to {MAX_ID} characters without NUL")
    return value


async def _object(request: Request, host: HostApi) -> dict[str, Any]:
    body = await read_body(request, host.plugin_settings(EventsSettings).max_body_bytes)
    if not body.strip():
        return {}
    try:
        return parse_event_json(body)
    except EventJsonError as exc:
        raise HttpError(400, "M_NOT_JSON", f"the request body: {exc}") from None


def _field(body: dict[str, Any], name: str, kind: type, default: Any = None) -> Any:
    value = body.get(name, default)
    if value is not default and not isinstance(value, kind):
        raise HttpError(400, "M_INVALID_PARAM", f"{name}: must be a {kind.__name__}, not {type(value).__name__}")
    return value


def _user_id(value: Any, name: str = "user_id") -> str:
    if not is_user_id(value):
        raise HttpError(400, "M_INVALID_PARAM", f"{name}: must be a user ID ('@localpart:server'), not {value!r:.60}")
    return str(value)


def _initial_state(item: Any, where: str) -> tuple[str, str, dict[str, Any]]:
    """One ``initial_state`` entry as ``(type, state_key, content)``; a 400 naming what is wrong."""
    if not isinstance(item, dict):
        raise HttpError(400, "M_INVALID_PARAM", f"{where}: must be an object with type and content")
    event_type, state_key, content = item.get("type"), item.get("state_key", ""), item.get("content")
    if not isinstance(event_type, str) or not 1 <= len(event_type) <= MAX_ID:
        raise HttpError(400, "M_INVALID_PARAM", f"{where}.type: must be a string of 1 to {MAX_ID} characters")
    if not isinstance(state_key, str) or len(state_key) > MAX_ID:
        raise HttpError(400, "M_INVALID_PARAM", f"{where}.state_key: must be a string of at most {MAX_ID} characters")
    if not isinstance(content, dict):
        raise HttpError(400, "M_INVALID_PARAM", f"{where}.content: must be an object")
    return event_type, state_key, content


@answers
async def create_room(request: Request, host: HostApi) -> dict[str, str]:
    user = calling_user(request)
    require_writer(host, STREAM)
    body = await _object(request, host)
    initial = _field(body, "initial_state", list, [])
    state = [_initial_state(item, f"initial_state[{i}]") for i, item in enumerate(initial)]
    invite = [_user_id(u, "invite[]") for u in _field(body, "invite", list, [])]
    room_id = await store(host).create_room(
        user,
        preset=_field(body, "preset", str, "private_chat"),
        history_visibility=_field(body, "history_visibility", str, "shared"),
        name=_field(body, "name", str),
        topic=_field(body, "topic", str),
        room_version=_field(body, "room_version", str, "10"),
        initial_state=state,
        invite=invite,
    )
    return {"room_id": room_id}


@answers
async def send_event(request: Request, host: HostApi) -> dict[str, str]:
    user = calling_user(request)
    require_writer(host, STREAM)
    room_id = _room_of_write(request, host)
    event_type, txn_id = _param(request, "event_type"), _param(request, "txn_id")
    if event_type in STATE_TYPES:
        raise HttpError(400, "M_INVALID_PARAM", f"event_type: {event_type} is a state event: {state_route(event_type)}")
    if event_type == REDACTION:
        raise HttpError(400, "M_INVALID_PARAM", f"event_type: {REDACTION} is not sent: {REDACT_ROUTE}")
    content = await _object(request, host)
    event_id = await store(host).send(room_id, user, event_type, content, txn_id=txn_id)
    return {"event_id": event_id}


@answers
async def set_state(request: Request, host: HostApi) -> dict[str, str]:
    user = calling_user(request)
    require_writer(host, STREAM)
    room_id, event_type = _room_of_write(request, host), _param(request, "event_type")
    state_key = str(request.path_params.get("state_key", ""))
    if len(state_key) > MAX_ID or "\x00" in state_key:
        raise HttpError(400, "M_INVALID_PARAM", f"state_key must be at most {MAX_ID} characters without NUL")
    content = await _object(request, host)
    event_id = await store(host).send(room_id, user, event_type, content, state_key=state_key)
    return {"event_id": event_id}


def _membership_route(verb: str, membership: str, *, of_self: bool) -> Endpoint:
    @answers
    async def endpoint(request: Request, host: HostApi) -> dict[str, str]:
        user = calling_user(request)
        require_writer(host, STREAM)
        room_id = _room_of_write(request, host)
        body = await _object(request, host)
        target = user if of_self else _user_id(body.get("user_id"))
        reason = _field(body, "reason", str)
        event_id = await store(host).change_membership(room_id, user, target, membership, reason=reason, verb=verb)
        return {"event_id": event_id}

    return endpoint


@answers
async def redact(request: Request, host: HostApi) -> dict[str, str]:
    user = calling_user(request)
    require_writer(host, STREAM)
    room_id = _room_of_write(request, host)
    target, txn_id = _param(request, "event_id"), _param(request, "txn_id")
    body = await _object(request, host)
    event_id = await store(host).redact(room_id, user, target, reason=_field(body, "reason", str), txn_id=txn_id)
    return {"event_id": event_id}


class RemoteBatch(msgspec.Struct, forbid_unknown_fields=True):
    """The body of ``POST /rooms/{room_id}/remote_events``; each event's bytes are kept as received."""

    events: list[msgspec.Raw]
    event_ids: list[str | None] | None = None
    outlier: bool = False
    backfill: bool = False
    room_version: str | None = None


@answers
async def remote_events(request: Request, host: HostApi) -> dict[str, Any]:
    require_writer(host, STREAM)
    room_id = _room_of_write(request, host)
    body = await read_body(request, host.plugin_settings(EventsSettings).max_body_bytes)
    try:
        batch = msgspec.json.decode(body, type=RemoteBatch)
    except RecursionError:
        raise HttpError(400, "M_NOT_JSON", "the request body: not valid JSON: nested too deeply") from None
    except msgspec.ValidationError as exc:
        raise HttpError(400, "M_BAD_JSON", f"the request body: {exc}") from None
    except msgspec.DecodeError as exc:
        raise HttpError(400, "M_NOT_JSON", f"the request body is not valid JSON: {exc}") from None
    if batch.event_ids is not None and len(batch.event_ids) != len(batch.events):
        raise HttpError(400, "M_INVALID_PARAM", "event_ids: must have one entry (or null) per event")
    if batch.outlier and batch.backfill:
        raise HttpError(400, "M_INVALID_PARAM", "outlier and backfill: a batch is one or the other")
    if batch.backfill:
        require_writer(host, BACKFILL_STREAM)
    ids = batch.event_ids or [None] * len(batch.events)
    events = [RemoteEvent(bytes(raw), ids[i], batch.outlier) for i, raw in enumerate(batch.events)]
    outcome = await store(host).persist_remote(
        room_id, events, backfill=batch.backfill, room_version=batch.room_version
    )
    return {"stored": outcome.stored, "already_stored": outcome.duplicates}


@answers
async def get_event(request: Request, host: HostApi) -> Response:
    room_id, event_id = _param(request, "room_id"), _param(request, "event_id")
    user = calling_user(request)
    raw = request.query_params.get("raw") in {"1", "true"}
    if raw and not caller_can_write(request):
        raise HttpError(403, "M_FORBIDDEN", "raw=true needs a writer token")
    return json_response(await reads(host).event(None if raw else user, event_id, room_id))


@answers
async def get_state(request: Request, host: HostApi) -> Response:
    room_id = _param(request, "room_id")
    user = calling_user(request)
    as_server = request.query_params.get("server") in {"1", "true"}
    if as_server and not caller_can_write(request):
        raise HttpError(403, "M_FORBIDDEN", "server=true needs a writer token")
    at = request.query_params.get("at")
    events = await reads(host).state_events(None if as_server else user, room_id, at)
    return json_response(b"[" + b",".join(events) + b"]")


@answers
async def get_messages(request: Request, host: HostApi) -> Response:
    room_id = _param(request, "room_id")
    user = calling_user(request)
    q = request.query_params
    direction = q.get("dir", "b")
    if direction not in ("b", "f"):
        raise HttpError(400, "M_INVALID_PARAM", f"dir: must be 'b' or 'f', not {direction[:20]!r}")
    page = await reads(host).messages(
        user,
        room_id,
        from_token=q.get("from"),
        to_token=q.get("to"),
        direction="b" if direction == "b" else "f",
        limit=_number(request, "limit", DEFAULT_PAGE, huge=MAX_PAGE),  # Reads.messages clamps to MAX_PAGE
    )
    head = msgspec.json.encode({"start": page.start, **({"end": page.end} if page.end else {})})
    return json_response(head[:-1] + b',"chunk":[' + b",".join(page.chunk) + b"]}")


@answers
async def get_backfill(request: Request, host: HostApi) -> Response:
    room_id = _param(request, "room_id")
    seeds = request.query_params.getlist("v")
    events = await reads(host).backfill(room_id, seeds, _number(request, "limit", 100))
    return json_response(b'{"pdus":[' + b",".join(events) + b"]}")


def _number(request: Request, name: str, default: int, *, huge: int | None = None) -> int:
    """Query parameter ``name``, a whole number (``huge`` for one of more than 9 digits, where given)."""
    text = request.query_params.get(name, str(default))
    if not (text.isascii() and text.isdigit()) or (len(text) > 9 and huge is None):
        raise HttpError(400, "M_INVALID_PARAM", f"{name}: must be a whole number, not {text[:20]!r}")
    return int(text) if len(text) <= 9 else int(huge or 0)


def _timeline_json(room: RoomTimeline) -> bytes:
    head = {"membership": room.membership, "limited": room.limited}
    if room.prev_batch is not None:
        head["prev_batch"] = room.prev_batch
    return msgspec.json.encode(head)[:-1] + b',"events":[' + b",".join(room.events) + b"]}"


@answers
async def get_new_events(request: Request, host: HostApi) -> Response:
    user = calling_user(request)
    limit = _number(request, "limit", DEFAULT_TIMELINE)
    found = await store(host).timeline.new_events(user, request.query_params.get("from"), limit=limit)
    rooms = b",".join(msgspec.json.encode(r.room_id) + b":" + _timeline_json(r) for r in found.rooms)
    head = msgspec.json.encode({"next": found.next})[:-1]
    return json_response(head + b',"memberships":[' + b",".join(found.memberships) + b'],"rooms":{' + rooms + b"}}")


@answers
async def get_recent(request: Request, host: HostApi) -> Response:
    user = calling_user(request)
    found = await store(host).timeline.recent(
        user, rooms=_number(request, "rooms", 20), limit=_number(request, "limit", DEFAULT_TIMELINE)
    )
    rooms = b",".join(_timeline_json(r)[:-1] + b',"room_id":' + msgspec.json.encode(r.room_id) + b"}" for r in found)
    return json_response(b'{"rooms":[' + rooms + b"]}")


ROUTES = (
    RouteSpec("/createRoom", create_room, ("POST",), name="events_create_room", access="user"),
    RouteSpec("/rooms/{room_id}/send/{event_type}/{txn_id}", send_event, ("PUT",), name="events_send", access="user"),
    RouteSpec("/rooms/{room_id}/state/{event_type}", set_state, ("PUT",), name="events_state", access="user"),
    RouteSpec(
        "/rooms/{room_id}/state/{event_type}/{state_key}", set_state, ("PUT",), name="events_state_key", access="user"
    ),
    *(
        RouteSpec(
            f"/rooms/{{room_id}}/{verb}",
            _membership_route(verb, membership, of_self=verb in {"join", "leave"}),
            ("POST",),
            name=f"events_{verb}",
            access="user",
        )
        for verb, membership in (
            ("join", "join"),
            ("leave", "leave"),
            ("invite", "invite"),
            ("kick", "leave"),
            ("ban", "ban"),
            ("unban", "leave"),
        )
    ),
    RouteSpec("/rooms/{room_id}/redact/{event_id}/{txn_id}", redact, ("PUT",), name="events_redact", access="user"),
    RouteSpec("/rooms/{room_id}/remote_events", remote_events, ("POST",), name="events_remote", access="writer"),
    RouteSpec("/rooms/{room_id}/event/{event_id}", get_event, ("GET",), name="events_event", access="user"),
    RouteSpec("/rooms/{room_id}/state", get_state, ("GET",), name="events_room_state", access="user"),
    RouteSpec("/rooms/{room_id}/messages", get_messages, ("GET",), name="events_messages", access="user"),
    RouteSpec("/rooms/{room_id}/backfill", get_backfill, ("GET",), name="events_backfill", access="writer"),
    RouteSpec("/events", get_new_events, ("GET",), name="events_new", access="user"),
    RouteSpec("/recent", get_recent, ("GET",), name="events_recent", access="user"),
)
