"""The core's own HTTP routes: ``/sync``, ``/streams``, ``/streams/{name}/positions``, ``/health``,
``/metrics`` and ``/openapi.json``. They are ordinary :class:`~factstream.plugin.specs.RouteSpec` endpoints,
served and documented exactly like a plugin's (see :mod:`factstream.host.http` and docs/http-api.md).
"""

from __future__ import annotations

import json
import time
from typing import TYPE_CHECKING, Any

from prometheus_client import CONTENT_TYPE_LATEST, REGISTRY, generate_latest
from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from factstream.host.dashboard import dashboard_routes
from factstream.host.health import check_health
from factstream.host.http import CORE, ApiRoute
from factstream.plugin.specs import RouteSpec
from factstream.plugin.web import HttpError
from factstream.replication.auth import ReplicationSecret
from factstream.replication.kept import KEPT_UPDATES_PATH, MAX_KEPT_LIMIT, SIGNATURE_HEADER

if TYPE_CHECKING:
    from factstream.host.parts import HostParts
    from factstream.plugin.api import HostApi
    from factstream.plugin.manager import PluginHost
    from factstream.replication.stream import ReplicatedStream


#: The longest ``device`` query parameter accepted.
MAX_DEVICE_LENGTH = 255
#: The longest `filter` a `/sync` accepts, in characters.
MAX_FILTER_LENGTH = 8_192
#: A ``timeout`` with more significant digits than this is past any cap (10**9 ms is 11 days; the
#: cap is at most 600 s) and is not converted: Python refuses to ``int()`` more than 4,300 digits.
_TIMEOUT_DIGITS = 9


def _host(request: Request) -> HostParts:
    host: HostParts = request.app.state.host
    return host


async def sync(request: Request, api: HostApi) -> Any:
    """Long-poll every synced stream: the user's new items per stream and the next token.

    Answers at once when something is new for the user after ``since`` (or, without ``since``,
    everything the user may see, up to the limit); otherwise waits up to ``timeout`` milliseconds
    for something to happen. Use ``next_batch`` as the next request's ``since``. With
    ``"limited": true`` more items are waiting: sync again at once.
    """
    host = _host(request)
    query = request.query_params
    timeout_text = query.get("timeout", "0")
    if not timeout_text.isascii() or not timeout_text.isdigit():
        raise HttpError(
            400, "M_INVALID_PARAM", f"timeout must be a whole number of milliseconds, not {timeout_text[:40]!r}"
        )
    # Any non-negative value is accepted; the service caps it at http.sync_timeout_max_seconds.
    digits = timeout_text.lstrip("0")
    timeout_ms = int(digits or "0") if len(digits) <= _TIMEOUT_DIGITS else 10**_TIMEOUT_DIGITS
    device = query.get("device") or None
    if device is not None and len(device) > MAX_DEVICE_LENGTH:
        raise HttpError(400, "M_INVALID_PARAM", f"device must be at most {MAX_DEVICE_LENGTH} characters")
    sync_filter = _sync_filter(query.get("filter"))
    since = query.get("since")
    return await host.sync.sync(request.state.user, since, timeout_ms / 1000, device, api=api, filter=sync_filter)


def _sync_filter(text: str | None) -> dict[str, Any]:
    """The ``filter`` parameter: a JSON object given inline (400 naming what is wrong otherwise)."""
    if text is None or text == "":
        return {}
    if len(text) > MAX_FILTER_LENGTH:
        raise HttpError(400, "M_INVALID_PARAM", f"filter: at most {MAX_FILTER_LENGTH} characters, not {len(text)}")
    try:
        value = json.loads(text)
    except ValueError as e:
        raise HttpError(400, "M_NOT_JSON", f"filter: not JSON ({e}); give the filter object inline") from None
    if not isinstance(value, dict):
        raise HttpError(400, "M_BAD_JSON", f"filter: must be a JSON object, not {type(value).__name__}")
    return value


def _stream_info(host: HostParts, stream: ReplicatedStream) -> dict[str, Any]:
    gen = stream.id_gen
    registry = host.plugins.registry
    spec = stream.spec
    return {
        "name": stream.name,
        "plugin": registry.streams.entries[stream.name].plugin if stream.name in registry.streams else None,
        "description": spec.description,
        "writers": host.settings.writers_for(stream.name) if spec.writers == "configured" else "any",
        "is_writer": gen.is_writer,
        "sync_key": spec.sync_key,
        "positions": {w: p * stream.factor for w, p in sorted(gen.get_positions().items())},
        "current_token": gen.get_current_token() * stream.factor,
        "persisted_upto": gen.get_persisted_upto_position() * stream.factor,
    }


async def streams(request: Request, api: HostApi) -> Any:
    """Every registered stream with its plugin, writers, sync key and positions on this instance."""
    host = _host(request)
    return {"instance": host.instance_name, "streams": [_stream_info(host, s) for s in host.streams.values()]}


async def stream_positions(request: Request, api: HostApi) -> Any:
    """One stream's positions as this instance sees them.

    ``positions``: each writer's position; ``current_token``: the position every writer has
    reached (the minimum, what single-position readers use); ``persisted_upto``: the watermark
    below which no fact is missing (what exports read up to). All are wire tokens.
    """
    host = _host(request)
    name = request.path_params["name"]
    stream = host.streams.get(name)
    if stream is None:
        known = ", ".join(host.streams) or "none"
        raise HttpError(404, "M_NOT_FOUND", f"unknown stream {name[:100]!r} (streams: {known})")
    info = _stream_info(host, stream)
    return {"instance": host.instance_name, "stream": name} | {
        k: info[k] for k in ("positions", "current_token", "persisted_upto")
    }


async def health(request: Request, api: HostApi) -> Any:
    """Whether this instance can do its work: 200 ``ok``, or 503 ``degraded`` with every reason
    (see :mod:`factstream.host.health`); ``?strict=false`` answers 200 either way (liveness probes)."""
    host = _host(request)
    transport = host.transport
    result = await check_health(host, time.time())
    body = {
        "status": result.status,
        "instance": host.instance_name,
        "reasons": [reason.as_json() for reason in result.reasons],
        "replication": {
            "transport": None if transport is None else ("redis" if host.settings.redis.url else "tcp"),
            "connected": bool(transport is not None and transport.has_peers()),
            "connections": len(host.handler.connections),
            "links": [] if transport is None else [link.as_json() for link in transport.links()],
        },
    }
    strict = request.query_params.get("strict", "true").lower() not in ("false", "0", "no")
    return JSONResponse(body, status_code=503 if result.degraded and strict else 200)


async def metrics(request: Request, api: HostApi) -> Response:
    """Prometheus metrics of this process (text exposition format)."""
    await _host(request).export_runs.refresh()  # what is read from the database (export runs), cached
    return Response(generate_latest(REGISTRY), media_type=CONTENT_TYPE_LATEST)


def _whole(query: Any, name: str, low: int, high: int) -> int:
    text = query.get(name, "")
    if not text.isascii() or not text.isdigit() or len(text) > 19 or not low <= int(text) <= high:
        raise HttpError(
            400, "M_INVALID_PARAM", f"{name} must be a whole number from {low} to {high}, not {text[:40]!r}"
        )
    return int(text)


async def kept_updates(request: Request, api: HostApi) -> Any:
    """A kept stream's facts this instance writes, for a reader catching up (factstream.replication.kept).

    ``from`` (exclusive), ``upto`` (inclusive, capped at this writer's position) and ``limit`` (at
    most 10,000). The answer: ``{"epoch", "updates": [[position, row], ...], "upto", "limited"}``.
    With ``replication.secret`` the request must be signed (``X-Factstream-Replication``).
    """
    host = _host(request)
    name = request.path_params["stream"]
    secret = ReplicationSecret.from_settings(host.settings)
    if secret is not None:  # first: an unsigned caller learns nothing, not even which streams exist
        target = request.scope["path"] + "?" + request.scope["query_string"].decode("latin-1")
        if secret.check_request(request.headers.get(SIGNATURE_HEADER, ""), target) is None:
            raise HttpError(
                403, "M_FORBIDDEN", "a kept stream's updates are for instances that know replication.secret"
            )
    stream = host.streams.get(name)
    if stream is None or stream.kept is None or not stream.id_gen.is_writer:
        raise HttpError(404, "M_NOT_FOUND", f"this instance writes no kept stream named {name[:80]!r}")
    query = request.query_params
    limit = _whole(query, "limit", 1, MAX_KEPT_LIMIT)
    low = _whole(query, "from", 0, 2**63 - 1)
    high = min(_whole(query, "upto", low, 2**63 - 1), stream.current_token(host.instance_name))
    updates, upto, limited = await stream.kept.local(low, max(low, high), limit)
    encode = stream.encode_row
    return {
        "epoch": stream.kept.epoch,
        "updates": [[position, encode(row)] for position, row in updates],
        "upto": upto,
        "limited": limited,
    }


async def openapi(request: Request, api: HostApi) -> Any:
    """This API's OpenAPI 3.1 schema: the core routes and every plugin's."""
    return request.app.state.openapi


_QUERY = "query"


def core_routes() -> list[ApiRoute]:
    """The core's routes, in the order the schema lists them."""

    def param(name: str, schema: dict[str, Any], description: str) -> dict[str, Any]:
        return {"name": name, "in": _QUERY, "required": False, "schema": schema, "description": description}

    sync_params = (
        param("since", {"type": "string"}, "next_batch of the previous response; absent: from the start"),
        param(
            "timeout",
            {"type": "integer", "minimum": 0, "default": 0},
            "milliseconds to wait for something new (capped by http.sync_timeout_max_seconds)",
        ),
        param("device", {"type": "string", "maxLength": MAX_DEVICE_LENGTH}, "the requesting device, for plugins"),
        param(
            "filter",
            {"type": "string", "maxLength": MAX_FILTER_LENGTH},
            "a filter object as JSON, handed to every synced stream (the events plugin reads its 'room' part)",
        ),
    )
    return [
        ApiRoute(
            RouteSpec("/sync", sync, name="sync", access="user"),
            CORE,
            parameters=sync_params,
            responses={"400": {"description": "malformed since or timeout"}},
        ),
        ApiRoute(RouteSpec("/streams", streams, name="streams", access="user"), CORE),
        ApiRoute(
            RouteSpec("/streams/{name}/positions", stream_positions, name="stream_positions", access="user"),
            CORE,
            responses={"404": {"description": "unknown stream"}},
        ),
        ApiRoute(
            RouteSpec("/health", health, name="health", access="public"),
            CORE,
            parameters=(
                param(
                    "strict",
                    {"type": "boolean", "default": True},
                    "false: answer 200 even when degraded (for liveness probes)",
                ),
            ),
            responses={"503": {"description": "degraded: the body's reasons say why"}},
        ),
        ApiRoute(RouteSpec("/metrics", metrics, name="metrics", access="public"), CORE),
        ApiRoute(
            RouteSpec(KEPT_UPDATES_PATH, kept_updates, name="kept_updates", access="public"),
            CORE,
            parameters=(
                param("from", {"type": "integer", "minimum": 0}, "the reader's position (exclusive)"),
                param("upto", {"type": "integer", "minimum": 0}, "the last position wanted (inclusive)"),
                param("limit", {"type": "integer", "minimum": 1, "maximum": MAX_KEPT_LIMIT}, "most updates"),
            ),
            responses={
                "403": {"description": "replication.secret is set and the request is not signed with it"},
                "404": {"description": "this instance writes no kept stream of that name"},
            },
        ),
        ApiRoute(RouteSpec("/openapi.json", openapi, name="openapi", access="public"), CORE),
        *dashboard_routes(),
    ]


def plugin_routes(plugins: PluginHost) -> list[ApiRoute]:
    """Every route the plugins registered (``register_routes``)."""
    return [ApiRoute(reg.spec, reg.plugin) for reg in plugins.registry.routes]
