"""HTTP routes in the shape of the Matrix client API.

* ``PUT /presence/{user_id}/status`` (the user themself, on the stream's writer; 421 elsewhere):
  ``{"presence": "online" | "unavailable" | "offline", "status_msg": "..."}``; answers ``{}``.
* ``GET /presence/{user_id}/status`` (any instance): ``{"presence", "last_active_ago",
  "currently_active", "status_msg"?}`` for the user themself or a user sharing a room with them now
  (``offline`` for one who never had a presence, as with the reference); 404 ``M_NOT_FOUND`` for anyone
  else (as for a user nobody knows: presence does not tell who exists).

Every refusal is a 4xx ``{"errcode", "error"}`` decided before anything changes.
"""

from __future__ import annotations

from typing import Any

import msgspec
from starlette.requests import Request

from factstream import HostApi, HttpError, RouteSpec, calling_user, read_body, require_writer
from factstream_presence.rows import STATES, STREAM, PresenceRow
from factstream_presence.settings import PresenceSettings
from factstream_presence.store import PresenceStore
from factstream_presence.sync import event
from factstream_presence.writer import PresenceWriter, now_ms

MAX_BODY_BYTES = 65_536
MAX_ID_LENGTH = 255


class StatusBody(msgspec.Struct, frozen=True):
    presence: str
    status_msg: str | None = None


def _target(request: Request) -> str:
    user = str(request.path_params["user_id"])
    if not 1 <= len(user) <= MAX_ID_LENGTH:
        raise HttpError(400, "M_INVALID_PARAM", f"user_id must be 1 to {MAX_ID_LENGTH} characters long")
    return user


async def set_status(request: Request, host: HostApi) -> dict[str, Any]:
    """Set one's own presence and status message."""
    user = calling_user(request)
    target = _target(request)
    if not host.plugin_settings(PresenceSettings).enabled:
        raise HttpError(403, "M_FORBIDDEN", "presence is disabled on this server (plugins.presence.enabled)")
    if target != user:
        raise HttpError(403, "M_FORBIDDEN", f"user {user} cannot set the presence of {target}")
    require_writer(host, STREAM)
    try:
        body = msgspec.json.decode(await read_body(request, MAX_BODY_BYTES), type=StatusBody)
    except msgspec.ValidationError as exc:
        raise HttpError(
            400, "M_BAD_JSON", f"the body must be {{'presence': state, 'status_msg': text}}: {exc}"
        ) from None
    except msgspec.DecodeError as exc:
        raise HttpError(400, "M_NOT_JSON", f"the body is not JSON: {exc}") from None
    if body.presence not in STATES:
        raise HttpError(
            400, "M_INVALID_PARAM", f"presence must be one of {', '.join(STATES)}, not {body.presence[:40]!r}"
        )
    limit = host.plugin_settings(PresenceSettings).max_status_msg_length
    if body.status_msg is not None and (len(body.status_msg) > limit or "\x00" in body.status_msg):
        raise HttpError(400, "M_INVALID_PARAM", f"status_msg must be at most {limit} characters, without NUL")
    await host.state(PresenceWriter).set_presence(user, body.presence, body.status_msg)
    return {}


async def get_status(request: Request, host: HostApi) -> dict[str, Any]:
    """A user's presence, for themself and the users sharing a room with them."""
    user = calling_user(request)
    target = _target(request)
    store = host.state(PresenceStore)
    if target not in await store.visible_to(user):
        raise HttpError(404, "M_NOT_FOUND", f"no presence of {target} is visible to {user}")
    row = await store.latest(target) or PresenceRow(target, "offline", 0, 0, 0, None, False)  # never set
    return dict(event(row, now_ms())["content"])


ROUTES = (
    RouteSpec("/presence/{user_id}/status", set_status, ("PUT",), name="presence_set", access="user"),
    RouteSpec("/presence/{user_id}/status", get_status, ("GET",), name="presence_get", access="user"),
)
