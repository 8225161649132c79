"""HTTP request metrics: a count and a duration histogram per route template, method and status.

``factstream_http_requests_total{route,method,status,instance}`` and
``factstream_http_request_duration_seconds{route,method,instance}``. ``route`` is the template the
request matched (``/streams/{name}/positions``), never the raw path: the labels' cardinality is
bounded by the routes registered, whatever clients send. A request that matched no route (a 404 of
the router, a slash redirect) is ``route="<unmatched>"``, and a method outside the standard ones is
``method="OTHER"``.

The middleware learns the template from the endpoint the router put in the ASGI scope (each endpoint
of :func:`factstream.host.http.wrap_endpoint` carries its route's path), after the request, so it
adds no routing of its own. It sits inside Starlette's outermost error middleware: an exception that
escapes the endpoint is counted as a 500 and passed on. With ``metrics.enabled: false`` the host
does not install it.
"""

from __future__ import annotations

import time
from typing import Any

from prometheus_client import Counter, Histogram
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from factstream import metrics

#: The ``route`` label of a request that matched no route.
UNMATCHED = "<unmatched>"
#: The attribute of an endpoint holding its route's template.
ROUTE_ATTRIBUTE = "factstream_route"
#: Methods counted by name; any other is ``OTHER``.
METHODS = frozenset({"GET", "HEAD", "POST", "PUT", "DELETE", "PATCH", "OPTIONS"})
#: From a millisecond (a cached read) to a minute (a long poll at its cap and beyond).
BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)

REQUESTS = Counter(
    "factstream_http_requests",
    "HTTP requests answered, by route template, method and status",
    ["route", "method", "status", "instance"],
    registry=None,
)
DURATION = Histogram(
    "factstream_http_request_duration_seconds",
    "Time from a request's arrival to the end of its response, by route template and method",
    ["route", "method", "instance"],
    buckets=BUCKETS,
    registry=None,
)


def register() -> None:
    """Register the request metrics in the default registry (once per process)."""
    metrics.register(REQUESTS, DURATION)


def route_of(scope: Scope) -> str:
    """The template of the route that served ``scope`` (:data:`UNMATCHED` when none did)."""
    return str(getattr(scope.get("endpoint"), ROUTE_ATTRIBUTE, UNMATCHED))


class RequestMetrics:
    """ASGI middleware counting each HTTP request of ``app`` for instance ``instance``.

    The labelled children are kept per (route, method, status), so a request costs two clock reads,
    one dict lookup, an increment and an observation.
    """

    def __init__(self, app: ASGIApp, instance: str) -> None:
        self.app = app
        self.instance = instance
        self._children: dict[tuple[str, str, int], tuple[Any, Any]] = {}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = time.perf_counter()
        status = 500

        async def sending(message: Message) -> None:
            nonlocal status
            if message["type"] == "http.response.start":
                status = int(message["status"])
            await send(message)

        try:
            await self.app(scope, receive, sending)
        finally:
            self._count(scope, status, time.perf_counter() - started)

    def _count(self, scope: Scope, status: int, seconds: float) -> None:
        method = scope["method"] if scope["method"] in METHODS else "OTHER"
        key = (route_of(scope), method, status)
        children = self._children.get(key)
        if children is None:
            route = key[0]
            children = self._children[key] = (
                REQUESTS.labels(route=route, method=method, status=str(status), instance=self.instance),
                DURATION.labels(route=route, method=method, instance=self.instance),
            )
        children[0].inc()
        children[1].observe(seconds)
