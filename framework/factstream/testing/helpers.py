"""Small helpers of the test fixtures, public through :mod:`factstream.testing`.

``free_port()`` picks a TCP port nobody listens on; ``until`` (async) and ``wait_until`` (blocking, for
tests that drive subprocesses) poll a condition and fail the test with an ``AssertionError`` naming it
when it does not come true in time.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from factstream.sockets import free_port as free_port

#: What to do when a test tool that factstream.testing uses is missing.
INSTALL_TESTING = (
    "Install factstream's testing extra (pytest, pytest-asyncio, httpx) in this environment: "
    'uv pip install "factstream[testing]" (or pip install "factstream[testing]")'
)


def _timed_out(what: str, timeout: float, detail: Callable[[], str] | None) -> AssertionError:
    extra = detail() if detail is not None else ""
    return AssertionError(f"timed out after {timeout:g}s waiting for {what}{extra}")


async def until(
    predicate: Callable[[], Any],
    timeout: float = 10.0,
    what: str = "condition",
    *,
    interval: float = 0.01,
    detail: Callable[[], str] | None = None,
) -> Any:
    """Poll ``predicate`` (a function, or a coroutine function) until it returns something truthy.

    Returns that value. After ``timeout`` seconds raises ``AssertionError("timed out after 10s waiting
    for <what>")``, followed by ``detail()`` when given (logs, the state seen). An exception raised by
    the predicate propagates at once.
    """
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while True:
        value = predicate()
        if inspect.isawaitable(value):
            value = await value
        if value:
            return value
        if loop.time() > deadline:
            raise _timed_out(what, timeout, detail)
        await asyncio.sleep(interval)


def wait_until(
    predicate: Callable[[], Any],
    timeout: float = 10.0,
    what: str = "condition",
    *,
    interval: float = 0.05,
    detail: Callable[[], str] | None = None,
) -> Any:
    """The blocking :func:`until`, for tests that drive processes rather than an event loop."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise _timed_out(what, timeout, detail)
        time.sleep(interval)


def read_json_lines(path: Path) -> list[dict[str, Any]]:
    """The JSON objects of a file of one object a line (none if it does not exist; a half-written last
    line is skipped)."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        return []
    out = []
    for line in text.splitlines():
        with contextlib.suppress(ValueError):  # a line being written
            out.append(json.loads(line))
    return out


def merge_config(base: Mapping[str, Any], *overrides: Mapping[str, Any]) -> dict[str, Any]:
    """``base`` with ``overrides`` applied in turn: mappings are merged key by key, anything else
    (lists, scalars) replaces the value. Neither argument is changed."""
    merged: dict[str, Any] = {k: merge_config(v) if isinstance(v, Mapping) else v for k, v in base.items()}
    for override in overrides:
        for key, value in override.items():
            current = merged.get(key)
            if isinstance(current, Mapping) and isinstance(value, Mapping):
                merged[key] = merge_config(current, value)
            else:
                merged[key] = merge_config(value) if isinstance(value, Mapping) else value
    return merged


def require_httpx(user: str) -> None:
    """Check that ``httpx`` can be imported, for ``user`` (a method that makes clients): a
    ``ModuleNotFoundError`` that says how to install it if not (it comes with the testing extra, not
    with factstream)."""
    try:
        import httpx  # noqa: F401
    except ModuleNotFoundError as missing:
        message = f"{user} needs httpx, which is not installed. {INSTALL_TESTING}"
        raise ModuleNotFoundError(message, name="httpx") from missing


def bearer(token: str | None) -> dict[str, str]:
    """The headers of a client that sends ``token`` (none without one)."""
    return {"Authorization": f"Bearer {token}"} if token is not None else {}
