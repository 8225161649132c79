"""HTTP routes.

* ``POST /${name}`` (a writing token, on a writer of the stream): ``{"user_id", "key", "value"}``
  appends one fact; answers ``{"stream_id", "instance"}``.
* ``GET /${name}/{key}`` (any user, any instance): ``{"key", "count"}``, read through the cache.

Every refusal is a 4xx ``{"errcode", "error"}`` decided before anything is written. The host refuses
on its own what PostgreSQL could not store (a NUL character, a lone surrogate) and bodies that are not
JSON or do not match the row type (``M_NOT_JSON``, ``M_BAD_JSON``).
"""

from __future__ import annotations

import msgspec
from factstream import HostApi, HttpError, RouteSpec, read_body, require_writer
from starlette.requests import Request

from ${package}.rows import STREAM, ${camel}Row
from ${package}.settings import ${camel}Settings
from ${package}.store import ${camel}Store

#: The largest ``POST /${name}`` body, in bytes (413 beyond).
MAX_BODY_BYTES = 65_536
MAX_ID_LENGTH = 255


def checked_key(key: str) -> str:
    if not 1 <= len(key) <= MAX_ID_LENGTH:
        raise HttpError(400, "M_INVALID_PARAM", f"key must be 1 to {MAX_ID_LENGTH} characters long")
    return key


async def append(request: Request, host: HostApi) -> dict[str, int | str]:
    """Append one fact."""
    require_writer(host, STREAM)  # 421 on an instance that does not write the stream
    body = await read_body(request, MAX_BODY_BYTES)
    row = msgspec.json.decode(body, type=${camel}Row)  # the host answers 400 M_NOT_JSON or M_BAD_JSON
    if not 1 <= len(row.user_id) <= MAX_ID_LENGTH:
        raise HttpError(400, "M_INVALID_PARAM", f"user_id must be 1 to {MAX_ID_LENGTH} characters long")
    checked_key(row.key)
    limit = host.plugin_settings(${camel}Settings).max_value_length
    if len(row.value) > limit:
        raise HttpError(400, "M_INVALID_PARAM", f"value must be at most {limit} characters long")
    stream_id = await host.state(${camel}Store).append(row)
    return {"stream_id": stream_id, "instance": host.instance_name}


async def count(request: Request, host: HostApi) -> dict[str, int | str]:
    """How many facts a key has."""
    key = checked_key(str(request.path_params["key"]))
    return {"key": key, "count": await host.state(${camel}Store).count(key)}


ROUTES = (
    RouteSpec("/${name}", append, methods=("POST",), name="${name}_append", access="writer"),
    RouteSpec("/${name}/{key}", count, methods=("GET",), name="${name}_count", access="user"),
)
