"""Running export jobs: checkpoint to watermark, transform, Parquet, commit, advance. Blocking.

For one job, :meth:`ExportRunner.run`:

1. takes the job's lock (one run per job at a time) and reads its checkpoint ``C``;
2. recovers from an interrupted run: a committed range directory starting at ``C`` (written, but the
   checkpoint was not advanced) is adopted, moving the checkpoint to its end, as often as one is
   found; an uncommitted one is removed (see :mod:`factstream.export.output`);
3. reads the stream's watermark ``W`` from the database and, if ``W > C``, reads ``(C, W]`` through the
   ``factstream`` data source, applies the job's transform, writes the result to a staging directory,
   commits it as range ``(C, W]``, and only then moves the checkpoint from ``C`` to ``W``.

Wherever the process dies, the output holds whole committed ranges that tile ``(0, checkpoint]`` plus
at most one committed range starting at the checkpoint, which the next run adopts: every fact is in
the output exactly once after the next successful run. ``full=True`` starts over: the checkpoint goes
back to 0 first, then the job's ranges are removed from the last to the first (so an interruption
leaves a prefix, which a rerun adopts), then everything up to the watermark is exported again.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from factstream.export import checkpoints, direct, runs
from factstream.export.interrupt import signalled
from factstream.export.output import JobOutput
from factstream.export.plan import ExportError, StreamPlan, job_plans, plans_for
from factstream.export.read import connect
from factstream.export.watermark import persisted_upto
from factstream.plugin.specs import ExportJobSpec

log = logging.getLogger(__name__)

#: Stream IDs per Spark task when reading (at least one task per core).
IDS_PER_TASK = 250_000

#: ``progress(job, tasks done, tasks in total)`` while a job's Spark work runs.
Progress = Callable[[str, int, int], None]


@dataclass(frozen=True)
class ExportResult:
    """What one run of a job did."""

    job: str
    stream: str
    start: int
    upto: int
    rows: int
    seconds: float
    output: str
    #: ``exported``, ``up to date`` or ``recovered`` (only adopted a range an interrupted run wrote).
    status: str
    adopted: tuple[tuple[int, int], ...] = ()

    def as_run(self) -> runs.ExportRun:
        """This result as ``export_runs`` records it."""
        return runs.ExportRun(self.job, self.stream, runs.outcome_of(self.status), self.rows, self.seconds, self.upto)


def select_jobs(registry: Any, names: Sequence[str], all_jobs: bool) -> list[ExportJobSpec]:
    """The jobs to run, by name or all of them; :class:`ExportError` for an unknown name."""
    known = sorted(registry.export_jobs.names())
    if all_jobs:
        if names:
            raise ExportError("give either job names or --all, not both")
        if not known:
            raise ExportError("no export jobs are registered: no installed plugin registers one")
        return [registry.export_jobs.get(n) for n in known]
    if not names:
        raise ExportError("name the export job(s) to run, or give --all")
    unknown = [n for n in names if n not in registry.export_jobs]
    if unknown:
        listing = ", ".join(known) if known else "none (no installed plugin registers one)"
        raise ExportError(f"unknown export job {', '.join(map(repr, unknown))}; registered jobs: {listing}")
    return [registry.export_jobs.get(n) for n in names]


class ExportRunner:
    """Runs export jobs of the given plugins in one Spark session, into one output root."""

    def __init__(
        self, spark: Any, plugins: Any, url: str, output_root: str, *, progress: Progress | None = None
    ) -> None:
        self.spark = spark
        self.registry = plugins.registry
        self.url = url
        self.output_root = output_root.rstrip("/")
        self.progress = progress
        self.plans: dict[str, StreamPlan | str] = plans_for([r.spec for r in self.registry.streams])
        jobs = [r.spec for r in self.registry.export_jobs]
        from factstream.export.datasource import data_source_class

        spark.dataSource.register(data_source_class(self.plans, url, job_plans(jobs, self.plans)))

    def plan(self, job: ExportJobSpec) -> StreamPlan:
        found = self.plans.get(job.stream)
        if found is None:
            raise ExportError(f"export job {job.name!r} reads stream {job.stream!r}, which is not registered")
        if isinstance(found, str):
            raise ExportError(f"export job {job.name!r}: {found}")
        return found.for_job(job)

    def run(self, job: ExportJobSpec, *, full: bool = False) -> ExportResult:
        """Export the job's new facts (see the module docstring); the checkpoint moves only on success.

        Every run that got the job's lock is recorded in ``export_runs`` as it ends, a failed one too
        (:mod:`factstream.export.runs`), and logged (``export run begun``, ``export run finished``).
        """
        started = time.monotonic()
        plan = self.plan(job)
        with connect(self.url) as conn, checkpoints.JobLock(conn, job.name):
            cp = checkpoints.read(conn, job.name)
            runs.log_begun(job.name, job.stream, cp.upto if cp is not None else 0)
            try:
                result = self._run_locked(conn, job, plan, full=full, started=started)
            except Exception as exc:
                if not signalled():  # an interrupted run is not a failed one (it records nothing)
                    runs.record(conn, runs.failed(conn, job.name, job.stream, time.monotonic() - started, exc))
                raise
            runs.record(conn, result.as_run())
        return result

    def _run_locked(
        self, conn: Any, job: ExportJobSpec, plan: StreamPlan, *, full: bool, started: float
    ) -> ExportResult:
        """:meth:`run`'s work, once it holds the job's lock."""
        out = JobOutput(self.spark, self.output_root, job.name)
        cp = checkpoints.read(conn, job.name)
        if cp is not None and cp.output != self.output_root and cp.upto > 0 and not full:
            raise ExportError(
                f"export job {job.name!r} has exported up to {cp.upto} into {cp.output!r}, not "
                f"{self.output_root!r}; give --output {cp.output} to continue, or --full to export "
                "everything again into the new location"
            )
        if cp is None:
            cp = checkpoints.create(conn, job.name, job.stream, self.output_root)
        if full:
            if cp.upto != 0:
                checkpoints.advance(conn, job.name, cp.upto, 0, self.output_root)
            for r in reversed(out.ranges()):
                out.remove(r.path)
            cp = checkpoints.Checkpoint(job.name, job.stream, 0, self.output_root, None)
        out.clean()
        start, adopted = self._recover(conn, job, out, cp.upto)
        upto = persisted_upto(conn, plan)
        if upto <= start:
            status = "recovered" if adopted else "up to date"
            return ExportResult(
                job.name, job.stream, start, start, 0, time.monotonic() - started, out.path, status, adopted
            )
        rows, path = self._export_range(job, out, start, upto)
        checkpoints.advance(conn, job.name, start, upto, self.output_root)
        out.clean()
        log.debug("export %s: (%d, %d] -> %s, %d rows", job.name, start, upto, path, rows)
        return ExportResult(
            job.name, job.stream, start, upto, rows, time.monotonic() - started, out.path, "exported", adopted
        )

    def _recover(
        self, conn: Any, job: ExportJobSpec, out: JobOutput, start: int
    ) -> tuple[int, tuple[tuple[int, int], ...]]:
        """Adopt committed ranges at the checkpoint; drop uncommitted ones; refuse inconsistent output."""
        ranges = out.ranges()
        for r in ranges:
            if not r.committed:
                log.warning("export %s: removing uncommitted range (%d, %d] at %s", job.name, r.lo, r.hi, r.path)
                out.remove(r.path)
        committed = [r for r in ranges if r.committed]
        adopted = []
        while True:
            following = [r for r in committed if r.lo == start]
            if not following:
                break
            nxt = following[0]
            checkpoints.advance(conn, job.name, start, nxt.hi, self.output_root)
            log.warning("export %s: adopted range (%d, %d] written by an interrupted run", job.name, nxt.lo, nxt.hi)
            adopted.append((nxt.lo, nxt.hi))
            start = nxt.hi
        beyond = [r for r in committed if r.hi > start]
        if beyond:
            r = beyond[0]
            raise ExportError(
                f"export job {job.name!r}: the output holds range ({r.lo}, {r.hi}] at {r.path}, which does not "
                f"follow the checkpoint {start}; the output and the checkpoint disagree (output edited or "
                "checkpoint reset by hand?). Run with --full to export everything again"
            )
        return start, tuple(adopted)

    def _export_range(self, job: ExportJobSpec, out: JobOutput, start: int, upto: int) -> tuple[int, str]:
        from pyspark.sql import Observation
        from pyspark.sql import functions as F

        tasks = max(self.spark.sparkContext.defaultParallelism, -(-(upto - start) // IDS_PER_TASK))
        staging = out.staging(start, upto)
        if direct.can_write_directly(job, staging):
            return self._export_range_directly(job, out, staging, start, upto, tasks)
        source = ("job", job.name) if job.source is not None else ("stream", job.stream)
        df = (
            self.spark.read.format("factstream")
            .option(*source)
            .option("from", str(start))
            .option("upto", str(upto))
            .option("partitions", str(tasks))
            .option("content", "true" if job.content else "false")
            .load()
        )
        if job.transform is not None:
            owner = self.registry.export_jobs.owner(job.name)
            try:
                df = job.transform(df)
            except Exception as exc:
                raise ExportError(
                    f"export job {job.name!r} (plugin {owner!r}): transform failed: {type(exc).__name__}: {_short(exc)}"
                ) from None
        observation = Observation(f"factstream_export_{job.name}")
        df = df.observe(observation, F.count(F.lit(1)).alias("rows"))
        writer = df.write.format(job.format).mode("errorifexists")
        if job.partition_by:
            writer = writer.partitionBy(*job.partition_by)
        with self._writing(job, start, upto):
            writer.save(staging)
        path = out.commit(staging, start, upto)
        return int(observation.get.get("rows", 0)), path

    def _export_range_directly(
        self, job: ExportJobSpec, out: JobOutput, staging: str, start: int, upto: int, tasks: int
    ) -> tuple[int, str]:
        """The same range written by the workers with pyarrow (see :mod:`factstream.export.direct`)."""
        with self._writing(job, start, upto):
            rows = direct.write_range(self.spark, self.url, self.plan(job), staging, start, upto, tasks)
        return rows, out.commit(staging, start, upto)

    @contextlib.contextmanager
    def _writing(self, job: ExportJobSpec, start: int, upto: int) -> Iterator[None]:
        """Writing range ``(start, upto]`` as one Spark job group, its tasks reported as progress; a
        failure becomes an :class:`ExportError`. After an interruption the JVM is not called again: the
        interrupted call may have left this thread's py4j connection in the middle of a command, and the
        session is stopped on the way out (:mod:`factstream.export.interrupt`)."""
        group = f"factstream-export-{job.name}-{start}-{upto}"
        self.spark.sparkContext.setJobGroup(group, f"export {job.name} ({start}, {upto}]")
        watcher = _TaskWatcher(self.spark, group, job.name, self.progress) if self.progress else None
        try:
            yield
        except Exception as exc:
            if signalled():
                raise
            with contextlib.suppress(Exception):
                self.spark.sparkContext.setLocalProperty("spark.jobGroup.id", None)
            raise ExportError(
                f"export job {job.name!r}: writing range ({start}, {upto}] failed: {type(exc).__name__}: "
                f"{_short(exc)}; the checkpoint was not moved"
            ) from None
        finally:
            if watcher is not None:
                watcher.stop()
        self.spark.sparkContext.setLocalProperty("spark.jobGroup.id", None)


class _TaskWatcher:
    """Reports finished/total tasks of a Spark job group every half second (for a progress bar)."""

    def __init__(self, spark: Any, group: str, job: str, progress: Progress) -> None:
        self.tracker = spark.sparkContext.statusTracker()
        self.group = group
        self.job = job
        self.progress = progress
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name=f"progress:{job}", daemon=True)
        self._thread.start()

    def _poll(self) -> None:
        done = total = 0
        for job_id in self.tracker.getJobIdsForGroup(self.group):
            info = self.tracker.getJobInfo(job_id)
            for stage_id in info.stageIds if info else ():
                stage = self.tracker.getStageInfo(stage_id)
                if stage is not None:
                    done += stage.numCompletedTasks
                    total += stage.numTasks
        if total:
            self.progress(self.job, done, total)

    def _loop(self) -> None:
        while not self._stop.wait(0.5):
            try:
                self._poll()
            except Exception:  # the session may be stopping; progress is cosmetic
                return

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2)


def _short(exc: Exception) -> str:
    text = " ".join(str(exc).split())
    return text if len(text) <= 400 else text[:400] + "..."
