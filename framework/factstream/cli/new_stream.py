"""``factstream new-stream``: scaffold a stream plugin (the work is :mod:`factstream.new_stream`'s)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from factstream.cli import session
from factstream.cli.session import out


def new_stream_command(
    name: Annotated[
        str,
        typer.Argument(
            help="The stream's name, also the plugin's: lower-case letters, digits, '_', at most 49 characters."
        ),
    ],
    directory: Annotated[
        Path | None,
        typer.Argument(
            help="Where to write the project (missing or empty; default ./factstream-<name>).", show_default=False
        ),
    ] = None,
    description: Annotated[
        str | None, typer.Option("--description", help="One line saying what the stream holds.", show_default=False)
    ] = None,
    writers: Annotated[
        str | None,
        typer.Option(
            "--writers", help="Instances that write the stream, comma-separated (default: main).", show_default=False
        ),
    ] = None,
    sync: Annotated[
        bool | None,
        typer.Option(
            "--sync-key/--no-sync", help="Show each user their rows in /sync (default: on).", show_default=False
        ),
    ] = None,
    export: Annotated[
        bool | None,
        typer.Option(
            "--export/--no-export", help="Add a Spark export job <name>_all (default: on).", show_default=False
        ),
    ] = None,
    workspace: Annotated[
        bool,
        typer.Option(
            "--workspace", help="Write it to plugins/<name>/ of the factstream checkout here, in its uv workspace."
        ),
    ] = False,
) -> None:
    """Scaffold a stream plugin: row type, table migration, cached read, routes, sync, export job, README and tests.

    Missing options are asked for when stdin is a terminal; otherwise the defaults apply. Refuses an
    invalid or installed name and a non-empty directory, writing nothing. See docs/tutorial.md.
    """
    from factstream.new_stream import Choices, new_stream

    choices = Choices(name, directory, description, writers, sync, export, workspace)
    new_stream(choices, session.state.plugins, out)
