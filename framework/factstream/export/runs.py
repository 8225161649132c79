"""Export runs recorded in the database, and the export metrics every host shows from them.

``factstream export`` is a short-lived process that no Prometheus scrapes. So the runner records each
run as it ends, success or failure, in the table ``export_runs`` (:func:`record`), and every host
reads the newest rows when ``/metrics`` is scraped (:class:`ExportRunsMonitor`, one query of the
newest row per job and outcome, and one of the checkpoints, cached :data:`CACHE_SECONDS`):

* ``factstream_export_runs_total{job,outcome}`` (``exported``, ``up_to_date``, ``recovered``, ``failed``),
* ``factstream_export_rows_total{job}``, ``factstream_export_last_duration_seconds{job}``,
* ``factstream_export_last_success_timestamp_seconds{job}`` (the end of the newest run that did not fail),
* ``factstream_export_behind_positions{job}``: the stream's persisted position as this host sees it
  minus the job's checkpoint (facts committed but not yet exported).

A row carries the job's counts up to and including it (``runs`` by outcome, ``rows_total``), so the
newest rows alone give the counters and older rows can go: each record keeps the newest
:data:`KEEP_RUNS` runs of the job and the newest run of each outcome. Rows are written under the
job's lock (one run per job at a time), so the counts are never computed by two runs at once.

The runner logs ``export run begun`` and ``export run finished`` with the same fields (INFO).
"""

from __future__ import annotations

import logging
import time
import weakref
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Literal, Protocol

import psycopg
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from factstream import metrics
from factstream.logs import kv

log = logging.getLogger(__name__)

Outcome = Literal["exported", "up_to_date", "recovered", "failed"]
OUTCOMES: tuple[Outcome, ...] = ("exported", "up_to_date", "recovered", "failed")
#: Runs of a job kept in ``export_runs`` besides the newest of each outcome.
KEEP_RUNS = 100
#: How long a host reuses what it read of ``export_runs`` (scrapes closer together share one query).
CACHE_SECONDS = 5.0


@dataclass(frozen=True)
class ExportRun:
    """One run of an export job as it ended (``upto``: the checkpoint after it, ``None`` if unknown)."""

    job: str
    stream: str
    outcome: Outcome
    rows: int
    seconds: float
    upto: int | None
    error: str | None = None

    def fields(self) -> dict[str, Any]:
        """The run's ``key=value`` fields for the log line."""
        found = {
            "job": self.job,
            "stream": self.stream,
            "outcome": self.outcome,
            "rows": self.rows,
            "seconds": round(self.seconds, 3),
            "upto": self.upto,
        }
        return found | ({"error": self.error} if self.error else {})


def outcome_of(status: str) -> Outcome:
    """The ``outcome`` of an ``ExportResult.status`` (``up to date`` is ``up_to_date``)."""
    outcome = status.replace(" ", "_")
    if outcome not in OUTCOMES:
        raise ValueError(f"unknown export status {status!r}")
    return outcome


def failed(conn: psycopg.Connection[Any], job: str, stream: str, seconds: float, exc: BaseException) -> ExportRun:
    """The record of a run that failed with ``exc``; ``upto`` is the checkpoint as it stayed (``None``
    when the database cannot say, the connection being what failed)."""
    try:
        row = conn.execute("SELECT upto FROM export_checkpoints WHERE job = %(j)s", {"j": job}).fetchone()
    except psycopg.Error:
        row = None
    message = " ".join(str(exc).split()) or type(exc).__name__
    return ExportRun(job, stream, "failed", 0, seconds, int(row[0]) if row else None, message[:1000])


def log_begun(job: str, stream: str, checkpoint: int) -> None:
    log.info("export run begun", extra=kv(job=job, stream=stream, checkpoint=checkpoint))


_INSERT = """
INSERT INTO export_runs (job, stream_name, outcome, rows, duration_seconds, upto, error, runs, rows_total)
SELECT %(job)s, %(stream)s, %(outcome)s, %(rows)s, %(seconds)s, %(upto)s, %(error)s,
  COALESCE((SELECT runs FROM export_runs WHERE job = %(job)s AND outcome = %(outcome)s
            ORDER BY id DESC LIMIT 1), 0) + 1,
  COALESCE((SELECT rows_total FROM export_runs WHERE job = %(job)s ORDER BY id DESC LIMIT 1), 0) + %(rows)s
"""
_PRUNE = """
DELETE FROM export_runs AS old
WHERE old.job = %(job)s
  AND old.id < (SELECT id FROM export_runs WHERE job = %(job)s ORDER BY id DESC OFFSET %(older)s LIMIT 1)
  AND old.id <> (SELECT max(id) FROM export_runs WHERE job = old.job AND outcome = old.outcome)
"""


def record(conn: psycopg.Connection[Any], run: ExportRun) -> None:
    """Store ``run`` (on an autocommit connection holding the job's lock) and log it.

    A failure to store (a database not migrated to ``fs_core_0005``, a connection lost) is logged and
    swallowed: the run's own outcome is what the caller reports.
    """
    log.info("export run finished", extra=kv(**run.fields()))
    params = {
        "job": run.job,
        "stream": run.stream,
        "outcome": run.outcome,
        "rows": run.rows,
        "seconds": run.seconds,
        "upto": run.upto,
        "error": run.error,
        "older": KEEP_RUNS - 1,
    }
    try:
        with conn.transaction():
            conn.execute(_INSERT, params)
            conn.execute(_PRUNE, params)
    except psycopg.Error as exc:
        log.warning("could not record the export run of %s: %s", run.job, exc)


# -- the hosts' view -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class JobRuns:
    """What ``export_runs`` and ``export_checkpoints`` say of one job."""

    job: str
    stream: str
    #: Runs by outcome, all time (pruned rows included).
    runs: Mapping[str, int]
    rows_total: int
    last_duration_seconds: float | None
    last_success: float | None
    checkpoint: int | None


_LATEST = """
SELECT DISTINCT ON (job, outcome) job, stream_name, outcome, runs, rows_total, duration_seconds,
  extract(epoch FROM finished_at), id
FROM export_runs ORDER BY job, outcome, id DESC
"""
_CHECKPOINTS = "SELECT job, stream_name, upto FROM export_checkpoints"


def summarise(latest: list[tuple[Any, ...]], checkpoints: list[tuple[Any, ...]]) -> list[JobRuns]:
    """Each job's :class:`JobRuns` from the newest row per (job, outcome) and the checkpoints."""
    rows_by_job: dict[str, list[tuple[Any, ...]]] = {}
    for row in latest:
        rows_by_job.setdefault(str(row[0]), []).append(row)
    marks = {str(job): (str(stream), int(upto)) for job, stream, upto in checkpoints}
    jobs = []
    for job in sorted(set(rows_by_job) | set(marks)):
        rows = rows_by_job.get(job, [])
        newest = max(rows, key=lambda r: int(r[7]), default=None)
        successes = [float(r[6]) for r in rows if r[2] != "failed"]
        jobs.append(
            JobRuns(
                job=job,
                stream=str(newest[1]) if newest is not None else marks[job][0],
                runs={str(r[2]): int(r[3]) for r in rows},
                rows_total=int(newest[4]) if newest is not None else 0,
                last_duration_seconds=float(newest[5]) if newest is not None else None,
                last_success=max(successes, default=None),
                checkpoint=marks[job][1] if job in marks else None,
            )
        )
    return jobs


class RunsDatabase(Protocol):
    """What the monitor needs of the host's database (``factstream.db.database.Database`` is one)."""

    async def fetchall(self, statement: str, params: Mapping[str, Any] | None = None) -> list[Any]: ...


class ExportRunsMonitor:
    """One host's view of the export runs: :meth:`refresh` before a scrape, read by the collector.

    ``position(stream)`` is the stream's persisted position (a positive wire token) as the host sees
    it, or ``None`` for a stream it does not run; it is read at scrape time, the database at most
    every :data:`CACHE_SECONDS`.
    """

    def __init__(
        self,
        db: RunsDatabase,
        position: Callable[[str], int | None],
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.db = db
        self.position = position
        self.clock = clock
        self.jobs: list[JobRuns] = []
        self._read_at: float | None = None
        _live.add(self)

    async def refresh(self) -> None:
        """Read the runs again unless they were read within :data:`CACHE_SECONDS`. A database error is
        logged; the metrics keep the last values read."""
        now = self.clock()
        if self._read_at is not None and now - self._read_at < CACHE_SECONDS:
            return
        self._read_at = now
        try:
            latest = await self.db.fetchall(_LATEST)
            marks = await self.db.fetchall(_CHECKPOINTS)
        except Exception as exc:
            log.warning("could not read the export runs: %s", exc)
            return
        self.jobs = summarise([tuple(r) for r in latest], [tuple(r) for r in marks])

    def close(self) -> None:
        _live.discard(self)

    def families(self) -> list[Metric]:
        runs = CounterMetricFamily(
            "factstream_export_runs", "Export runs by job and outcome", labels=["job", "outcome"]
        )
        rows = CounterMetricFamily("factstream_export_rows", "Rows written by a job's export runs", labels=["job"])
        duration = GaugeMetricFamily(
            "factstream_export_last_duration_seconds", "How long the job's newest run took", labels=["job"]
        )
        success = GaugeMetricFamily(
            "factstream_export_last_success_timestamp_seconds",
            "When the job's newest run that did not fail ended (Unix time)",
            labels=["job"],
        )
        behind = GaugeMetricFamily(
            "factstream_export_behind_positions",
            "The stream's persisted position as this instance sees it minus the job's checkpoint",
            labels=["job"],
        )
        for job in self.jobs:
            for outcome in OUTCOMES:
                runs.add_metric([job.job, outcome], job.runs.get(outcome, 0))
            rows.add_metric([job.job], job.rows_total)
            if job.last_duration_seconds is not None:
                duration.add_metric([job.job], job.last_duration_seconds)
            if job.last_success is not None:
                success.add_metric([job.job], job.last_success)
            position = self.position(job.stream)
            if position is not None:
                behind.add_metric([job.job], max(0, position - (job.checkpoint or 0)))
        return [runs, rows, duration, success, behind]


_live: weakref.WeakSet[ExportRunsMonitor] = weakref.WeakSet()


class _ExportRunsCollector(Collector):
    """The export metrics of this process: those of the monitor read last (the hosts of one process
    share a database, except in tests; the metrics carry no instance label)."""

    def collect(self) -> Iterator[Metric]:
        monitors = [m for m in list(_live) if m._read_at is not None]
        if monitors:
            yield from max(monitors, key=lambda m: m._read_at or 0.0).families()


_COLLECTOR = _ExportRunsCollector()


def register() -> None:
    """Register the export metrics' collector in the default registry (once per process)."""
    metrics.register(_COLLECTOR)
