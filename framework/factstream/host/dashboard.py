"""The operator's page: ``GET /dashboard``, its live state ``GET /dashboard/state``, and ``/`` redirecting there.

Every host serves it (see docs/dashboard.md). The page is plain HTML, CSS and JavaScript shipped in
the package (``host/dashboard/``: no build step, nothing fetched from another origin); its script
polls ``/dashboard/state`` every second and draws what this instance sees of the deployment: the
instances of ``instance_map`` (linked to their own dashboards), each stream's writers and positions,
the replication links and their state, the lag behind each writer, cache hit rates, the ``/sync``
long polls open now and the recent warnings and errors (:mod:`factstream.host.recent`).

It is read-only, and it shows the deployment's shape (names, addresses, positions, log lines), so it
is closed by default to everyone but the machine itself: :func:`check_access` lets in loopback
clients, and, when ``dashboard.token`` is set, any client that sends that token
(``Authorization: Bearer TOKEN`` or ``?token=TOKEN``, compared in constant time). With
``dashboard.enabled: false`` every dashboard route, ``/`` included, answers 404. The client address
is the TCP peer's, and a loopback peer that relays someone else (it sends ``Forwarded``,
``X-Forwarded-For`` or ``X-Real-IP``: a reverse proxy on the same machine) counts as remote: behind
a proxy, the dashboard needs its token. The page's script and style
sheet carry no data and are served to anyone while the dashboard is enabled, so that a page opened
with ``?token=`` can load them.
"""

from __future__ import annotations

import functools
import hmac
import ipaddress
import time
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response

from factstream.host.auth import AuthError, bearer_token
from factstream.host.http import CORE, ApiRoute
from factstream.plugin.specs import RouteSpec
from factstream.plugin.web import HttpError

if TYPE_CHECKING:
    from factstream.config import DashboardConfig
    from factstream.host.parts import HostParts
    from factstream.plugin.api import HostApi
    from factstream.replication.stream import ReplicatedStream

#: Where the page's files are, in the package.
STATIC_DIR = Path(__file__).resolve().parent / "dashboard"
#: The page's files by the path they are served at, with their media type.
STATIC_FILES = {
    "/dashboard": ("index.html", "text/html; charset=utf-8"),
    "/dashboard/dashboard.js": ("dashboard.js", "text/javascript; charset=utf-8"),
    "/dashboard/dashboard.css": ("dashboard.css", "text/css; charset=utf-8"),
}
#: Sent with every file of the page: nothing but this origin, no inline script, never in a frame.
SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-cache",
}


def _host(request: Request) -> HostParts:
    host: HostParts = request.app.state.host
    return host


# -- access ------------------------------------------------------------------------------------------------


def is_loopback(address: str | None) -> bool:
    """Whether ``address`` (a client's IP address as text) is a loopback address (IPv4-mapped too)."""
    if not address:
        return False
    try:
        ip = ipaddress.ip_address(address.split("%", 1)[0])
    except ValueError:
        return False
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped.is_loopback
    return ip.is_loopback


#: Headers a reverse proxy adds for the client it relays: a loopback peer that sends one is not the client.
FORWARDING_HEADERS = ("forwarded", "x-forwarded-for", "x-real-ip")


def is_local_client(request: Request) -> bool:
    """Whether the request comes from this machine itself: a loopback peer relaying nobody else."""
    if not is_loopback(request.client.host if request.client else None):
        return False
    return not any(name in request.headers for name in FORWARDING_HEADERS)


def _sent_token(request: Request) -> str | None:
    """The token the request sends: its bearer token, else its ``token`` query parameter."""
    header = request.headers.get("authorization")
    if header:
        try:
            return bearer_token(header)
        except AuthError:
            pass
    return request.query_params.get("token") or None


def check_enabled(config: DashboardConfig) -> None:
    """404 unless the dashboard is enabled."""
    if not config.enabled:
        raise HttpError(404, "M_NOT_FOUND", "the dashboard is disabled on this instance (dashboard.enabled: false)")


def check_access(request: Request, config: DashboardConfig) -> None:
    """Let the request see the dashboard, or raise :class:`HttpError` (see the module docstring).

    Disabled: 404. A loopback client relaying nobody (:func:`is_local_client`): in. Otherwise,
    without ``dashboard.token``: 403; with it: in if the request sends it, else 401
    (``M_MISSING_TOKEN`` when it sends none, ``M_UNKNOWN_TOKEN`` when it sends another).
    """
    check_enabled(config)
    if is_local_client(request):
        return
    if config.token is None:
        raise HttpError(
            403,
            "M_FORBIDDEN",
            "the dashboard answers loopback clients only; set dashboard.token to let others in with that token",
        )
    sent = _sent_token(request)
    challenge = {"WWW-Authenticate": "Bearer"}
    if sent is None:
        raise HttpError(
            401,
            "M_MISSING_TOKEN",
            "the dashboard needs its token: 'Authorization: Bearer <token>' or ?token=",
            headers=challenge,
        )
    if not hmac.compare_digest(sent.encode(), config.token.get_secret_value().encode()):
        raise HttpError(401, "M_UNKNOWN_TOKEN", "wrong dashboard token", headers=challenge)


# -- the state ---------------------------------------------------------------------------------------------


def _url(host: str, port: int | None) -> str | None:
    if port is None:
        return None
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


def instances_state(host: HostParts) -> list[dict[str, Any]]:
    """The deployment's instances (``instance_map``, or this one alone), with their HTTP and dashboard URLs.

    An instance's URL is its ``instance_map`` address and ``http_port``; this instance's port is the
    one it serves on (``http.port`` and ``--http-port`` override the map). ``null`` when it has none.
    """
    settings = host.settings
    main = settings.main_instance
    names = list(settings.instance_map) or [host.instance_name]
    out = []
    for name in names:
        endpoint = settings.instance_map.get(name)
        address = endpoint.host if endpoint is not None else "127.0.0.1"
        port = endpoint.http_port if endpoint is not None else None
        if name == host.instance_name:
            served = settings.http_endpoint()
            port = served[1] if served is not None else None
        url = _url(address, port)
        out.append(
            {
                "name": name,
                "main": name == main,
                "self": name == host.instance_name,
                "url": url,
                "dashboard_url": None if url is None else url + "/dashboard",
                "replication_port": endpoint.replication_port if endpoint is not None else None,
            }
        )
    return out


def stream_state(host: HostParts, stream: ReplicatedStream) -> dict[str, Any]:
    """One stream's writers and positions as this instance sees them (wire tokens, as ``/streams``).

    ``current``: the newest position of any writer (the highest of ``positions``); ``min``: the
    slowest writer's, the point every writer has reached (as ``factstream_stream_min_position``);
    ``persisted_upto``: the watermark below which no fact
    is missing.
    """
    gen = stream.id_gen
    positions = {writer: p * stream.factor for writer, p in sorted(gen.get_positions().items())}
    values = list(positions.values())
    return {
        "name": stream.name,
        "writers": host.settings.writers_for(stream.name) if stream.spec.writers == "configured" else "any",
        "is_writer": gen.is_writer,
        "positions": positions,
        "current": max(values, default=0),
        "min": gen.get_slowest_writer_token() * stream.factor,
        "persisted_upto": gen.get_persisted_upto_position() * stream.factor,
    }


def links_state(host: HostParts, now: float) -> list[dict[str, Any]]:
    """The replication links of this process (none for a single instance), with ``down_for`` seconds."""
    transport = host.transport
    if transport is None:
        return []
    return [link.as_json() | {"down_for": round(link.down_for(now), 3)} for link in transport.links()]


def caches_state(host: HostParts) -> list[dict[str, Any]]:
    """Each cache's size and counters since start, and its hit rate (``null`` before any lookup)."""
    out = []
    for cache in sorted(host.caches, key=lambda c: c.name):
        lookups = cache.hits + cache.misses
        out.append(
            {
                "name": cache.name,
                "size": len(cache),
                "max_size": cache.max_size,
                "hits": cache.hits,
                "misses": cache.misses,
                "evictions": cache.evictions,
                "invalidations": cache.invalidations,
                "hit_rate": round(cache.hits / lookups, 4) if lookups else None,
            }
        )
    return out


def dashboard_state(host: HostParts, now: float | None = None) -> dict[str, Any]:
    """Everything the page shows, as JSON (documented in docs/http-api.md, ``GET /dashboard/state``)."""
    now = time.time() if now is None else now
    return {
        "time": now,
        "instance": host.instance_name,
        "deployment": host.settings.deployment,
        "instances": instances_state(host),
        "streams": [stream_state(host, s) for s in host.streams.values()],
        "links": links_state(host, now),
        "lags": [lag.as_json() for lag in host.handler.lags()],
        "caches": caches_state(host),
        "long_polls": {"open": host.sync.notifier.open_waits},
        "problems": [p.as_json() for p in reversed(host.recent.problems())],
    }


# -- routes ------------------------------------------------------------------------------------------------


@functools.cache
def _static(name: str) -> bytes:
    return (STATIC_DIR / name).read_bytes()


async def root(request: Request, api: HostApi) -> Response:
    """Redirects (307) to ``/dashboard``, keeping the query (a ``?token=``)."""
    check_enabled(_host(request).settings.dashboard)
    query = request.url.query
    return RedirectResponse("/dashboard" + (f"?{query}" if query else ""), status_code=307)


async def page(request: Request, api: HostApi) -> Response:
    """The dashboard: this instance's live view of the deployment (HTML; loopback or ``dashboard.token``)."""
    check_access(request, _host(request).settings.dashboard)
    return _file_response(request.url.path)


async def asset(request: Request, api: HostApi) -> Response:
    """The dashboard's script or style sheet (no data in them: served to anyone while it is enabled)."""
    check_enabled(_host(request).settings.dashboard)
    return _file_response(request.url.path)


def _file_response(path: str) -> Response:
    name, media_type = STATIC_FILES[path]
    return Response(_static(name), media_type=media_type, headers=SECURITY_HEADERS)


async def state(request: Request, api: HostApi) -> Any:
    """What the dashboard shows, as JSON: instances, streams and positions, links, lag, caches, long polls,
    recent problems (loopback or ``dashboard.token``)."""
    host = _host(request)
    check_access(request, host.settings.dashboard)
    return dashboard_state(host)


def _refusals(*statuses: str) -> dict[str, Any]:
    text = {
        "401": "a client off the loopback interface sent no token, or the wrong one (dashboard.token set)",
        "403": "a client off the loopback interface, and no dashboard.token is set",
        "404": "the dashboard is disabled (dashboard.enabled: false)",
    }
    return {status: {"description": text[status]} for status in statuses}


def dashboard_routes() -> list[ApiRoute]:
    """``/``, ``/dashboard``, its files and ``/dashboard/state``. They are ``public`` for the API's bearer
    tokens: the dashboard checks its own access (:func:`check_access`)."""
    guarded = _refusals("401", "403", "404")
    routes = [
        ApiRoute(
            RouteSpec("/", root, name="root", access="public"),
            CORE,
            responses={"307": {"description": "to /dashboard"}} | _refusals("404"),
        ),
        ApiRoute(RouteSpec("/dashboard", page, name="dashboard", access="public"), CORE, responses=guarded),
        ApiRoute(
            RouteSpec("/dashboard/state", state, name="dashboard_state", access="public"), CORE, responses=guarded
        ),
    ]
    routes += _asset_routes(p for p in STATIC_FILES if p != "/dashboard")
    return routes


def _asset_routes(paths: Iterable[str]) -> list[ApiRoute]:
    return [
        ApiRoute(
            RouteSpec(path, asset, name="dashboard_" + path.rpartition(".")[2], access="public"),
            CORE,
            responses=_refusals("404"),
        )
        for path in paths
    ]
