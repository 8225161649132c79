"""HTTP routes.

* ``POST /likes`` (a writing token, on a writer of the stream): ``{"user_id": ..., "target": ...}``
  records that the user likes the target; answers ``{"stream_id", "instance"}``.
* ``GET /likes/{target}`` (any user, any instance): ``{"target", "count"}``.
* ``GET /likes`` (any user, any instance): the likes this instance saw last, newest first.

Every refusal is a 4xx ``{"errcode", "error"}`` decided before anything is written.
"""

from __future__ import annotations

import msgspec
from starlette.requests import Request

from factstream import HostApi, HttpError, RouteSpec, read_body, require_writer
from factstream_likes.rows import STREAM, LikeRow
from factstream_likes.settings import LikesSettings
from factstream_likes.store import LikesStore, RecentLikes

#: The largest ``POST /likes`` body, in bytes (413 beyond).
MAX_BODY_BYTES = 8192
MAX_USER_ID_LENGTH = 255


def checked_target(host: HostApi, target: str) -> str:
    limit = host.plugin_settings(LikesSettings).max_target_length
    if not 1 <= len(target) <= limit:
        raise HttpError(400, "M_INVALID_PARAM", f"the target must be 1 to {limit} characters long")
    return target


async def post_like(request: Request, host: HostApi) -> dict[str, int | str]:
    """Record that a user likes a target."""
    require_writer(host, STREAM)  # 421 on an instance that does not write the stream
    body = await read_body(request, MAX_BODY_BYTES)
    like = msgspec.json.decode(body, type=LikeRow)  # the host answers 400 M_NOT_JSON or M_BAD_JSON
    if not 1 <= len(like.user_id) <= MAX_USER_ID_LENGTH:
        raise HttpError(400, "M_INVALID_PARAM", f"user_id must be 1 to {MAX_USER_ID_LENGTH} characters long")
    checked_target(host, like.target)
    stream_id = await host.state(LikesStore).add(like)
    return {"stream_id": stream_id, "instance": host.instance_name}


async def count_likes(request: Request, host: HostApi) -> dict[str, int | str]:
    """How many likes a target has."""
    target = checked_target(host, str(request.path_params["target"]))
    return {"target": target, "count": await host.state(LikesStore).count(target)}


async def recent_likes(request: Request, host: HostApi) -> dict[str, object]:
    """The likes this instance saw last, newest first."""
    return {"instance": host.instance_name, "likes": list(host.state(RecentLikes).likes)}


ROUTES = (
    RouteSpec("/likes", post_like, methods=("POST",), name="likes_post", access="writer"),
    RouteSpec("/likes", recent_likes, methods=("GET",), name="likes_recent", access="user"),
    RouteSpec("/likes/{target}", count_likes, methods=("GET",), name="likes_count", access="user"),
)
