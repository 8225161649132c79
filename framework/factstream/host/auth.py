"""Bearer tokens of the HTTP API: which user a request acts as, and whether it may write.

A request names itself with ``Authorization: Bearer <token>``. The token is looked up in the
configuration (``http.tokens``) first, then, unless ``http.token_table`` is off, in the
``access_tokens`` table, which holds the tokens' SHA-256 hashes only (core migrations ``fs_core_0003``
and ``fs_core_0004``; ``factstream tokens`` and :mod:`factstream.tokens` manage it). A table lookup is
kept for ``http.token_cache_seconds`` (unknown tokens too, so a client hammering with a bad token costs
one query per interval, not one per request); revoking a token therefore takes effect within that time.

The route wrapper in :mod:`factstream.host.http` turns the outcome into the status codes the API
promises: 401 for a missing, malformed or unknown token, 403 for a valid token without the right
a ``writer`` route needs.
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from factstream.plugin.web import HttpError
from factstream.tokens import token_hash

if TYPE_CHECKING:
    from factstream.config import HttpConfig
    from factstream.db.database import Database

#: The most table lookups (positive and negative) kept in memory at once.
TOKEN_CACHE_SIZE = 10_000


@dataclass(frozen=True)
class Principal:
    """Who a request acts as: ``user`` and whether it may call write routes."""

    user: str
    can_write: bool = False


class AuthError(HttpError):
    """The request may not proceed: ``status`` 401 (``M_MISSING_TOKEN``, ``M_UNKNOWN_TOKEN``) or 403
    (``M_FORBIDDEN``); ``message`` says why. A 401 asks for a bearer token (``WWW-Authenticate``)."""

    def __init__(self, status: int, errcode: str, message: str) -> None:
        super().__init__(status, errcode, message, headers={"WWW-Authenticate": "Bearer"} if status == 401 else None)


def bearer_token(header: str | None) -> str:
    """The token of an ``Authorization: Bearer <token>`` header; :class:`AuthError` (401) otherwise."""
    if not header:
        raise AuthError(401, "M_MISSING_TOKEN", "missing access token: send 'Authorization: Bearer <token>'")
    scheme, _, token = header.strip().partition(" ")
    token = token.strip()
    if scheme.lower() != "bearer" or not token or any(c.isspace() for c in token):
        raise AuthError(401, "M_MISSING_TOKEN", "malformed Authorization header: expected 'Bearer <token>'")
    return token


class TokenAuthenticator:
    """Maps bearer tokens to :class:`Principal` (see the module docstring).

    ``db`` may be ``None`` (no table lookups); ``clock`` is for tests.
    """

    def __init__(
        self,
        configured: Mapping[str, Principal],
        db: Database | None,
        *,
        cache_seconds: float = 10.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.configured = dict(configured)
        self.db = db
        self.cache_seconds = cache_seconds
        self.clock = clock
        self._cache: OrderedDict[str, tuple[float, Principal | None]] = OrderedDict()

    @classmethod
    def from_config(cls, config: HttpConfig, db: Database | None) -> TokenAuthenticator:
        """The authenticator for the ``http`` section: its tokens, and the table if enabled."""
        configured = {token: Principal(t.user, t.write) for token, t in config.tokens.items()}
        return cls(configured, db if config.token_table else None, cache_seconds=config.token_cache_seconds)

    async def authenticate(self, header: str | None) -> Principal:
        """The principal of an ``Authorization`` header value; :class:`AuthError` (401) if none."""
        token = bearer_token(header)
        principal = self.configured.get(token)
        if principal is None and self.db is not None:
            principal = await self._lookup(token)
        if principal is None:
            raise AuthError(401, "M_UNKNOWN_TOKEN", "unknown access token")
        return principal

    async def _lookup(self, token: str) -> Principal | None:
        now = self.clock()
        hashed = token_hash(token)
        cached = self._cache.get(hashed)
        if cached is not None and now - cached[0] < self.cache_seconds:
            return cached[1]
        assert self.db is not None
        rows = await self.db.fetchall(
            "SELECT user_id, can_write FROM access_tokens WHERE token_hash = %(hash)s", {"hash": hashed}
        )
        principal = Principal(str(rows[0][0]), bool(rows[0][1])) if rows else None
        if self.cache_seconds > 0:
            self._cache[hashed] = (now, principal)
            self._cache.move_to_end(hashed)
            while len(self._cache) > TOKEN_CACHE_SIZE:
                self._cache.popitem(last=False)
        return principal

    def forget(self, token: str | None = None) -> None:
        """Drop cached table lookups (of one token, or all), e.g. after revoking a token."""
        if token is None:
            self._cache.clear()
        else:
            self._cache.pop(token_hash(token), None)


def check_access(access: str, principal: Principal | None) -> None:
    """Raise :class:`AuthError` unless ``principal`` may call a route with this ``access`` level."""
    if access == "public":
        return
    if principal is None:
        raise AuthError(401, "M_MISSING_TOKEN", "missing access token: send 'Authorization: Bearer <token>'")
    if access == "writer" and not principal.can_write:
        raise AuthError(403, "M_FORBIDDEN", f"user {principal.user} may not write: this token has no write permission")
