"""The ``factstream`` command.

Built-in commands live here; plugins add theirs through ``register_commands``. Every
:class:`~factstream.errors.FactstreamError` is shown as one paragraph on stderr with exit code 2; an
unexpected exception is reported in one line (``FACTSTREAM_DEBUG=1`` shows the traceback).
"""

from __future__ import annotations

import logging
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.logging import RichHandler
from rich.table import Table

from factstream.config import Settings, load_config
from factstream.errors import FactstreamError, PluginError
from factstream.plugin.manager import PluginHost, load_plugins

#: The exit code of an interrupted command (Ctrl-C), after one line on stderr: ``interrupted``.
INTERRUPTED = 130

BUILTIN_COMMANDS = frozenset({"plugins", "migrate", "demo", "run", "export", "new-stream"})

out = Console()
err = Console(stderr=True)


@dataclass
class State:
    """Per-invocation state: the config path given on the command line, loaded lazily."""

    config_path: Path | None = None
    plugin_error: PluginError | None = None
    _settings: Settings | None = None
    _plugins: PluginHost | None = field(default=None, repr=False)

    @property
    def settings(self) -> Settings:
        if self._settings is None:
            self._settings = load_config(self.config_path)
        return self._settings

    @property
    def plugins(self) -> PluginHost:
        if self.plugin_error is not None:
            raise self.plugin_error
        if self._plugins is None:
            plugins = load_plugins()
            plugins.registry.finish_commands(BUILTIN_COMMANDS)
            self._plugins = plugins
        return self._plugins


state = State()

app = typer.Typer(
    name="factstream",
    help="Streams of facts in PostgreSQL, replicated between processes. See docs/ for the guides.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode="rich",
)


@app.callback()
def _root(
    config: Annotated[
        Path | None,
        typer.Option("--config", "-c", help="YAML config file (default: $FACTSTREAM_CONFIG or ./factstream.yaml)."),
    ] = None,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Log what happens (INFO level).")] = False,
) -> None:
    state.config_path = config
    _setup_logging(logging.INFO if verbose else logging.WARNING)
    state.settings  # noqa: B018 - a bad config file is an error for every command


#: The name of the handler this module installs on the root logger (so it is installed once).
LOG_HANDLER_NAME = "factstream.cli"
#: A log record on stderr when stderr is not a terminal (a file, a pipe, journald). One line per
#: record, never wrapped, and a traceback follows as Python prints it, so that a log file can be
#: searched line by line and a traceback pasted back intact.
PLAIN_LOG_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


def _log_handler(*, show_level: bool = True) -> logging.Handler:
    """A stderr handler: rich on a terminal, plain unwrapped lines otherwise.

    Rich lays a record out in columns and wraps it to the console's width, which is 80 (or
    ``$COLUMNS``) when stderr is not a terminal: in a log file that split long lines and tracebacks.
    So rich is used only when a person is looking at the output.
    """
    if err.is_terminal:
        return RichHandler(console=err, show_time=False, show_path=False, show_level=show_level)
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(PLAIN_LOG_FORMAT if show_level else "%(message)s"))
    return handler


def _setup_logging(level: int) -> None:
    root = logging.getLogger()
    if not any(h.name == LOG_HANDLER_NAME for h in root.handlers):
        handler = _log_handler()
        handler.name = LOG_HANDLER_NAME
        root.addHandler(handler)
    root.setLevel(level)
    if os.environ.get("FACTSTREAM_TRACE_HOOKS"):
        logging.getLogger("factstream.hooks").setLevel(logging.INFO)


# -- plugins -----------------------------------------------------------------------------------------


@app.command("plugins")
def plugins_command() -> None:
    """List the loaded plugins: version, streams, migration branch.

    FACTSTREAM_LOAD_PLUGINS=a,b loads only those; FACTSTREAM_BLOCK_PLUGINS=a hides one.
    """
    host = state.plugins
    registry = host.registry
    table = Table(title="factstream plugins")
    for col in ("plugin", "version", "module", "streams", "migration branch"):
        table.add_column(col)
    for name, info in host.plugins.items():
        what = host.registered_by(name)
        branch = name if name in registry.migrations else "-"
        table.add_row(
            name + (" (core)" if info.builtin else ""),
            info.version or "-",
            info.module,
            ", ".join(what["streams"]) or "-",
            branch,
        )
    out.print(table)


# -- migrate -----------------------------------------------------------------------------------------

migrate_app = typer.Typer(help="Database migrations: the core branch and one branch per plugin.")
app.add_typer(migrate_app, name="migrate")


def _migrator() -> Any:
    from factstream.db.engine import check_database, database_url
    from factstream.migrate import Migrator

    settings = state.settings
    url = database_url(settings)
    check_database(url, settings.database.connect_timeout)
    return Migrator(url, state.plugins)


def _alembic_progress() -> None:
    logging.getLogger("alembic.runtime.migration").setLevel(logging.INFO)
    logging.getLogger("alembic").addHandler(_log_handler(show_level=False))
    logging.getLogger("alembic").propagate = False


@migrate_app.callback(invoke_without_command=True)
def migrate_command(
    ctx: typer.Context,
    plugin: Annotated[
        str | None, typer.Option("--plugin", "-p", help="Only this plugin's branch (default: every branch).")
    ] = None,
) -> None:
    """Upgrade every migration branch to its head (or only --plugin NAME)."""
    if ctx.invoked_subcommand is not None:
        ctx.obj = plugin
        return
    _alembic_progress()
    migrator = _migrator()
    try:
        migrator.upgrade(plugin)
        _print_status(migrator.status())
    finally:
        migrator.close()


@migrate_app.command("status")
def migrate_status() -> None:
    """Show each branch: the revision the database is at and the head the code has."""
    migrator = _migrator()
    try:
        _print_status(migrator.status())
    finally:
        migrator.close()


@migrate_app.command("down")
def migrate_down(
    ctx: typer.Context,
    plugin: Annotated[str | None, typer.Option("--plugin", "-p", help="The plugin whose branch to remove.")] = None,
) -> None:
    """Downgrade one plugin's branch to its base (drops what its revisions created)."""
    plugin = plugin or ctx.obj
    if not plugin:
        raise FactstreamError("`factstream migrate down` needs --plugin NAME")
    _alembic_progress()
    migrator = _migrator()
    try:
        migrator.downgrade_to_base(plugin)
        _print_status(migrator.status())
    finally:
        migrator.close()


@migrate_app.command("new")
def migrate_new(
    ctx: typer.Context,
    message: Annotated[str, typer.Option("--message", "-m", help="What the revision does.")],
    plugin: Annotated[str | None, typer.Option("--plugin", "-p", help="The plugin whose branch gets it.")] = None,
) -> None:
    """Create an empty revision at the head of a plugin's branch (starting the branch if needed)."""
    plugin = plugin or ctx.obj
    if not plugin:
        raise FactstreamError("`factstream migrate new` needs --plugin NAME")
    from factstream.migrate import Migrator

    # Writing a revision file needs no database.
    migrator = Migrator("postgresql://unused/unused", state.plugins)
    path = migrator.new_revision(plugin, message)
    out.print(f"created {path}")


@migrate_app.command("detach")
def migrate_detach(name: Annotated[str, typer.Argument(help="The uninstalled plugin's name.")]) -> None:
    """Forget the migrations of a plugin that is no longer installed (its tables are kept)."""
    migrator = _migrator()
    try:
        rid = migrator.detach(name)
        out.print(f"detached plugin {name!r} (was at revision {rid}); its tables were left in place")
    finally:
        migrator.close()


def _print_status(rows: list[Any]) -> None:
    table = Table(title="migration branches")
    for col in ("branch", "current", "head", "state"):
        table.add_column(col)
    for row in rows:
        if not row.installed:
            what = "[red]plugin not installed[/red]"
        elif row.up_to_date:
            what = "[green]up to date[/green]"
        else:
            what = "[yellow]needs upgrade[/yellow]"
        table.add_row(row.branch, row.current or "-", row.head or "-", what)
    out.print(table)


# -- run ---------------------------------------------------------------------------------------------


@app.command("run")
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
) -> None:
    """Run one instance: streams, replication, plugins and the HTTP API, until Ctrl-C or SIGTERM.

    Exit codes: 0 when stopped by SIGTERM, 130 by Ctrl-C (SIGINT), 2 when the start fails (the error
    in one paragraph, after everything it had opened is closed).
    """
    import asyncio
    import signal

    from factstream.host.app import Host

    settings = state.settings
    if instance is not None:
        if settings.instance_map and instance not in settings.instance_map:
            raise FactstreamError(
                f"instance {instance!r} is not in instance_map (known: {', '.join(settings.instance_map)})"
            )
        settings = settings.model_copy(update={"instance_name": instance})
    if http_port is not None:
        settings = settings.model_copy(update={"http": settings.http.model_copy(update={"port": http_port})})
    host = Host(settings, state.plugins)
    endpoint = settings.http_endpoint()
    serving = f", HTTP API on http://{endpoint[0]}:{endpoint[1]}" if endpoint else ", no HTTP API"
    err.print(f"factstream instance [bold]{settings.instance_name}[/bold] starting{serving}", highlight=False)
    asyncio.run(host.run_until_stopped())
    if host.stop_signal is signal.SIGINT:
        raise typer.Exit(INTERRUPTED)


# -- demo --------------------------------------------------------------------------------------------


@app.command("demo")
def demo_command() -> None:
    """Run the demo on the embedded defaults: database, migrations, plugins and stream positions."""
    from factstream.demo import run_demo

    run_demo(state, out)


# -- export ------------------------------------------------------------------------------------------


@app.command("export")
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
    """
    from factstream.export.command import run_export

    run_export(state, out, err, jobs or [], all_jobs=all_jobs, master=master, output=output, full=full, conf=conf or [])


# -- new-stream --------------------------------------------------------------------------------------


@app.command("new-stream")
def new_stream_command(
    name: Annotated[str, typer.Argument(help="The stream's name, also the plugin's: lower-case letters, digits, '_'.")],
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
    new_stream(choices, state.plugins, out)


# -- entry point -------------------------------------------------------------------------------------


def _add_plugin_commands() -> None:
    try:
        host = state.plugins
        commands = list(host.registry.commands)
    except PluginError as exc:
        state.plugin_error = exc
        return
    for reg in commands:
        spec = reg.spec
        if isinstance(spec.app, typer.Typer):
            app.add_typer(spec.app, name=spec.name, help=spec.help or None)
        else:
            app.command(spec.name, help=spec.help or None)(spec.app)


def main(argv: list[str] | None = None) -> None:
    """Console-script entry point."""
    debug = os.environ.get("FACTSTREAM_DEBUG", "").lower() in {"1", "true", "yes"}
    try:
        if os.environ.get("FACTSTREAM_TRACE_HOOKS"):
            _setup_logging(logging.WARNING)
        _add_plugin_commands()
        app(args=argv, prog_name="factstream")
    except FactstreamError as exc:
        err.print(f"[bold red]error:[/bold red] {exc}", highlight=False, soft_wrap=True)
        sys.exit(exc.exit_code)
    except SystemExit as exc:
        if exc.code == INTERRUPTED:  # typer turns a command's KeyboardInterrupt into Exit(130), silently
            err.print("interrupted")
        raise
    except KeyboardInterrupt:
        err.print("interrupted")
        sys.exit(INTERRUPTED)
    except Exception as exc:
        if debug:
            raise
        err.print(
            f"[bold red]internal error:[/bold red] {type(exc).__name__}: {exc}\n"
            "This is a bug in factstream or a plugin; rerun with FACTSTREAM_DEBUG=1 for the traceback.",
            highlight=False,
        )
        sys.exit(1)
