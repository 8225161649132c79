"""HTTP routes in the shape of the Matrix client API.

* ``PUT /rooms/{room_id}/typing/{user_id}`` (the user themself, joined to the room, on the stream's
  writer; 421 elsewhere): ``{"typing": true, "timeout": ms}`` or ``{"typing": false}``. Without a
  ``timeout`` the user types for ``plugins.typing.default_timeout_ms``; a longer one is cut to
  ``max_timeout_ms`` (the reference's 30 and 120 seconds). Answers ``{}``.
* ``GET /rooms/{room_id}/typing`` (a member of the room, any instance): ``{"user_ids": [...]}``, this
  instance's view.

A room nobody is joined to is a 404; one the caller is not joined to a 403.

Every refusal is a 4xx ``{"errcode", "error"}`` decided before anything changes.
"""

from __future__ import annotations

from typing import Any

import msgspec
from factstream_events import Memberships
from starlette.requests import Request

from factstream import HostApi, HttpError, RouteSpec, calling_user, read_body, require_writer
from factstream_typing.rows import STREAM
from factstream_typing.settings import TypingSettings
from factstream_typing.state import TypingView, TypingWriter

MAX_BODY_BYTES = 4096
MAX_ID_LENGTH = 255


class TypingBody(msgspec.Struct, frozen=True, forbid_unknown_fields=False):
    typing: bool
    timeout: int | None = None


def _room(request: Request) -> str:
    room = str(request.path_params["room_id"])
    if not 1 <= len(room) <= MAX_ID_LENGTH:
        raise HttpError(400, "M_INVALID_PARAM", f"room_id must be 1 to {MAX_ID_LENGTH} characters long")
    return room


async def _member(host: HostApi, user: str, room: str) -> None:
    """404 for a room nobody is joined to, 403 for a user not joined to it."""
    memberships = host.state(Memberships)
    if not await memberships.is_joined(user, room):
        if not await memberships.joined_members(room):
            raise HttpError(404, "M_NOT_FOUND", f"room {room} is not known here")
        raise HttpError(403, "M_FORBIDDEN", f"user {user} is not joined to room {room}")


async def set_typing(request: Request, host: HostApi) -> dict[str, Any]:
    """Start or stop typing in a room."""
    user = calling_user(request)
    room = _room(request)
    target = str(request.path_params["user_id"])
    if target != user:
        raise HttpError(403, "M_FORBIDDEN", f"user {user} cannot set the typing state of {target[:MAX_ID_LENGTH]}")
    require_writer(host, STREAM)
    await _member(host, user, room)
    try:
        body = msgspec.json.decode(await read_body(request, MAX_BODY_BYTES), type=TypingBody)
    except msgspec.ValidationError as exc:
        raise HttpError(400, "M_BAD_JSON", f"the body must be {{'typing': bool, 'timeout': ms}}: {exc}") from None
    except msgspec.DecodeError as exc:
        raise HttpError(400, "M_NOT_JSON", f"the body is not JSON: {exc}") from None
    settings = host.plugin_settings(TypingSettings)
    timeout = settings.default_timeout_ms if body.timeout is None else body.timeout
    if timeout < 0:
        raise HttpError(400, "M_INVALID_PARAM", f"timeout must be a number of milliseconds >= 0, not {timeout}")
    host.state(TypingWriter).set_typing(room, user, body.typing, min(timeout, settings.max_timeout_ms))
    return {}


async def get_typing(request: Request, host: HostApi) -> dict[str, Any]:
    """Who types in a room, as this instance sees it (for the room's members only)."""
    user = calling_user(request)
    room = _room(request)
    await _member(host, user, room)
    typing = host.state(TypingView).rooms.get(room)
    return {"user_ids": list(typing.users) if typing is not None else []}


ROUTES = (
    RouteSpec("/rooms/{room_id}/typing/{user_id}", set_typing, ("PUT",), name="typing_set", access="user"),
    RouteSpec("/rooms/{room_id}/typing", get_typing, ("GET",), name="typing_get", access="user"),
)
