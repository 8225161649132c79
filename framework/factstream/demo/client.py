"""A small JSON client of the instances' public HTTP API, on the standard library (``urllib``).

The demo runs on an installed factstream, whose runtime dependencies do not include an HTTP client
(httpx is a test dependency), and it makes a few dozen requests: urllib is enough.
"""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any
from urllib.parse import quote, urlencode

from factstream.demo.cluster import DemoError


def path(*parts: str) -> str:
    """A URL path of ``parts``, each escaped (room and event IDs keep their ``!``, ``$`` and ``:``)."""
    return "/" + "/".join(quote(p, safe="!$:@") for p in parts)


class Client:
    """Requests to one instance as one token's user; every answer is JSON."""

    def __init__(self, base: str, token: str | None = None, *, who: str = "") -> None:
        self.base = base
        self.token = token
        self.who = who

    def request(
        self,
        method: str,
        where: str,
        body: Any = None,
        *,
        query: dict[str, Any] | None = None,
        timeout: float = 15.0,
        raw: bool = False,
    ) -> Any:
        url = self.base + where + ("?" + urlencode(query) if query else "")
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(url, data=data, method=method)
        if self.token:
            req.add_header("Authorization", f"Bearer {self.token}")
        if data is not None:
            req.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(req, timeout=timeout) as resp:
                text = resp.read().decode()
        except urllib.error.HTTPError as exc:
            detail = exc.read().decode(errors="replace")[:300]
            raise DemoError(f"{method} {url} as {self.who or 'anonymous'} answered {exc.code}: {detail}") from None
        except (urllib.error.URLError, OSError) as exc:
            raise DemoError(f"{method} {url} failed: {exc}") from None
        return text if raw else json.loads(text)

    def get(self, where: str, **kwargs: Any) -> Any:
        return self.request("GET", where, **kwargs)

    def put(self, where: str, body: Any = None, **kwargs: Any) -> Any:
        return self.request("PUT", where, {} if body is None else body, **kwargs)

    def post(self, where: str, body: Any = None, **kwargs: Any) -> Any:
        return self.request("POST", where, {} if body is None else body, **kwargs)
