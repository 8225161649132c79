"""HTTP routes: read and write one type of a user's global or per-room account data.

``PUT`` stores the body (a JSON object, at most the configured size) as the type's new value on a
configured writer of the stream; ``GET`` returns the latest value from any instance. A user reads and
writes only their own account data. Every refusal is a 4xx with ``{"errcode", "error"}``, decided
before anything is written.
"""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from factstream import RouteSpec
from factstream_account_data.rows import STREAM, room_key
from factstream_account_data.store import AccountDataStore
from factstream_account_data.web import (
    HttpError,
    fail,
    json_object_text,
    max_body_bytes,
    raw_json_response,
    read_body,
)

MAX_TYPE_LENGTH = 255
MAX_ID_LENGTH = 255


def authenticated_user(request: Request) -> str:
    user = getattr(request.state, "user", None)
    user_id = getattr(user, "user_id", user)
    if not isinstance(user_id, str) or not user_id:
        fail(401, "M_MISSING_TOKEN", "this route needs an authenticated user")
    return user_id


def _target(request: Request, *, with_room: bool) -> tuple[str, str | None, str]:
    """``(user_id, room_id, data_type)`` of the path, after checking who may touch it."""
    params = request.path_params
    user_id, data_type = str(params["user_id"]), str(params["type"])
    room_id = str(params["room_id"]) if with_room else None
    caller = authenticated_user(request)
    if user_id != caller:
        fail(403, "M_FORBIDDEN", f"{caller} cannot access the account data of {user_id}")
    if not data_type or len(data_type) > MAX_TYPE_LENGTH:
        fail(400, "M_INVALID_PARAM", f"the account data type must be 1 to {MAX_TYPE_LENGTH} characters long")
    if room_id is not None and (not room_id or len(room_id) > MAX_ID_LENGTH):
        fail(400, "M_INVALID_PARAM", f"the room ID must be 1 to {MAX_ID_LENGTH} characters long")
    return user_id, room_id, data_type


def check_writer(host: Any) -> None:
    """421 unless this instance is a configured writer of the stream (naming the writers)."""
    gen = host.id_generator(STREAM)
    if not gen.is_writer:
        writers = ", ".join(gen.writers) or "(none)"
        fail(
            421,
            "M_MISDIRECTED",
            f"instance {gen.instance_name} does not write the {STREAM} stream; send writes to: {writers}",
        )


async def _put(request: Request, *, with_room: bool) -> Response:
    try:
        user_id, room_id, data_type = _target(request, with_room=with_room)
        host = request.state.host
        check_writer(host)
        content = json_object_text(await read_body(request, max_body_bytes()))
        stream_id = await AccountDataStore.of(host).put(user_id, room_id, data_type, content)
    except HttpError as exc:
        return exc.response()
    return JSONResponse({"stream_id": stream_id, "instance": host.instance_name})


async def _get(request: Request, *, with_room: bool) -> Response:
    try:
        user_id, room_id, data_type = _target(request, with_room=with_room)
        content = await AccountDataStore.of(request.state.host).get_content(user_id, room_key(room_id), data_type)
        if content is None:
            where = f" in room {room_id}" if room_id is not None else ""
            fail(404, "M_NOT_FOUND", f"no account data of type {data_type}{where} for {user_id}")
    except HttpError as exc:
        return exc.response()
    return raw_json_response(content)


async def put_global(request: Request) -> Response:
    return await _put(request, with_room=False)


async def get_global(request: Request) -> Response:
    return await _get(request, with_room=False)


async def put_room(request: Request) -> Response:
    return await _put(request, with_room=True)


async def get_room(request: Request) -> Response:
    return await _get(request, with_room=True)


GLOBAL_PATH = "/user/{user_id}/account_data/{type}"
ROOM_PATH = "/user/{user_id}/rooms/{room_id}/account_data/{type}"

ROUTES = (
    RouteSpec(GLOBAL_PATH, put_global, ("PUT",), name="account_data_put", access="writer"),
    RouteSpec(GLOBAL_PATH, get_global, ("GET",), name="account_data_get", access="user"),
    RouteSpec(ROOM_PATH, put_room, ("PUT",), name="room_account_data_put", access="writer"),
    RouteSpec(ROOM_PATH, get_room, ("GET",), name="room_account_data_get", access="user"),
)
