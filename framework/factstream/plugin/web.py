"""The HTTP toolkit of route endpoints: errors in the API's one shape, bounded bodies, JSON objects.

A route endpoint (:class:`~factstream.RouteSpec`) is ``async (request, host) -> Response | JSON-able``.
What nearly every route needs is here, answering in the API's one error shape
``{"errcode": "M_...", "error": "a message saying what was wrong"}``:

* :class:`HttpError`: raise it anywhere below the endpoint; the host's route wrapper answers it with
  its status, errcode and message (nothing needs catching in the route);
* :func:`read_body`: the body up to a limit; 413 ``M_TOO_LARGE`` as soon as ``Content-Length`` or the
  bytes read go over it (the body is never read whole first);
* :func:`json_object_text`: the body as text if it is one JSON object, kept byte for byte (key order,
  duplicate keys, the digits of numbers); 400 ``M_NOT_JSON`` or ``M_BAD_JSON`` otherwise;
* :func:`calling_user`: the authenticated user of the request; 401 ``M_MISSING_TOKEN`` without one;
* :func:`caller_can_write`: whether the request's token may call ``writer`` routes (a server's token),
  for a ``user`` route that shows such a caller more;
* :func:`require_writer`: 421 ``M_MISDIRECTED`` naming the writers, on an instance that does not
  write the stream;
* :func:`raw_json_response`: stored JSON text sent back unchanged.

Example::

    async def put_note(request: Request, host: HostApi) -> Response:
        user = calling_user(request)
        require_writer(host, "notes")
        text = json_object_text(await read_body(request, host.plugin_settings(NotesSettings).max_body_bytes))
        ...
        return raw_json_response(text)
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, NoReturn

from starlette.responses import JSONResponse, Response

if TYPE_CHECKING:
    from starlette.requests import Request

    from factstream.plugin.api import HostApi, StreamWriter


class HttpError(Exception):
    """A refusal answered as ``{"errcode": errcode, "error": message}`` with HTTP ``status``.

    ``errcode`` is a Matrix-style code (``M_INVALID_PARAM``, ``M_NOT_FOUND`` ...); ``message`` says
    what was wrong, for a person. ``headers`` are sent with the answer (``WWW-Authenticate`` ...).
    Raised from a route endpoint (or anything it calls), the host's route wrapper answers it.
    """

    def __init__(self, status: int, errcode: str, message: str, *, headers: Mapping[str, str] | None = None) -> None:
        if not isinstance(status, int) or not 400 <= status <= 599:
            raise ValueError(f"an HTTP error status is 400 to 599, not {status!r}")
        if not isinstance(errcode, str) or not errcode:
            raise ValueError(f"an HTTP error needs an errcode, not {errcode!r}")
        super().__init__(message)
        self.status = status
        self.errcode = errcode
        self.message = message
        self.headers = dict(headers or {})

    def body(self) -> dict[str, str]:
        """``{"errcode", "error"}``."""
        return {"errcode": self.errcode, "error": self.message}

    def response(self) -> Response:
        """The answer as a Starlette response (for code that builds responses itself)."""
        return JSONResponse(self.body(), status_code=self.status, headers=self.headers or None)

    def __repr__(self) -> str:
        return f"HttpError({self.status}, {self.errcode!r}, {self.message!r})"


async def read_body(request: Request, limit: int) -> bytes:
    """The request body; :class:`HttpError` 413 ``M_TOO_LARGE`` as soon as it is known to exceed ``limit``.

    A ``Content-Length`` over the limit is refused before anything is read; otherwise the body is read
    chunk by chunk and refused at the first chunk that takes it over.
    """
    return await read_limited(request, limit, "the limit")


async def read_limited(request: Request, limit: int, limit_name: str) -> bytes:
    """:func:`read_body`, naming the limit ``limit_name`` in the message (the host's is its own)."""
    if not isinstance(limit, int) or limit < 0:
        raise ValueError(f"a body limit is a number of bytes, not {limit!r}")
    declared = request.headers.get("content-length", "")
    if declared.isascii() and declared.isdigit() and int(declared) > limit:
        raise HttpError(413, "M_TOO_LARGE", f"the request body is {declared} bytes; {limit_name} is {limit} bytes")
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise HttpError(
                413, "M_TOO_LARGE", f"the request body is larger than allowed; {limit_name} is {limit} bytes"
            )
        chunks.append(chunk)
    return b"".join(chunks)


def _no_constants(name: str) -> NoReturn:
    raise ValueError(f"{name} is not valid JSON")


def json_object_text(body: bytes, what: str = "the request body") -> str:
    """``body`` as text if it is one JSON object (any content, kept byte for byte).

    :class:`HttpError` 400 ``M_NOT_JSON`` for bytes that are not UTF-8 JSON (``NaN`` and ``Infinity``
    are not JSON), 400 ``M_BAD_JSON`` for JSON that is not an object. ``what`` names the value in the
    message (``"messages['@bob:hs']"``).
    """
    try:
        text = body.decode("utf-8")
        value = json.loads(text, parse_constant=_no_constants)
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise HttpError(400, "M_NOT_JSON", f"{what} is not valid JSON: {exc}") from None
    if not isinstance(value, dict):
        raise HttpError(400, "M_BAD_JSON", f"{what} must be a JSON object, not {_json_kind(value)}")
    return text


def _json_kind(value: object) -> str:
    """What a parsed JSON value is, for a message: ``"an array"``, ``"a string"`` ..."""
    if isinstance(value, dict):
        return "an object"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, bool):
        return "a boolean"
    if value is None:
        return "null"
    return "a number"


def calling_user(request: Request) -> str:
    """The user ID the request's bearer token stands for; :class:`HttpError` 401 ``M_MISSING_TOKEN``
    when there is none (a ``public`` route)."""
    user = getattr(request.state, "user", None)
    if not isinstance(user, str) or not user:
        raise HttpError(401, "M_MISSING_TOKEN", "this route needs an authenticated user", headers=_BEARER)
    return user


_BEARER = {"WWW-Authenticate": "Bearer"}


def caller_can_write(request: Request) -> bool:
    """Whether the request's token may call ``writer`` routes (``http.tokens.<token>.write``)."""
    return bool(getattr(getattr(request.state, "principal", None), "can_write", False))


def require_writer(host: HostApi, stream: str | StreamWriter[Any]) -> None:
    """:class:`HttpError` 421 ``M_MISDIRECTED`` unless this instance writes ``stream``.

    ``stream`` is the stream's name or its writer (``host.stream(name, Row)``). The message names the
    instances the client should send the write to.
    """
    if isinstance(stream, str):
        name = stream
        if host.writes(name):
            return
        writers: tuple[str, ...] = tuple(host.settings.writers_for(name))
    else:
        name = stream.name
        if stream.is_writer:
            return
        writers = stream.writers
    raise HttpError(
        421,
        "M_MISDIRECTED",
        f"instance {host.instance_name} does not write the {name} stream; "
        f"send writes to: {', '.join(writers) or '(none)'}",
    )


def raw_json_response(text: str, status: int = 200) -> Response:
    """A response whose body is ``text`` (stored JSON), unchanged, as ``application/json``."""
    return Response(text.encode("utf-8"), status_code=status, media_type="application/json")
