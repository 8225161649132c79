"""Where export jobs stand, read from PostgreSQL and the output directory alone, without Spark.

``factstream export`` without a job lists the jobs with their checkpoints and how many facts wait;
before starting Spark (a JVM, some 15 s) it asks :func:`up_to_date` of every chosen job and runs
Spark only for the others. A job counts as up to date only when nothing could have to happen: it
has a checkpoint into this output root, the stream's watermark is not past it, and the job's output
directory (a local one: other filesystems need Hadoop's client) holds committed ranges up to the
checkpoint and nothing else, so no interrupted run's range waits to be adopted or cleaned.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import psycopg

from factstream.export import checkpoints
from factstream.export.output import _RANGE_RE, MARKER, local_path
from factstream.export.plan import StreamPlan
from factstream.export.runner import ExportResult
from factstream.export.watermark import persisted_upto


@dataclass(frozen=True)
class JobStatus:
    """One job's checkpoint (``None``: it never ran), its stream's watermark and the facts in between."""

    job: str
    stream: str
    checkpoint: int | None
    output: str | None
    watermark: int
    #: Facts with positions in ``(checkpoint, watermark]`` (``None`` for a stream without tables).
    pending: int | None


def job_status(conn: psycopg.Connection[Any], job: str, plan: StreamPlan) -> JobStatus:
    cp = checkpoints.read(conn, job)
    start = cp.upto if cp is not None else 0
    watermark = persisted_upto(conn, plan)
    pending: int | None = None
    if plan.tables:
        if watermark <= start:
            pending = 0
        else:
            union = " UNION ALL ".join(f"SELECT 1 FROM {t.table} WHERE {plan.range_condition(t)}" for t in plan.tables)
            row = conn.execute(f"SELECT count(*) FROM ({union}) AS pending", {"lo": start, "hi": watermark}).fetchone()
            pending = int(row[0]) if row else 0
    return JobStatus(
        job, plan.stream, cp.upto if cp else None, cp.output if cp else None, max(watermark, start), pending
    )


def up_to_date(conn: psycopg.Connection[Any], job: str, plan: StreamPlan, root: str) -> ExportResult | None:
    """The result of running ``job`` when that would do nothing (see the module docstring), else ``None``."""
    started = time.monotonic()
    cp = checkpoints.read(conn, job)
    if cp is None or cp.output != root or persisted_upto(conn, plan) > cp.upto:
        return None
    job_dir = local_path(f"{root}/{job}")
    if job_dir is None or not _only_committed_ranges(job_dir, cp.upto):
        return None
    return ExportResult(
        job, plan.stream, cp.upto, cp.upto, 0, time.monotonic() - started, f"{root}/{job}", "up to date"
    )


def _only_committed_ranges(job_dir: Path, checkpoint: int) -> bool:
    if not job_dir.exists():
        return checkpoint == 0
    for entry in job_dir.iterdir():
        found = _RANGE_RE.match(entry.name)
        if found is None or int(found[2]) > checkpoint or not (entry / MARKER).exists():
            return False  # staging or trash left over, a range to adopt, or one to clean: Spark's work
    return True
