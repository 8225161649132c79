"""How the database URL is chosen, URL forms for SQLAlchemy and libpq, and the reachability check."""

from __future__ import annotations

import time

import psycopg
from sqlalchemy.engine import make_url

from factstream.config import Settings
from factstream.db.embedded import start_embedded
from factstream.errors import DatabaseError


def database_url(settings: Settings) -> str:
    """The configured ``postgresql://`` URL, or the embedded server's (started on demand). Blocking."""
    if settings.database.url:
        return settings.database.url
    return start_embedded(settings.state_dir)


def sync_url(url: str) -> str:
    """``url`` with the psycopg 3 driver selected, for SQLAlchemy (sync or async)."""
    parsed = make_url(url)
    return parsed.set(drivername="postgresql+psycopg").render_as_string(hide_password=False)


def libpq_url(url: str) -> str:
    """``url`` as libpq understands it (no SQLAlchemy driver suffix)."""
    return make_url(url).set(drivername="postgresql").render_as_string(hide_password=False)


def _redact(url: str) -> str:
    return make_url(url).render_as_string(hide_password=True)


def check_database(url: str, timeout: float = 5.0) -> None:
    """Connect once; raise :class:`DatabaseError` with a one-paragraph explanation if that fails."""
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while True:
        try:
            with psycopg.connect(libpq_url(url), connect_timeout=max(1, int(timeout))) as conn:
                conn.execute("SELECT 1")
            return
        except psycopg.OperationalError as exc:
            last = exc
        if time.monotonic() >= deadline:
            break
        time.sleep(0.2)
    reason = " ".join(str(last).split()) if last else "unknown error"
    raise DatabaseError(
        f"cannot connect to the database at {_redact(url)} within {timeout:g}s: {reason}. "
        "Check database.url in the config file (or FACTSTREAM_DATABASE__URL), that the server is running "
        "and accepts connections, or remove database.url to use the embedded PostgreSQL."
    )
