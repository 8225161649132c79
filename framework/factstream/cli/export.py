"""``factstream export``: plugins' export jobs, run with Spark (the work is :mod:`factstream.export`'s)."""

from __future__ import annotations

import logging
from typing import Annotated

import typer

from factstream.cli import session
from factstream.cli.session import err, out


def export_command(
    jobs: Annotated[
        list[str] | None,
        typer.Argument(help="Export job names (registered by plugins; see docs/export.md); none: list the jobs."),
    ] = None,
    all_jobs: Annotated[bool, typer.Option("--all", help="Run every registered export job.")] = False,
    master: Annotated[
        str,
        typer.Option("--master", help="Spark master: local[*] (default), local[N], spark://HOST:PORT, k8s://, yarn."),
    ] = "local[*]",
    output: Annotated[
        str | None,
        typer.Option("--output", help="Output root (a directory or URI that must exist); default <state_dir>/exports."),
    ] = None,
    full: Annotated[
        bool, typer.Option("--full", help="Start over: remove the job's output and export everything again.")
    ] = False,
    conf: Annotated[
        list[str] | None, typer.Option("--conf", help="Extra Spark setting KEY=VALUE (repeatable).")
    ] = None,
) -> None:
    """Export streams to Parquet with Spark: each job's facts from its checkpoint up to the stream's watermark.

    Output goes to OUTPUT/JOB/export_range=FROM-UPTO/, written to a staging directory and committed before
    the job's checkpoint moves, so an interrupted export rerun writes every fact exactly once. Without a job
    (and without --all), lists the jobs: stream, checkpoint, watermark and how many facts wait. Jobs with
    nothing new are answered without starting Spark. Ctrl-C or SIGTERM stops Spark, exit code 130.
    Each run is logged (export run begun, export run finished: job, outcome, rows, seconds, upto) and
    recorded in the database, where every running instance's /metrics reads it.
    """
    from factstream.export.command import run_export

    logging.getLogger("factstream.export.runs").setLevel(logging.INFO)
    run_export(
        session.state, out, err, jobs or [], all_jobs=all_jobs, master=master, output=output, full=full, conf=conf or []
    )
