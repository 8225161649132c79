"""The host's HTTP API: a Starlette application of the core routes and the plugins' routes.

Every route is a :class:`~factstream.plugin.specs.RouteSpec`; the core's own (``/sync``, ``/streams``,
``/health`` ...) live in :mod:`factstream.host.routes` and are built exactly like a plugin's. Each
endpoint is wrapped so that:

* the bearer token is checked against the route's ``access`` level before the endpoint runs
  (``public``: none needed; ``user``: any valid token, else 401; ``writer``: a token that may write,
  else 403), and ``request.state.user`` (the user ID, ``None`` on public routes),
  ``request.state.principal`` and ``request.state.host`` are set;
* a returned value that is not a ``Response`` is sent as JSON (status 200);
* every error, core or plugin, is JSON ``{"errcode": "M_...", "error": message}`` (the OpenAPI
  ``Error`` schema): a :class:`~factstream.HttpError` raised by the endpoint is answered with its own
  status and errcode; bad input is a 4xx with a message that says what was wrong (``TokenError`` 400
  ``M_INVALID_PARAM``, a body that is not JSON 400 ``M_NOT_JSON``, one of the wrong shape 400
  ``M_BAD_JSON``, ``HTTPException`` its own status with the code of :data:`ERRCODES`), and an
  unexpected exception is logged with the route and answered with 500 ``M_UNKNOWN`` ``internal error``;
* input PostgreSQL cannot store is refused before the token is looked up and before the endpoint
  runs (:mod:`factstream.host.storable`): header names and values, path parameters, query parameter
  names and values, and a JSON body's keys and values at any depth. The refusal is a 400 naming the
  field (``M_INVALID_PARAM``, ``M_BAD_JSON`` for the body).

The body is read here, after the access check (an anonymous caller cannot make the host buffer a
body on a route that needs a token), at most :data:`~factstream.host.storable.MAX_BODY_BYTES` (413
beyond), checked, and handed to the endpoint through a new ``Request`` on the same scope (so the
same ``state``) whose ``receive`` replays it: ``request.body()``, ``request.stream()`` and
``request.json()`` work as before, and a plugin's own, lower size limit still applies. The endpoint
parses its body itself, once; this layer only scans the bytes (it parses only a body that looks
suspect).

Each request is counted by route template, method and status (:mod:`factstream.host.request_metrics`)
unless ``metrics.enabled`` is false.

``GET /openapi.json`` describes every route, core and plugin, built from the specs (summary from the
route name or the endpoint's docstring, path parameters from the path, bearer security unless public).
"""

from __future__ import annotations

import inspect
import json
import logging
import re
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from importlib import metadata
from typing import TYPE_CHECKING, Any

import msgspec
from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response
from starlette.routing import Match, Route, Router
from starlette.types import Message, Receive, Scope, Send

from factstream.errors import PluginError
from factstream.host.auth import TokenAuthenticator, check_access
from factstream.host.request_metrics import ROUTE_ATTRIBUTE, RequestMetrics
from factstream.host.storable import (
    check_body,
    check_headers,
    check_path_params,
    check_query_params,
    read_body,
)
from factstream.plugin.specs import RouteSpec
from factstream.plugin.web import HttpError
from factstream.sync import TokenError

if TYPE_CHECKING:
    from factstream.host.parts import HostParts

log = logging.getLogger(__name__)

_encoder = msgspec.json.Encoder()
_PATH_PARAM = re.compile(r"{([a-zA-Z_][a-zA-Z0-9_]*)(?::[a-z]+)?}")
_STATUS_TEXT = {400: "bad request", 401: "unauthorized", 403: "forbidden", 404: "not found", 405: "method not allowed"}

#: The errcode of an error that names none (an ``HTTPException``, Starlette's own 404 and 405), by status.
ERRCODES = {
    400: "M_INVALID_PARAM",
    401: "M_MISSING_TOKEN",
    403: "M_FORBIDDEN",
    404: "M_NOT_FOUND",
    405: "M_UNRECOGNIZED",
    413: "M_TOO_LARGE",
    421: "M_MISDIRECTED",
    500: "M_UNKNOWN",
}

#: The plugin name the core's own routes are registered under.
CORE = "factstream"


class JsonResponse(Response):
    """A JSON response encoded with msgspec (handles Structs, datetimes, UUIDs ...)."""

    media_type = "application/json"

    def render(self, content: Any) -> bytes:
        return _encoder.encode(content)


def error_response(
    status: int, message: str, headers: Mapping[str, str] | None = None, *, errcode: str = ""
) -> JsonResponse:
    """The API's one error shape: ``{"errcode": errcode, "error": message}``.

    ``errcode`` defaults to the status's code in :data:`ERRCODES` (``M_UNKNOWN`` for others).
    """
    code = errcode or ERRCODES.get(status, "M_UNKNOWN")
    return JsonResponse({"errcode": code, "error": message}, status_code=status, headers=headers or None)


def http_error_response(exc: HttpError) -> JsonResponse:
    """The answer to an :class:`~factstream.HttpError` (its status, errcode, message and headers)."""
    return error_response(exc.status, exc.message, exc.headers, errcode=exc.errcode)


@dataclass(frozen=True)
class ApiRoute:
    """A route as served: its spec, who registered it, and what the OpenAPI schema says about it."""

    spec: RouteSpec
    plugin: str
    summary: str = ""
    description: str = ""
    #: OpenAPI parameter objects besides the path's own (query parameters).
    parameters: tuple[dict[str, Any], ...] = ()
    #: Extra OpenAPI responses by status code.
    responses: dict[str, Any] = field(default_factory=dict)


def _replaying(request: Request, body: bytes) -> Request:
    """A request like ``request`` (same scope, so the same ``state``) whose body is ``body`` again."""
    receive = request.receive
    sent = False

    async def replay() -> Message:
        nonlocal sent
        if sent:
            return await receive()  # a disconnect, for endpoints that watch for one
        sent = True
        return {"type": "http.request", "body": body, "more_body": False}

    replay_receive: Receive = replay
    return Request(request.scope, replay_receive)


def wrap_endpoint(
    route: ApiRoute, host: HostParts, auth: TokenAuthenticator
) -> Callable[[Request], Awaitable[Response]]:
    """The Starlette endpoint for ``route``: access check, state, JSON results, JSON errors."""
    spec = route.spec
    endpoint = spec.endpoint
    where = f"{','.join(spec.methods)} {spec.path} (plugin {route.plugin!r})"

    api = host.api

    async def serve(request: Request) -> Response:
        request.state.host = api
        request.state.user = None
        request.state.principal = None
        try:
            check_headers(request.scope["headers"])
            check_path_params(request.path_params)
            check_query_params(request.query_params.multi_items())
            if spec.access != "public":
                principal = await auth.authenticate(request.headers.get("authorization"))
                check_access(spec.access, principal)
                request.state.principal = principal
                request.state.user = principal.user
            body = await read_body(request)
            check_body(body)
            request = _replaying(request, body)
            result = await endpoint(request, api)
        except HttpError as exc:  # the endpoint's own refusals, and the host's (input, access)
            return http_error_response(exc)
        except ClientDisconnect:
            return error_response(400, "the client went away while sending the request body")
        except HTTPException as exc:
            return error_response(exc.status_code, str(exc.detail or _STATUS_TEXT.get(exc.status_code, "error")))
        except TokenError as exc:
            return error_response(400, f"invalid sync token: {exc}", errcode="M_INVALID_PARAM")
        except msgspec.ValidationError as exc:  # before DecodeError, its base class
            return error_response(400, f"invalid request: {exc}", errcode="M_BAD_JSON")
        except (json.JSONDecodeError, msgspec.DecodeError, UnicodeDecodeError) as exc:
            return error_response(400, f"the request body is not valid JSON: {exc}", errcode="M_NOT_JSON")
        except Exception:
            log.exception("%s failed", where)
            return error_response(500, "internal error")
        if isinstance(result, Response):
            return result
        try:
            return JsonResponse(result)
        except (TypeError, msgspec.EncodeError):
            log.exception("%s returned something that is not JSON-able: %r", where, type(result))
            return error_response(500, "internal error")

    serve.__name__ = spec.name or getattr(endpoint, "__name__", "endpoint")
    serve.__doc__ = endpoint.__doc__
    setattr(serve, ROUTE_ATTRIBUTE, spec.path)  # the request metrics' route label
    return serve


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    status = exc.status_code
    return error_response(status, str(exc.detail or _STATUS_TEXT.get(status, "error")), exc.headers)


async def _server_error(request: Request, exc: Exception) -> Response:
    log.error("unhandled error on %s %s", request.method, request.url.path, exc_info=exc)
    return error_response(500, "internal error")


def check_routes(routes: Sequence[ApiRoute]) -> None:
    """No two routes share a method and path (a plugin shadowing a core route names both)."""
    seen: dict[tuple[str, str], str] = {}
    for route in routes:
        for method in route.spec.methods:
            owner = seen.setdefault((method, route.spec.path), route.plugin)
            if owner != route.plugin:
                a, b = sorted((owner, route.plugin))
                raise PluginError(f"duplicate route '{method} {route.spec.path}': registered by both {a!r} and {b!r}")


class _FixedPathsFirst(Router):
    """Starlette's router, with the routes of a fixed path (``/health``, ``/sync``, ``/events``) found by
    a dict lookup before the scan of every route's pattern (~25 regular expressions tried a request,
    tens of microseconds when the route is late in the list). A miss, or a path whose method no route
    there takes, goes through the scan as before, so 404, 405 and slash redirects are unchanged."""

    def __init__(self, routes: Sequence[Route]) -> None:
        super().__init__(routes=list(routes))
        self._fixed: dict[str, list[Route]] = {}
        for route in routes:
            if "{" not in route.path:
                self._fixed.setdefault(route.path, []).append(route)

    async def app(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            for route in self._fixed.get(scope["path"], ()):
                match, child_scope = route.matches(scope)
                if match is Match.FULL:
                    scope.setdefault("router", self)
                    scope.update(child_scope)
                    await route.handle(scope, receive, send)
                    return
        await super().app(scope, receive, send)


def build_app(host: HostParts, routes: Sequence[ApiRoute], auth: TokenAuthenticator) -> Starlette:
    """The ASGI application serving ``routes`` for ``host``."""
    check_routes(routes)
    starlette_routes = [
        Route(r.spec.path, wrap_endpoint(r, host, auth), methods=list(r.spec.methods), name=r.spec.name or None)
        for r in routes
    ]
    app = Starlette(exception_handlers={HTTPException: _http_error, 500: _server_error})
    if host.settings.metrics.enabled:
        app.add_middleware(RequestMetrics, instance=host.instance_name)
    app.router = _FixedPathsFirst(starlette_routes)
    app.state.host = host
    app.state.openapi = openapi_schema(host, routes)
    return app


# -- OpenAPI -------------------------------------------------------------------------------------------------


def _doc(endpoint: Callable[..., Any]) -> tuple[str, str]:
    doc = inspect.getdoc(endpoint) or ""
    first, _, rest = doc.partition("\n\n")
    return " ".join(first.split()), rest.strip()


def openapi_schema(host: HostParts, routes: Sequence[ApiRoute]) -> dict[str, Any]:
    """An OpenAPI 3.1 description of ``routes``."""
    paths: dict[str, dict[str, Any]] = {}
    for route in routes:
        spec = route.spec
        summary, description = _doc(spec.endpoint)
        path = _PATH_PARAM.sub(r"{\1}", spec.path)
        parameters = [
            {"name": name, "in": "path", "required": True, "schema": {"type": "string"}}
            for name in _PATH_PARAM.findall(spec.path)
        ]
        parameters += list(route.parameters)
        responses: dict[str, Any] = {"200": {"description": "OK"}}
        if spec.access != "public":
            responses["401"] = {"description": "missing or unknown bearer token", "content": _ERROR_CONTENT}
        if spec.access == "writer":
            responses["403"] = {"description": "the token may not write", "content": _ERROR_CONTENT}
        responses.update(route.responses)
        for status, response in responses.items():
            if status.startswith(("4", "5")) and "content" not in response:
                responses[status] = {**response, "content": _ERROR_CONTENT}
        for method in spec.methods:
            operation: dict[str, Any] = {
                "summary": route.summary or summary or spec.name or f"{method} {path}",
                "operationId": f"{method.lower()}_{spec.name or _operation_name(path)}",
                "tags": [route.plugin],
                "parameters": parameters,
                "responses": responses,
                "security": [] if spec.access == "public" else [{"bearer": []}],
                "x-factstream-access": spec.access,
            }
            if route.description or description:
                operation["description"] = route.description or description
            paths.setdefault(path, {})[method.lower()] = operation
    return {
        "openapi": "3.1.0",
        "info": {
            "title": f"factstream {host.settings.deployment}",
            "version": _version(),
            "description": f"The HTTP API of factstream instance {host.instance_name}.",
        },
        "paths": paths,
        "components": {
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
            "schemas": {
                "Error": {
                    "type": "object",
                    "properties": {
                        "errcode": {"type": "string", "description": "a Matrix-style code, such as M_NOT_FOUND"},
                        "error": {"type": "string", "description": "what was wrong, for a person"},
                    },
                    "required": ["errcode", "error"],
                }
            },
        },
    }


def _version() -> str:
    try:
        return metadata.version("factstream")
    except metadata.PackageNotFoundError:
        return "0"


_ERROR_CONTENT = {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}


def _operation_name(path: str) -> str:
    return re.sub(r"[^a-z0-9]+", "_", path.lower()).strip("_") or "root"
