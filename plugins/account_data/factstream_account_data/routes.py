"""HTTP routes: read and write one type of a user's global or per-room account data.

``PUT`` stores the body (a JSON object, at most ``plugins.account_data.max_body_bytes``) as the type's
new value on a configured writer of the stream; ``GET`` returns the latest value from any instance. A
user reads and writes only their own account data. Every refusal is a 4xx ``{"errcode", "error"}``
(a :class:`factstream.HttpError`), decided before anything is written.
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response

from factstream import (
    HostApi,
    HttpError,
    RouteSpec,
    calling_user,
    json_object_text,
    raw_json_response,
    read_body,
    require_writer,
)
from factstream_account_data.rows import STREAM, room_key
from factstream_account_data.settings import AccountDataSettings
from factstream_account_data.store import AccountDataStore

MAX_TYPE_LENGTH = 255
MAX_ID_LENGTH = 255


def _target(request: Request, *, with_room: bool) -> tuple[str, str | None, str]:
    """``(user_id, room_id, data_type)`` of the path, after checking who may touch it."""
    params = request.path_params
    user_id, data_type = str(params["user_id"]), str(params["type"])
    room_id = str(params["room_id"]) if with_room else None
    caller = calling_user(request)
    if user_id != caller:
        raise HttpError(403, "M_FORBIDDEN", f"{caller} cannot access the account data of {user_id}")
    if not data_type or len(data_type) > MAX_TYPE_LENGTH:
        raise HttpError(400, "M_INVALID_PARAM", f"the account data type must be 1 to {MAX_TYPE_LENGTH} characters long")
    if room_id is not None and (not room_id or len(room_id) > MAX_ID_LENGTH):
        raise HttpError(400, "M_INVALID_PARAM", f"the room ID must be 1 to {MAX_ID_LENGTH} characters long")
    return user_id, room_id, data_type


async def _put(request: Request, host: HostApi, *, with_room: bool) -> dict[str, int | str]:
    user_id, room_id, data_type = _target(request, with_room=with_room)
    require_writer(host, STREAM)
    limit = host.plugin_settings(AccountDataSettings).max_body_bytes
    content = json_object_text(await read_body(request, limit))
    stream_id = await host.state(AccountDataStore).put(user_id, room_id, data_type, content)
    return {"stream_id": stream_id, "instance": host.instance_name}


async def _get(request: Request, host: HostApi, *, with_room: bool) -> Response:
    user_id, room_id, data_type = _target(request, with_room=with_room)
    content = await host.state(AccountDataStore).get_content(user_id, room_key(room_id), data_type)
    if content is None:
        where = f" in room {room_id}" if room_id is not None else ""
        raise HttpError(404, "M_NOT_FOUND", f"no account data of type {data_type}{where} for {user_id}")
    return raw_json_response(content)


async def put_global(request: Request, host: HostApi) -> dict[str, int | str]:
    """Store a type of the user's global account data (the body, a JSON object, kept byte for byte)."""
    return await _put(request, host, with_room=False)


async def get_global(request: Request, host: HostApi) -> Response:
    """The latest value of a type of the user's global account data."""
    return await _get(request, host, with_room=False)


async def put_room(request: Request, host: HostApi) -> dict[str, int | str]:
    """Store a type of the user's account data in one room."""
    return await _put(request, host, with_room=True)


async def get_room(request: Request, host: HostApi) -> Response:
    """The latest value of a type of the user's account data in one room."""
    return await _get(request, host, with_room=True)


GLOBAL_PATH = "/user/{user_id}/account_data/{type}"
ROOM_PATH = "/user/{user_id}/rooms/{room_id}/account_data/{type}"

ROUTES = (
    RouteSpec(GLOBAL_PATH, put_global, ("PUT",), name="account_data_put", access="writer"),
    RouteSpec(GLOBAL_PATH, get_global, ("GET",), name="account_data_get", access="user"),
    RouteSpec(ROOM_PATH, put_room, ("PUT",), name="room_account_data_put", access="writer"),
    RouteSpec(ROOM_PATH, get_room, ("GET",), name="room_account_data_get", access="user"),
)
