"""HTTP helpers shared by the plugin's routes: errors, bounded bodies, JSON-object validation."""

from __future__ import annotations

import json
import os
from typing import Any, NoReturn

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from factstream import ConfigError

#: Default limit of a request body (64 KiB); ``FACTSTREAM_TO_DEVICE_MAX_BODY_BYTES`` overrides it.
DEFAULT_MAX_BODY_BYTES = 64 * 1024
MAX_BODY_ENV = "FACTSTREAM_TO_DEVICE_MAX_BODY_BYTES"


class HttpError(Exception):
    """An error answered as ``{"errcode", "error"}`` with ``status``; nothing has been written."""

    def __init__(self, status: int, errcode: str, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.errcode = errcode
        self.message = message

    def response(self) -> Response:
        return JSONResponse({"errcode": self.errcode, "error": self.message}, status_code=self.status)


def fail(status: int, errcode: str, message: str) -> NoReturn:
    raise HttpError(status, errcode, message)


def max_body_bytes(environ: Any = None) -> int:
    """The configured body limit; raises ``ConfigError`` for a value that is not a positive integer."""
    raw = (os.environ if environ is None else environ).get(MAX_BODY_ENV, "")
    if not raw:
        return DEFAULT_MAX_BODY_BYTES
    try:
        value = int(raw)
    except ValueError:
        value = 0
    if value < 1:
        raise ConfigError(f"{MAX_BODY_ENV} must be a positive number of bytes, not {raw!r}")
    return value


async def read_body(request: Request, limit: int) -> bytes:
    """The request body, or a 413 as soon as it is known to exceed ``limit`` bytes (never read whole)."""
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        fail(413, "M_TOO_LARGE", f"the request body is {declared} bytes; the limit is {limit} bytes")
    chunks: list[bytes] = []
    size = 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            fail(413, "M_TOO_LARGE", f"the request body is larger than the limit; the limit is {limit} bytes")
        chunks.append(chunk)
    return b"".join(chunks)


def _no_constants(name: str) -> NoReturn:
    raise ValueError(f"{name} is not valid JSON")


def json_object_text(body: bytes, what: str = "the request body") -> str:
    """``body`` as text if it is one JSON object (any content, kept byte for byte), else a 400."""
    try:
        text = body.decode("utf-8")
        value = json.loads(text, parse_constant=_no_constants)
    except (UnicodeDecodeError, ValueError, RecursionError) as exc:
        fail(400, "M_NOT_JSON", f"{what} is not valid JSON: {exc}")
    if not isinstance(value, dict):
        fail(400, "M_BAD_JSON", f"{what} must be a JSON object, not {_json_kind(value)}")
    return text


def _json_kind(value: Any) -> str:
    if isinstance(value, list):
        return "an array"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, bool):
        return "a boolean"
    if value is None:
        return "null"
    return "a number"


def raw_json_response(text: str, status: int = 200) -> Response:
    """A response whose body is stored JSON text, unchanged."""
    return Response(text.encode("utf-8"), status_code=status, media_type="application/json")
