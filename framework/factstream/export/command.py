"""``factstream export``: choose jobs, check everything that can be checked before Spark starts, run
the jobs with a progress bar, print a summary. Every user error is an :class:`ExportError` (exit 2)
raised before any checkpoint moves."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from factstream.export.plan import ExportError
from factstream.export.runner import ExportResult, ExportRunner, select_jobs


def resolve_output(output: str | None, state_dir: Path) -> str:
    """The output root URI: ``--output`` (a URI, or a local path that must exist) or ``<state_dir>/exports``."""
    if output is None:
        default = (state_dir / "exports").resolve()
        default.mkdir(parents=True, exist_ok=True)
        return default.as_uri()
    scheme = urlsplit(output).scheme
    if len(scheme) > 1:  # a URI (file:, hdfs:, s3a:, ...); checked through Hadoop once Spark runs
        return output.rstrip("/")
    path = Path(output).expanduser().resolve()
    if not path.is_dir():
        raise ExportError(
            f"output location {output!r} does not exist or is not a directory; create it (or give another "
            "--output). Nothing was exported and no checkpoint moved."
        )
    return path.as_uri()


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
    """Run the chosen jobs (see ``factstream export --help``); returns what each did."""
    from factstream.db.engine import check_database, database_url
    from factstream.export.session import build_session, check_master

    plugins = state.plugins
    selected = select_jobs(plugins.registry, jobs, all_jobs)
    settings = state.settings
    spark_conf = parse_conf(conf)
    root = resolve_output(output, settings.state_dir)
    check_master(master)
    url = database_url(settings)
    check_database(url, settings.database.connect_timeout)

    spark = build_session(master, conf=spark_conf)
    results: list[ExportResult] = []
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn())
    try:
        with Progress(*columns, console=progress_console, transient=True) as bar:
            tasks = {job.name: bar.add_task(f"export {job.name}", total=None) for job in selected}

            def report(name: str, done: int, total: int) -> None:
                bar.update(tasks[name], completed=done, total=total)

            runner = ExportRunner(spark, plugins, url, root, progress=report)
            try:
                for job in selected:
                    results.append(runner.run(job, full=full))
                    bar.update(tasks[job.name], completed=1, total=1)
            finally:
                if results:
                    console.print(summary(results))
    finally:
        spark.stop()
    return results


def summary(results: Sequence[ExportResult]) -> Table:
    table = Table(title="factstream export")
    for col in ("job", "stream", "range", "rows", "seconds", "status", "output"):
        table.add_column(col, justify="right" if col in ("rows", "seconds") else "left")
    for r in results:
        span = f"({r.start}, {r.upto}]" if r.upto > r.start else f"up to {r.upto}"
        table.add_row(r.job, r.stream, span, f"{r.rows:,}", f"{r.seconds:.1f}", r.status, r.output)
    return table
