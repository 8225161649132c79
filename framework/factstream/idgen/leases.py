"""Writer leases: which instances are alive as writers, from PostgreSQL session advisory locks.

A writer holds, for as long as its process runs, a session-level advisory lock keyed by (stream,
instance) on one dedicated connection. PostgreSQL releases it when that session ends, however the
process died. So "is writer W alive?" is answered by the database, not by configuration:

* a second process started with the same instance name is refused (two writers sharing a name would
  corrupt each other's positions);
* a writer removed from the configuration is still counted while its lease is held, so the watermark
  cannot pass IDs it has not finished; once the lease is free it holds no unfinished IDs (its
  transactions died with its connections) and it can be forgotten.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable

import psycopg

from factstream.db.database import Connection, Database

log = logging.getLogger(__name__)

# Two-key advisory locks: the first key marks factstream's namespace.
_NAMESPACE = 0x46535457  # "FSTW"


class LeaseHeldError(Exception):
    """Another live process holds the lease this process asked for."""


class WriterLeases:
    """One dedicated connection holding this process's writer leases; also answers liveness."""

    def __init__(self, db: Database) -> None:
        self.db = db
        self._conn: Connection | None = None
        self._held: set[tuple[str, str]] = set()
        self._lock = asyncio.Lock()

    async def _connection(self) -> Connection:
        if self._conn is None:
            self._conn = await self.db.connect(autocommit=True)
        return self._conn

    async def claim(self, stream_key: str, instance: str) -> None:
        """Hold the lease for (stream, instance) until :meth:`close`; raise if someone else holds it."""
        async with self._lock:
            if (stream_key, instance) in self._held:
                return
            conn = await self._connection()
            cur = await conn.execute(
                "SELECT pg_try_advisory_lock(%(ns)s, hashtext(%(k)s))",
                {"ns": _NAMESPACE, "k": _key(stream_key, instance)},
            )
            row = await cur.fetchone()
            if not (row and row[0]):
                raise LeaseHeldError(
                    f"another process is already running as instance {instance!r}, writing stream {stream_key!r}; "
                    "every process needs its own instance_name"
                )
            self._held.add((stream_key, instance))

    async def alive(self, stream_key: str, instances: Iterable[str]) -> set[str]:
        """Which of ``instances`` may still complete a fact of ``stream_key``.

        Alive means holding the lease, or still having a session of this database inside a
        transaction (``application_name`` ``factstream/<instance>``, set by
        :class:`~factstream.db.database.Database`): a process that died can have a ``COMMIT`` in
        flight on a data connection for a moment after its lease session is gone. Idle sessions do
        not count, so an instance that still runs but no longer writes this stream is not alive as
        its writer.
        """
        names = sorted(set(instances))
        if not names:
            return set()
        out = {i for i in names if (stream_key, i) in self._held}
        others = [i for i in names if i not in out]
        if others:
            rows = await self.db.fetchall(
                "SELECT k.name FROM unnest(%(names)s::text[]) AS k(name) WHERE EXISTS ("
                " SELECT 1 FROM pg_locks l WHERE l.locktype = 'advisory' AND l.classid = %(ns)s"
                " AND l.objsubid = 2 AND l.granted"
                " AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())"
                " AND l.objid = (hashtext(%(prefix)s || k.name)::bigint & 4294967295)::oid"
                ") OR EXISTS (SELECT 1 FROM pg_stat_activity a"
                " WHERE a.datname = current_database()"
                " AND a.application_name = left('factstream/' || k.name, 63)"
                " AND a.state IN ('active', 'idle in transaction', 'idle in transaction (aborted)')"
                " AND a.pid <> pg_backend_pid())",
                {"names": others, "ns": _NAMESPACE, "prefix": _key(stream_key, "")},
            )
            out |= {r[0] for r in rows}
        return out

    async def close(self) -> None:
        """Release every lease; when this returns, another process may claim them.

        The locks are released explicitly, and PostgreSQL's answer awaited, before the session is
        closed: closing alone returns before the backend has exited and dropped them, and a process
        restarted at once under the same instance name was then refused as "already running". If
        the session is already broken its backend is gone, or going, and the locks with it.
        """
        async with self._lock:
            conn, self._conn = self._conn, None
            self._held.clear()
            if conn is None:
                return
            try:
                await conn.execute("SELECT pg_advisory_unlock_all()")
            except psycopg.Error as exc:
                log.warning("writer leases: releasing them before closing the session failed (%s)", exc)
            finally:
                await conn.close()


def _key(stream_key: str, instance: str) -> str:
    return f"{stream_key}:{instance}"
