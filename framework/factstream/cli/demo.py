"""``factstream demo``: the main job on the embedded defaults (the work is :mod:`factstream.demo`'s)."""

from __future__ import annotations

from typing import Annotated

import typer

from factstream.cli import session
from factstream.cli.session import INTERRUPTED, out


def demo_command(
    keep_running: Annotated[
        bool,
        typer.Option(
            "--keep-running",
            help="Leave main and worker up after the story and print curl commands to try; Ctrl-C stops them.",
        ),
    ] = False,
    export: Annotated[
        bool, typer.Option("--export/--no-export", help="End with the Spark export of every stream to Parquet.")
    ] = True,
) -> None:
    """Run the main job on the embedded defaults: a main and a worker replicating over TCP, a story through the HTTP API shown live, a Spark export of every stream.

    It writes under STATE_DIR/demo/ (configuration, logs, exports/, summary.json) and remakes the database factstream_demo on the embedded PostgreSQL each run. Ctrl-C stops everything (exit 130).
    """  # noqa: E501 - one line per paragraph, so that --help wraps it to the terminal
    from factstream.demo import run_demo

    state = session.state
    try:
        run_demo(state.settings.state_dir, state.plugins, out, keep_running=keep_running, export=export)
    except KeyboardInterrupt:
        state.interrupted = "the demo's processes are stopped"
        raise typer.Exit(INTERRUPTED) from None
