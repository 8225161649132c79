"""Export checkpoints (table ``export_checkpoints``) and the per-job run lock. Blocking I/O.

A job's checkpoint is the position up to which (inclusive) its facts are in committed output. It moves
only by compare-and-set from the value the run started from, after the output of the range is
committed, so a crash leaves it at a value whose output is complete; and two runs of one job cannot
interleave, because each holds the job's advisory lock for its whole run.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

import psycopg

from factstream.export.plan import ExportError

# Two-key advisory locks: the first key marks factstream's export namespace ("FSEX").
_LOCK_NAMESPACE = 0x46534558


@dataclass(frozen=True)
class Checkpoint:
    job: str
    stream: str
    upto: int
    output: str
    updated_at: datetime | None


def read(conn: psycopg.Connection[Any], job: str) -> Checkpoint | None:
    """The job's checkpoint, or ``None`` if it never ran."""
    row = conn.execute(
        "SELECT job, stream_name, upto, output, updated_at FROM export_checkpoints WHERE job = %(j)s", {"j": job}
    ).fetchone()
    return None if row is None else Checkpoint(str(row[0]), str(row[1]), int(row[2]), str(row[3]), row[4])


def create(conn: psycopg.Connection[Any], job: str, stream: str, output: str) -> Checkpoint:
    """Start the job at position 0, writing to ``output`` (no-op if it already has a checkpoint)."""
    conn.execute(
        "INSERT INTO export_checkpoints (job, stream_name, upto, output) VALUES (%(j)s, %(s)s, 0, %(o)s) "
        "ON CONFLICT (job) DO NOTHING",
        {"j": job, "s": stream, "o": output},
    )
    found = read(conn, job)
    assert found is not None
    return found


def advance(conn: psycopg.Connection[Any], job: str, expected: int, upto: int, output: str) -> None:
    """Move the checkpoint from ``expected`` to ``upto``; raise if someone else moved it meanwhile."""
    cur = conn.execute(
        "UPDATE export_checkpoints SET upto = %(u)s, output = %(o)s, updated_at = now() "
        "WHERE job = %(j)s AND upto = %(e)s",
        {"j": job, "e": expected, "u": upto, "o": output},
    )
    if cur.rowcount != 1:
        raise ExportError(
            f"export job {job!r}: its checkpoint is no longer {expected} (changed by another process?); "
            "the committed output is kept and the next run continues from the stored checkpoint"
        )


class JobLock:
    """A session advisory lock per job, held on its own connection for the whole run."""

    def __init__(self, conn: psycopg.Connection[Any], job: str) -> None:
        self.conn = conn
        self.job = job

    def __enter__(self) -> JobLock:
        row = self.conn.execute(
            "SELECT pg_try_advisory_lock(%(ns)s, hashtext(%(j)s))", {"ns": _LOCK_NAMESPACE, "j": self.job}
        ).fetchone()
        if not (row and row[0]):
            raise ExportError(f"export job {self.job!r} is already running in another process; wait for it to finish")
        return self

    def __exit__(self, *exc: object) -> None:
        self.conn.execute("SELECT pg_advisory_unlock(%(ns)s, hashtext(%(j)s))", {"ns": _LOCK_NAMESPACE, "j": self.job})
