"""Bearer tokens in the ``access_tokens`` table: issue, list and revoke them (``factstream tokens``).

The table keeps only a token's hex SHA-256 (:func:`token_hash`), never the token: the token is shown
once, when it is created. A token is named afterwards by its *id*, the first :data:`ID_LENGTH` hex
digits of its hash, which says nothing about the token itself. Hosts look a token up by its hash
(:mod:`factstream.host.auth`) and keep each lookup for ``http.token_cache_seconds``, so a revoked
token stops working within that time.
"""

from __future__ import annotations

import datetime
import hashlib
import re
import secrets
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import psycopg

from factstream.db.engine import libpq_url
from factstream.errors import DatabaseError, FactstreamError

#: How many hex digits of a token's hash make its id.
ID_LENGTH = 8
#: Random bytes in a generated token (43 URL-safe characters).
TOKEN_BYTES = 32
_HEX_RE = re.compile(rf"^[0-9a-f]{{{ID_LENGTH},64}}$")


def token_hash(token: str) -> str:
    """The hex SHA-256 of ``token`` (UTF-8), as the ``access_tokens`` table stores it."""
    return hashlib.sha256(token.encode()).hexdigest()


def new_token() -> str:
    """A fresh random token (:func:`secrets.token_urlsafe`)."""
    return secrets.token_urlsafe(TOKEN_BYTES)


def check_token(token: str) -> str:
    """``token`` if a client can send it as ``Bearer <token>``; :class:`FactstreamError` otherwise."""
    if not token or not token.isascii() or not token.isprintable() or any(c.isspace() for c in token):
        raise FactstreamError("invalid token: use printable ASCII characters without spaces (at least one)")
    return token


def check_user(user: str) -> str:
    """``user`` if it can name a user (non-empty, no whitespace); :class:`FactstreamError` otherwise."""
    if not user or not user.isprintable() or any(c.isspace() for c in user):
        raise FactstreamError(f"invalid user {user!r}: give a user ID without spaces, e.g. @alice:example.org")
    return user


@dataclass(frozen=True)
class TokenInfo:
    """One row of the table, without anything secret: its id, user, write right and creation time."""

    id: str
    user: str
    can_write: bool
    created_at: datetime.datetime

    @property
    def kind(self) -> str:
        return "writer" if self.can_write else "user"


class TokenStore:
    """The ``access_tokens`` table of the database ``url`` (blocking; one connection per call)."""

    def __init__(self, url: str) -> None:
        self.url = url

    @contextmanager
    def _connect(self) -> Iterator[psycopg.Connection]:
        try:
            with psycopg.connect(libpq_url(self.url)) as conn:
                yield conn
        except (psycopg.errors.UndefinedTable, psycopg.errors.UndefinedColumn) as exc:
            raise DatabaseError(
                "the database has no up-to-date access_tokens table (core migration fs_core_0004): "
                "run `factstream migrate` first"
            ) from exc

    def create(self, user: str, *, can_write: bool = False, token: str | None = None) -> tuple[str, TokenInfo]:
        """Store a token for ``user`` (a new random one unless ``token`` is given); return it and its row."""
        check_user(user)
        token = new_token() if token is None else check_token(token)
        hashed = token_hash(token)
        with self._connect() as conn:
            row = conn.execute(
                "INSERT INTO access_tokens (token_hash, user_id, can_write) VALUES (%s, %s, %s) "
                "ON CONFLICT (token_hash) DO NOTHING RETURNING created_at",
                (hashed, user, can_write),
            ).fetchone()
        if row is None:
            raise FactstreamError(f"that token is already in the table (id {hashed[:ID_LENGTH]}); choose another")
        return token, TokenInfo(hashed[:ID_LENGTH], user, can_write, row[0])

    def all(self, user: str | None = None) -> list[TokenInfo]:
        """The table's tokens (of ``user`` only, if given), oldest first."""
        with self._connect() as conn:
            rows = conn.execute(
                "SELECT token_hash, user_id, can_write, created_at FROM access_tokens "
                "WHERE %(user)s::text IS NULL OR user_id = %(user)s ORDER BY created_at, token_hash",
                {"user": user},
            ).fetchall()
        return [TokenInfo(h[:ID_LENGTH], u, w, c) for h, u, w, c in rows]

    def revoke(self, ref: str) -> TokenInfo:
        """Delete the token ``ref`` names: the token itself, or its id (or a longer prefix of its hash).

        :class:`FactstreamError` if none matches, or if a prefix matches several.
        """
        with self._connect() as conn:
            rows = self._delete(conn, "token_hash = %s", token_hash(ref))
            if not rows and _HEX_RE.match(ref):
                matches = conn.execute(
                    "SELECT count(*) FROM access_tokens WHERE starts_with(token_hash, %s)", (ref,)
                ).fetchone()
                if matches is not None and matches[0] > 1:
                    raise FactstreamError(f"{ref!r} matches {matches[0]} tokens: give more of the hash, or the token")
                rows = self._delete(conn, "starts_with(token_hash, %s)", ref)
        if not rows:
            raise FactstreamError(
                f"no token with id {ref!r} in the access_tokens table (see `factstream tokens list`); "
                "tokens in the config file (http.tokens) are removed by editing the file"
            )
        return rows[0]

    def revoke_user(self, user: str) -> list[TokenInfo]:
        """Delete every token of ``user``; return what was deleted (possibly nothing)."""
        with self._connect() as conn:
            return self._delete(conn, "user_id = %s", user)

    @staticmethod
    def _delete(conn: psycopg.Connection, where: str, value: str) -> list[TokenInfo]:
        rows = conn.execute(
            f"DELETE FROM access_tokens WHERE {where} RETURNING token_hash, user_id, can_write, created_at",
            (value,),
        ).fetchall()
        return sorted((TokenInfo(h[:ID_LENGTH], u, w, c) for h, u, w, c in rows), key=lambda t: (t.created_at, t.id))
