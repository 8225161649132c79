"""How the database URL is chosen, URL forms for SQLAlchemy and libpq, and the reachability check."""

from __future__ import annotations

import re
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


def describe_database(settings: Settings, url: str) -> str:
    """Which database ``url`` is, for a person: name, server and user, or the embedded server's
    directory. Never the password."""
    if not settings.database.url:
        return f"the embedded PostgreSQL under {settings.state_dir / 'postgres'}"
    parsed = make_url(url)
    host = parsed.host or parsed.query.get("host") or "the local socket"
    where = f"{host}:{parsed.port}" if parsed.port else str(host)
    user = f" as {parsed.username}" if parsed.username else ""
    return f"database {parsed.database or '(default)'} on {where}{user}"


#: Connection failures that waiting does not cure (the server answered, and said no): matched on
#: the server's message, since libpq reports them without an SQLSTATE.
_PERMANENT = (
    ("database", re.compile(r'database "(?P<name>[^"]+)" does not exist')),
    ("role", re.compile(r'role "(?P<name>[^"]+)" does not exist')),
    ("password", re.compile(r'password authentication failed for user "[^"]+"|no password supplied')),
)


def permanent_failure_hint(url: str, message: str) -> str | None:
    """How to fix a connection failure that retrying will not fix, or ``None`` if it may be passing."""
    parsed = make_url(url)
    host = parsed.host or parsed.query.get("host") or "localhost"
    flags = f"-h {host} -p {parsed.port or 5432}"
    for kind, pattern in _PERMANENT:
        found = pattern.search(message)
        if found is None:
            continue
        if kind == "database":
            user = f" -U {parsed.username}" if parsed.username else ""
            return f"create it with `createdb {flags}{user} {found['name']}`, or point database.url at an existing one"
        if kind == "role":
            return (
                f"create the role as a superuser: `psql {flags} -U postgres -c "
                f"'CREATE ROLE \"{found['name']}\" LOGIN PASSWORD ...'`, or put an existing user in database.url"
            )
        return "check the user and password in database.url (or FACTSTREAM_DATABASE__URL)"
    return None


def check_database(url: str, timeout: float = 5.0) -> None:
    """Connect, retrying for up to ``timeout`` seconds while the server may still be starting; raise
    :class:`DatabaseError` with a one-paragraph explanation if that fails. A failure that retrying
    cannot cure (no such database or role, a wrong password) is raised at once, with its fix."""
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while True:
        try:
            with psycopg.connect(libpq_url(url), connect_timeout=max(1, int(timeout))) as conn:
                conn.execute("SELECT 1")
            return
        except psycopg.OperationalError as exc:
            last = exc
            hint = permanent_failure_hint(url, str(exc))
            if hint is not None:
                reason = " ".join(str(exc).split())
                raise DatabaseError(f"cannot use the database at {_redact(url)}: {reason}. To fix it, {hint}.") from exc
        if time.monotonic() >= deadline:
            break
        time.sleep(0.2)
    reason = " ".join(str(last).split()) if last else "unknown error"
    socket_dir = _socket_dir(url)
    if socket_dir is not None:
        # A Unix socket in a directory: typically an embedded server another process runs (the demo's
        # configuration names one), which exists only while that process does. Removing database.url
        # would reach a different database, so that is not the advice here.
        raise DatabaseError(
            f"cannot connect to the database at {_redact(url)} within {timeout:g}s: {reason}. No PostgreSQL "
            f"is listening in {socket_dir}: if the process that runs it has stopped (the demo's database lasts "
            "as long as `./dev demo --keep-running` does), start it again; otherwise check database.url in the "
            "config file (or FACTSTREAM_DATABASE__URL)."
        )
    raise DatabaseError(
        f"cannot connect to the database at {_redact(url)} within {timeout:g}s: {reason}. "
        "Check database.url in the config file (or FACTSTREAM_DATABASE__URL), that the server is running "
        "and accepts connections, or remove database.url to use the embedded PostgreSQL."
    )


def _socket_dir(url: str) -> str | None:
    """The directory of the Unix socket ``url`` connects through, or None for a TCP connection."""
    parsed = make_url(url)
    host = parsed.query.get("host") or parsed.host or ""
    host = host[0] if isinstance(host, tuple) else host
    return host if host.startswith("/") else None
