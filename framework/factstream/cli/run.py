"""``factstream run``: one instance, until Ctrl-C or SIGTERM (the work is :mod:`factstream.host`'s)."""

from __future__ import annotations

import logging
from typing import Annotated

import typer

from factstream import logs
from factstream.cli import session
from factstream.cli.log_setup import CHATTY_LOGGERS, setup_logging
from factstream.cli.session import INTERRUPTED
from factstream.errors import FactstreamError


def run_command(
    instance: Annotated[
        str | None, typer.Option("--instance", "-i", help="This process's instance name (default: instance_name).")
    ] = None,
    http_port: Annotated[
        int | None,
        typer.Option(
            "--http-port",
            min=0,
            max=65535,
            help="Serve the HTTP API on this port (default: the instance's http_port in instance_map; 0: no HTTP API).",
        ),
    ] = None,
    log_format: Annotated[
        logs.LogFormat | None,
        typer.Option(
            "--log-format",
            help="Log lines as text (key=value fields) or json (one object per line); default: logging.format.",
        ),
    ] = None,
) -> None:
    """Run one instance: streams, replication, plugins and the HTTP API, until Ctrl-C or SIGTERM.

    It logs its start, its readiness (instance NAME started), replication links and its stop at INFO
    level; -v adds the libraries' own INFO lines.

    Exit codes: 0 when stopped by SIGTERM, 130 by Ctrl-C (SIGINT), 2 when the start fails (the error
    in one paragraph, after everything it had opened is closed).
    """
    import asyncio
    import signal

    from factstream.host.app import Host

    settings = session.state.settings
    if instance is not None:
        if settings.instance_map and instance not in settings.instance_map:
            raise FactstreamError(
                f"instance {instance!r} is not in instance_map (known: {', '.join(settings.instance_map)})"
            )
        settings = settings.model_copy(update={"instance_name": instance})
    if http_port is not None:
        settings = settings.model_copy(update={"http": settings.http.model_copy(update={"port": http_port})})
    _setup_run_logging(log_format or settings.logging.format)
    host = Host(settings, session.state.plugins)
    asyncio.run(host.run_until_stopped())
    if host.stop_signal is signal.SIGINT:
        raise typer.Exit(INTERRUPTED)


def _setup_run_logging(log_format: logs.LogFormat) -> None:
    """A running instance's log: factstream's INFO lines (its lifecycle, its links) always; the
    libraries' INFO lines only with ``-v``."""
    state = session.state
    setup_logging(logging.INFO if state.verbose else logging.WARNING, log_format)
    logging.getLogger("factstream").setLevel(logging.INFO)
    if not state.verbose:
        for name in CHATTY_LOGGERS:
            logging.getLogger(name).setLevel(logging.WARNING)
