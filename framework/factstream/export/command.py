"""``factstream export``: choose jobs, check everything that can be checked before Spark starts, run
the jobs with a progress bar, print a summary. Every user error is an :class:`ExportError` (exit 2)
raised before any checkpoint moves."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from rich.console import Console, Group
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from factstream.export import checkpoints, runs
from factstream.export.interrupt import spark_stopped_on_exit
from factstream.export.output import local_path, local_uri
from factstream.export.plan import ExportError, StreamPlan, plans_for
from factstream.export.read import connect
from factstream.export.runner import ExportResult, ExportRunner, select_jobs
from factstream.export.session import check_master
from factstream.export.status import job_status, up_to_date
from factstream.plugin.specs import ExportJobSpec


def resolve_output(output: str | None, state_dir: Path) -> str:
    """The output root URI: ``--output`` (a URI, or a local path that must exist) or ``<state_dir>/exports``."""
    if output is None:
        default = (state_dir / "exports").resolve()
        default.mkdir(parents=True, exist_ok=True)
        return local_uri(default)
    scheme = urlsplit(output).scheme
    if len(scheme) > 1:  # a URI (file:, hdfs:, s3a:, ...); checked through Hadoop once Spark runs
        return output.rstrip("/")
    path = Path(output).expanduser().resolve()
    if not path.is_dir():
        raise ExportError(
            f"output location {output!r} does not exist or is not a directory; create it (or give another "
            "--output). Nothing was exported and no checkpoint moved."
        )
    return local_uri(path)


def parse_conf(pairs: Sequence[str]) -> dict[str, str]:
    conf = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise ExportError(f"--conf takes KEY=VALUE (a Spark setting), not {pair!r}")
        conf[key.strip()] = value
    return conf


def run_export(
    state: Any,
    console: Console,
    progress_console: Console,
    jobs: Sequence[str],
    *,
    all_jobs: bool = False,
    master: str = "local[*]",
    output: str | None = None,
    full: bool = False,
    conf: Sequence[str] = (),
) -> list[ExportResult]:
    """Run the chosen jobs (see ``factstream export --help``); returns what each did.

    With neither job names nor ``all_jobs``, lists the jobs instead. Jobs with nothing to do are
    answered from PostgreSQL without starting Spark; when none has anything to do, no JVM starts.
    """
    from factstream.db.engine import check_database, database_url
    from factstream.migrate import require_migrated

    plugins = state.plugins
    settings = state.settings
    if not jobs and not all_jobs:
        url = database_url(settings)
        check_database(url, settings.database.connect_timeout)
        require_migrated(url, plugins)
        console.print(job_table(plugins.registry, url))
        return []
    selected = select_jobs(plugins.registry, jobs, all_jobs)
    spark_conf = parse_conf(conf)
    root = resolve_output(output, settings.state_dir)
    check_master(master)
    url = database_url(settings)
    check_database(url, settings.database.connect_timeout)
    require_migrated(url, plugins)
    done = {} if full else _up_to_date(plugins.registry, url, root, selected)
    results = [done[job.name] for job in selected if job.name in done]
    remaining = [job for job in selected if job.name not in done]
    if not remaining:
        console.print(summary(results))
        return results
    with spark_stopped_on_exit() as sessions:
        spark = sessions.start(master, spark_conf)
        columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
        with Progress(*columns, console=progress_console, transient=True) as bar:
            tasks = {job.name: bar.add_task(f"export {job.name}", total=None) for job in remaining}

            def report(name: str, done: int, total: int) -> None:
                bar.update(tasks[name], completed=done, total=total)

            runner = ExportRunner(spark, plugins, url, root, progress=report)
            try:
                for job in remaining:
                    results.append(runner.run(job, full=full))
                    bar.update(tasks[job.name], completed=1, total=1)
            finally:
                if results:
                    console.print(summary(results))
    return results


def _plans(registry: Any) -> dict[str, StreamPlan | str]:
    return plans_for([r.spec for r in registry.streams])


def _up_to_date(registry: Any, url: str, root: str, jobs: Sequence[ExportJobSpec]) -> dict[str, ExportResult]:
    """The jobs with nothing to do, answered without Spark (see :mod:`factstream.export.status`)."""
    plans = _plans(registry)
    found = {}
    with connect(url) as conn:
        for job in jobs:
            plan = plans.get(job.stream)
            if isinstance(plan, StreamPlan):
                result = up_to_date(conn, job.name, plan, root)
                if result is not None:
                    found[job.name] = result
                    _record(conn, result)
    return found


def _record(conn: Any, result: ExportResult) -> None:
    """Record a run answered without Spark, under the job's lock; skipped when another process runs
    the job now (its own run is what counts)."""
    try:
        with checkpoints.JobLock(conn, result.job):
            runs.log_begun(result.job, result.stream, result.upto)
            runs.record(conn, result.as_run())
    except ExportError:
        pass


def job_table(registry: Any, url: str) -> Table | str:
    """``factstream export`` without a job: every registered job, its checkpoint and what waits."""
    names = sorted(registry.export_jobs.names())
    if not names:
        return "No export jobs are registered: no installed plugin registers one."
    plans = _plans(registry)
    table = Table(
        title="export jobs (run: factstream export JOB ... or --all)",
        caption="facts pending: the stream's facts past the checkpoint, up to the watermark",
    )
    _add_name_columns(table, names, [registry.export_jobs.get(n).stream for n in names])
    for col in ("checkpoint", "watermark", "facts pending"):
        table.add_column(col, justify="right")
    table.add_column("output", overflow="fold")  # folded when it must be: a path is never cut
    with connect(url) as conn:
        for name in names:
            job = registry.export_jobs.get(name)
            plan = plans.get(job.stream)
            if not isinstance(plan, StreamPlan):
                table.add_row(name, job.stream, "", "", "", plan or "stream not registered")
                continue
            st = job_status(conn, name, plan)
            table.add_row(
                name,
                st.stream,
                "never ran" if st.checkpoint is None else str(st.checkpoint),
                str(st.watermark),
                "?" if st.pending is None else f"{st.pending:,}",
                shown_output(st.output or ""),
            )
    return table


def summary(results: Sequence[ExportResult]) -> Group:
    """The table ``factstream export`` prints after a run, then where each job's output is (a path can
    be long: under the table it is never cut, and the table fits a terminal)."""
    table = Table(title="factstream export")
    _add_name_columns(table, [r.job for r in results], [r.stream for r in results])
    spans = [f"({r.start}, {r.upto}]" if r.upto > r.start else f"up to {r.upto}" for r in results]
    table.add_column("range", no_wrap=True, min_width=max(map(len, ["range", *spans])))
    table.add_column("rows written", justify="right")
    table.add_column("seconds", justify="right", no_wrap=True, min_width=len("seconds"))
    table.add_column("status", no_wrap=True, min_width=len("up to date"))
    for r, span in zip(results, spans, strict=True):
        table.add_row(r.job, r.stream, span, f"{r.rows:,}", f"{r.seconds:.1f}", r.status)
    notes = [
        "range: the stream positions exported, (from, upto]; rows written: the rows the job wrote (its "
        "transform may write fewer or more rows than facts)",
        *(f"{r.job}: {shown_output(r.output)}" for r in results),
    ]
    return Group(table, *(Text(note) for note in notes))


def _add_name_columns(table: Table, jobs: Sequence[str], streams: Sequence[str]) -> None:
    """The job and stream columns: names a user types, so never cut or wrapped (the others give way)."""
    for title, names in (("job", jobs), ("stream", streams)):
        table.add_column(title, no_wrap=True, min_width=max([len(title), *map(len, names)]))


def shown_output(uri: str) -> str:
    """An output location as a user reads it: a local directory as its path (its ``file://`` URI holds
    the path unescaped, as Hadoop reads it, which is no URI to paste), any other as its URI."""
    path = local_path(uri)
    return uri if path is None else str(path)
