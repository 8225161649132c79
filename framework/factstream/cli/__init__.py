"""The ``factstream`` command.

Built-in commands live here; plugins add theirs through ``register_commands``. Every
:class:`~factstream.errors.FactstreamError` is shown as one paragraph on stderr with exit code 2; an
unexpected exception is reported in one line (``FACTSTREAM_DEBUG=1`` shows the traceback).
"""

from __future__ import annotations

import inspect
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

from factstream import logs
from factstream.config import Settings, load_config
from factstream.errors import FactstreamError, PluginError
from factstream.plugin.manager import PluginHost, load_plugins

#: The exit code of an interrupted command (Ctrl-C), after one line on stderr: ``interrupted``.
INTERRUPTED = 130

BUILTIN_COMMANDS = frozenset({"plugins", "migrate", "demo", "run", "export", "new-stream", "tokens"})

out = Console()
err = Console(stderr=True)


@dataclass
class State:
    """Per-invocation state: the config path given on the command line, loaded lazily."""

    config_path: Path | None = None
    verbose: bool = False
    plugin_error: PluginError | None = None
    #: What an interrupted command has to add to the one ``interrupted`` line (``interrupted: ...``).
    interrupted: str | None = None
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

#: The root's ``-c/--config`` spellings that may also follow the command.
CONFIG_FLAGS = ("-c", "--config")
#: The root's ``-v/--verbose``, which may also follow the command.
VERBOSE_FLAGS = ("-v", "--verbose")


def lift_config_option(args: list[str], command: Any = None) -> list[str]:
    """``args`` with every ``-c FILE``/``--config FILE``/``--config=FILE`` and ``-v``/``--verbose``
    moved to the front, in order (so the last file given wins), so that the root options may also
    follow the command (``factstream migrate -c x.yaml -v``). Nothing after ``--`` moves, and nothing
    moves for a command that has an option of these names of its own."""
    if command is not None and any(set(CONFIG_FLAGS + VERBOSE_FLAGS) & set(p.opts) for p in command.params):
        return args
    lifted: list[str] = []
    rest: list[str] = []
    i = 0
    while i < len(args):
        arg = args[i]
        if arg == "--":
            rest += args[i:]
            break
        if arg in CONFIG_FLAGS:
            lifted += args[i : i + 2]
            i += 2
            continue
        (lifted if arg.startswith("--config=") or arg in VERBOSE_FLAGS else rest).append(arg)
        i += 1
    return lifted + rest


class _RootGroup(typer.core.TyperGroup):
    """The root command: accepts ``-c/--config`` and ``-v`` after the command too
    (:func:`lift_config_option`), and gives every command's ``--help`` plain metavars
    (:func:`plain_metavars`)."""

    def parse_args(self, ctx: Any, args: list[str]) -> list[str]:
        plain_metavars(self, ctx)
        name = _command_name(args)
        command = self.get_command(ctx, name) if name else None
        return super().parse_args(ctx, lift_config_option(args, command))


#: typer's type labels (``<str>``, ``<list[int]>``, ``<int range>``) as the plain words click uses.
PLAIN_TYPES = {"str": "TEXT", "int": "INTEGER", "float": "FLOAT", "bool": "", "Path": "PATH", "path": "PATH"}


def plain_type(label: str) -> str:
    """``TEXT`` for typer's ``<str>`` or ``<list[str]>``, ``INTEGER`` for ``<int range>``, ``[a|b]`` for a
    choice, nothing for ``<bool>``; other types upper-cased."""
    label = label.strip("<>")
    if label.startswith("list[") and label.endswith("]"):
        label = label[5:-1]
    label = label.removesuffix(" range")
    if "|" in label:
        return f"[{label}]"
    return PLAIN_TYPES.get(label, label.upper())


def plain_metavars(command: Any, ctx: Any) -> None:
    """Show click's plain metavars (``TEXT``, ``INTEGER``; none for a flag) in the ``--help`` of
    ``command`` and its subcommands, where typer would show Python types (``<list[str]>``, ``<bool>``).
    An option gets a metavar; an argument keeps its name (or metavar) and only its type column changes."""
    for param in command.get_params(ctx):
        if isinstance(param, typer.core.TyperOption) and param.metavar is None:
            param.metavar = plain_type(param.display_type(ctx))
        elif isinstance(param, typer.core.TyperArgument):
            label = plain_type(param.display_type(ctx))
            setattr(param, "display_type_rich", lambda ctx, label=label: label)  # noqa: B010 - an instance's own
    for sub in getattr(command, "commands", {}).values():
        plain_metavars(sub, ctx)


def _command_name(args: list[str]) -> str | None:
    """The first argument that is not a root option or its value: the command's name."""
    i = 0
    while i < len(args):
        if args[i] == "--":
            return None
        if args[i] in CONFIG_FLAGS:
            i += 2
            continue
        if not args[i].startswith("-"):
            return args[i]
        i += 1
    return None


app = typer.Typer(
    name="factstream",
    cls=_RootGroup,
    help="Streams of facts in PostgreSQL, replicated between processes. The guides: docs/ in factstream's "
    "source repository (`./dev docs` there builds them into a site).",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    rich_markup_mode="rich",
)


@app.callback()
def _root(
    config: Annotated[
        Path | None,
        typer.Option(
            "--config",
            "-c",
            metavar="FILE",
            help="YAML config file (default: $FACTSTREAM_CONFIG or ./factstream.yaml); may also follow the command.",
        ),
    ] = None,
    verbose: Annotated[
        bool, typer.Option("--verbose", "-v", help="Log what happens (INFO level); may also follow the command.")
    ] = False,
) -> None:
    state.config_path = config
    state.verbose = verbose
    _setup_logging(logging.INFO if verbose else logging.WARNING)
    # A bad config file is an error for every command; a good one says how to write log lines.
    _setup_logging(logging.INFO if verbose else logging.WARNING, state.settings.logging.format)


#: The name of the handler this module installs on the root logger (so it is installed once).
LOG_HANDLER_NAME = "factstream.cli"
#: A log record on stderr when stderr is not a terminal (a file, a pipe, journald). One line per
#: record, never wrapped, and a traceback follows as Python prints it, so that a log file can be
#: searched line by line and a traceback pasted back intact. The record's fields follow the message.
PLAIN_LOG_FORMAT = logs.TEXT_FORMAT
#: Libraries whose INFO lines are set-up chatter, not what the instance does ("Context impl
#: PostgresqlImpl.", uvicorn's "Started server process"): shown from WARNING up unless ``-v``.
CHATTY_LOGGERS = ("alembic", "uvicorn")


def _log_handler(*, show_level: bool = True, log_format: logs.LogFormat = "text") -> logging.Handler:
    """A stderr handler: rich on a terminal, plain unwrapped lines otherwise, JSON lines when asked.

    Rich lays a record out in columns and wraps it to the console's width, which is 80 (or
    ``$COLUMNS``) when stderr is not a terminal: in a log file that split long lines and tracebacks.
    So rich is used only when a person is looking at the output, and never for JSON.
    """
    if err.is_terminal and log_format == "text":
        handler: logging.Handler = RichHandler(console=err, show_time=False, show_path=False, show_level=show_level)
        handler.setFormatter(logs.TextFormatter("%(message)s"))
        return handler
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logs.formatter(log_format, PLAIN_LOG_FORMAT if show_level else "%(message)s"))
    return handler


def _setup_logging(level: int, log_format: logs.LogFormat = "text") -> None:
    """Install (or replace) the root logger's stderr handler for ``log_format`` at ``level``."""
    root = logging.getLogger()
    for old in [h for h in root.handlers if h.name == LOG_HANDLER_NAME]:
        if getattr(old, "log_format", None) == log_format:
            break
        root.removeHandler(old)
    else:
        handler = _log_handler(log_format=log_format)
        handler.name = LOG_HANDLER_NAME
        handler.log_format = log_format  # type: ignore[attr-defined]
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
    # plugin and branch names are typed (FACTSTREAM_BLOCK_PLUGINS, migrate --plugin): never cut or wrapped;
    # the other columns fold where a terminal is narrow, and nothing is cut to an ellipsis
    names = [name + (" (core)" if info.builtin else "") for name, info in host.plugins.items()]
    table.add_column("plugin", no_wrap=True, min_width=max(map(len, ["plugin", *names])))
    table.add_column("version", overflow="fold")
    table.add_column("module", overflow="fold")
    table.add_column("streams", overflow="fold")
    table.add_column("migration branch", no_wrap=True, min_width=max(map(len, ["branch", *host.plugins])))
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

migrate_app = typer.Typer(
    help="Database migrations: the core branch and one branch per plugin. `factstream migrate` alone upgrades "
    "every branch to its head (--plugin NAME: that branch only); the commands below show, add, undo or detach."
)
app.add_typer(migrate_app, name="migrate")


def _database(doing: str | None = None) -> str:
    """The database's URL, once it answers; ``doing`` (e.g. "migrating") names it on stderr first."""
    from factstream.db.engine import check_database, database_url, describe_database

    settings = state.settings
    url = database_url(settings)
    if doing:
        err.print(f"{doing} {describe_database(settings, url)}", highlight=False, markup=False, soft_wrap=True)
    check_database(url, settings.database.connect_timeout)
    return url


def _migrator(doing: str | None = None) -> Any:
    from factstream.migrate import Migrator

    return Migrator(_database(doing), state.plugins)


#: What alembic logs that ``migrate`` shows without ``-v``: one line per revision applied or undone.
ALEMBIC_PROGRESS = ("Running upgrade", "Running downgrade")


def _alembic_progress() -> None:
    """Show alembic's progress lines on stderr; its set-up chatter ("Context impl PostgresqlImpl.",
    "Will assume transactional DDL.") only with ``-v``."""
    handler = _log_handler(show_level=False)
    if not state.verbose:
        handler.addFilter(lambda record: record.getMessage().startswith(ALEMBIC_PROGRESS))
    logging.getLogger("alembic.runtime.migration").setLevel(logging.INFO)
    logging.getLogger("alembic").addHandler(handler)
    logging.getLogger("alembic").propagate = False


@migrate_app.callback(invoke_without_command=True)
def migrate_command(
    ctx: typer.Context,
    plugin: Annotated[
        str | None, typer.Option("--plugin", "-p", help="Only this plugin's branch (default: every branch).")
    ] = None,
) -> None:
    """`factstream migrate` alone upgrades every migration branch to its head (--plugin NAME: that branch only).

    The commands below show where each branch is, add a revision, undo a plugin's branch or detach the
    branch of a plugin that is gone.
    """
    if ctx.invoked_subcommand is not None:
        ctx.obj = plugin
        return
    _alembic_progress()
    migrator = _migrator("migrating")
    try:
        migrator.upgrade(plugin)
        _print_status(migrator.status())
    finally:
        migrator.close()


@migrate_app.command("status")
def migrate_status() -> None:
    """Show each branch: the revision the database is at and the head the code has."""
    migrator = _migrator("status of")
    try:
        _print_status(migrator.status())
    finally:
        migrator.close()


@migrate_app.command("down")
def migrate_down(
    ctx: typer.Context,
    plugin: Annotated[str | None, typer.Option("--plugin", "-p", help="The plugin whose branch to remove.")] = None,
    yes: Annotated[
        bool, typer.Option("--yes", "-y", help="Do not ask before dropping (needed without a terminal).")
    ] = False,
) -> None:
    """Downgrade one plugin's branch to its base (drops what its revisions created).

    Asks first, naming the revisions it undoes; --yes skips the question.
    """
    plugin = plugin or ctx.obj
    if not plugin:
        raise FactstreamError("`factstream migrate down` needs --plugin NAME")
    _alembic_progress()
    migrator = _migrator("downgrading")
    try:
        applied = migrator.applied_revisions(plugin)
        if applied and not yes:
            _confirm_drop(plugin, applied)
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
    print(f"created {path}")


@migrate_app.command("detach")
def migrate_detach(name: Annotated[str, typer.Argument(help="The uninstalled plugin's name.")]) -> None:
    """Forget the migrations of a plugin that is no longer installed (its tables are kept)."""
    migrator = _migrator()
    try:
        rid = migrator.detach(name)
        out.print(f"detached plugin {name!r} (was at revision {rid}); its tables were left in place")
    finally:
        migrator.close()


def _confirm_drop(plugin: str, applied: list[Any]) -> None:
    """Ask before undoing ``applied`` (newest first); :class:`FactstreamError` if there is no one to ask."""
    undone = "; ".join(f"{rev.revision} ({rev.doc})" for rev in applied)
    what = (
        f"downgrade plugin {plugin!r} to its base: undo {undone}, dropping the tables and data these revisions "
        f"created (and anything of other plugins that depends on them)"
    )
    if not sys.stdin.isatty():
        raise FactstreamError(f"`factstream migrate down` would {what}; rerun with --yes to confirm without a terminal")
    if not typer.confirm(f"{what[0].upper()}{what[1:]}?", err=True):
        err.print("nothing was dropped")
        raise typer.Exit(1)


def _print_status(rows: list[Any]) -> None:
    table = Table(title="migration branches")
    for col in ("branch", "current", "head", "state"):
        table.add_column(col)
    for row in rows:
        colour = "red" if not row.installed else "green" if row.up_to_date else "yellow"
        table.add_row(row.branch, row.current or "-", row.head or "-", f"[{colour}]{row.state}[/{colour}]")
    out.print(table)
    from factstream.migrate import missing_plugin

    for row in rows:  # a branch whose plugin is gone: what it is and the ways out
        if not row.installed:
            out.print(f"{row.branch}: {missing_plugin(row)}.", highlight=False, markup=False, soft_wrap=True)


# -- tokens ------------------------------------------------------------------------------------------

tokens_app = typer.Typer(
    help="Bearer tokens of the HTTP API in the access_tokens table (stored as SHA-256 hashes).", no_args_is_help=True
)
app.add_typer(tokens_app, name="tokens")


def _token_store() -> Any:
    from factstream.tokens import TokenStore

    return TokenStore(_database())


def _token_line(info: Any) -> str:
    return f"{info.id} ({info.kind} token of {info.user}, created {info.created_at:%Y-%m-%d %H:%M:%S %Z})"


@tokens_app.command("create")
def tokens_create(
    user: Annotated[str, typer.Argument(help="The user requests with the token act as, e.g. @alice:example.org.")],
    write: Annotated[bool, typer.Option("--write", help="A writer token: may call write routes too.")] = False,
    token: Annotated[
        str | None,
        typer.Option(
            "--token", metavar="TEXT", help="Store this token instead of a new random one.", show_default=False
        ),
    ] = None,
) -> None:
    """Issue a token for USER and print it once on stdout (only its hash is stored).

    T=$(factstream tokens create @alice:example.org) keeps it in a shell variable.
    """
    if token is not None and token in state.settings.http.tokens:
        raise FactstreamError("that token is already in the config file (http.tokens); choose another")
    secret, info = _token_store().create(user, can_write=write, token=token)
    print(secret)
    err.print(
        f"created {_token_line(info)}; the token is shown only now and cannot be shown again",
        highlight=False,
        soft_wrap=True,
    )


@tokens_app.command("list")
def tokens_list(
    user: Annotated[
        str | None, typer.Option("--user", metavar="USER", help="Only this user's tokens.", show_default=False)
    ] = None,
) -> None:
    """List the table's tokens: id, user, kind and creation time; never the tokens themselves.

    Tokens in the config file (http.tokens) are not listed.
    """
    rows = _token_store().all(user)
    if not rows:
        err.print(f"no tokens{f' of {user}' if user else ''} in the access_tokens table", highlight=False)
        return
    table = Table(title="access tokens")
    for col in ("id", "user", "kind", "created"):
        table.add_column(col, no_wrap=True)
    for info in rows:
        table.add_row(info.id, info.user, info.kind, f"{info.created_at:%Y-%m-%d %H:%M:%S %Z}")
    out.print(table)


@tokens_app.command("revoke")
def tokens_revoke(
    token: Annotated[
        str | None,
        typer.Argument(
            metavar="ID|TOKEN", help="The token's id (from `tokens list`) or the token itself.", show_default=False
        ),
    ] = None,
    user: Annotated[
        str | None, typer.Option("--user", metavar="USER", help="Revoke every token of this user.", show_default=False)
    ] = None,
) -> None:
    """Revoke one token (by id or value) or all of a user's (--user). Hosts stop accepting it within
    http.token_cache_seconds."""
    if (token is None) == (user is None):
        raise FactstreamError("`factstream tokens revoke` needs a token id (or the token) or --user USER, not both")
    store = _token_store()
    revoked = [store.revoke(token)] if token is not None else store.revoke_user(user or "")
    if not revoked:
        raise FactstreamError(f"user {user} has no tokens in the access_tokens table")
    for info in revoked:
        print(f"revoked {_token_line(info)}")


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

    settings = state.settings
    if instance is not None:
        if settings.instance_map and instance not in settings.instance_map:
            raise FactstreamError(
                f"instance {instance!r} is not in instance_map (known: {', '.join(settings.instance_map)})"
            )
        settings = settings.model_copy(update={"instance_name": instance})
    if http_port is not None:
        settings = settings.model_copy(update={"http": settings.http.model_copy(update={"port": http_port})})
    _setup_run_logging(log_format or settings.logging.format)
    host = Host(settings, state.plugins)
    asyncio.run(host.run_until_stopped())
    if host.stop_signal is signal.SIGINT:
        raise typer.Exit(INTERRUPTED)


def _setup_run_logging(log_format: logs.LogFormat) -> None:
    """A running instance's log: factstream's INFO lines (its lifecycle, its links) always; the
    libraries' INFO lines only with ``-v``."""
    _setup_logging(logging.INFO if state.verbose else logging.WARNING, log_format)
    logging.getLogger("factstream").setLevel(logging.INFO)
    if not state.verbose:
        for name in CHATTY_LOGGERS:
            logging.getLogger(name).setLevel(logging.WARNING)


# -- demo --------------------------------------------------------------------------------------------


@app.command("demo")
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

    try:
        run_demo(state.settings.state_dir, state.plugins, out, keep_running=keep_running, export=export)
    except KeyboardInterrupt:
        state.interrupted = "the demo's processes are stopped"
        raise typer.Exit(INTERRUPTED) from None


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
    Each run is logged (export run begun, export run finished: job, outcome, rows, seconds, upto) and
    recorded in the database, where every running instance's /metrics reads it.
    """
    from factstream.export.command import run_export

    logging.getLogger("factstream.export.runs").setLevel(logging.INFO)
    run_export(state, out, err, jobs or [], all_jobs=all_jobs, master=master, output=output, full=full, conf=conf or [])


# -- new-stream --------------------------------------------------------------------------------------


@app.command("new-stream")
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


def reflow_help(typer_app: typer.Typer) -> None:
    """Give every command and group of ``typer_app`` (plugins' too) its help as paragraphs: Typer's rich
    help keeps a docstring's line breaks, which the terminal then wraps again, breaking sentences in the
    middle at 80 columns. Lines of a paragraph are joined; a blank line, and a line that starts a list
    item or is indented, start a new line. Idempotent."""
    for info in typer_app.registered_commands:
        text = info.help or inspect.getdoc(info.callback)
        if text:
            info.help = _paragraphs(text)
    for group in typer_app.registered_groups:
        sub = group.typer_instance
        if sub is None:
            continue
        if sub.info.help:
            sub.info.help = _paragraphs(str(sub.info.help))
        callback = sub.registered_callback
        if callback is not None and callback.callback is not None and not callback.help:
            doc = inspect.getdoc(callback.callback)
            callback.help = _paragraphs(doc) if doc else None
        reflow_help(sub)


def _paragraphs(text: str) -> str:
    out: list[str] = []
    for line in text.splitlines():
        stripped = line.strip()
        starts_own_line = not stripped or line[:1].isspace() or stripped[:2] in {"- ", "* "} or not out or not out[-1]
        if starts_own_line:
            out.append(line.rstrip())
        else:
            out[-1] = f"{out[-1]} {stripped}"
    return "\n".join(out)


def _say_interrupted() -> None:
    """The one line an interrupted command ends with, with what the command had to add."""
    err.print("interrupted" if state.interrupted is None else f"interrupted: {state.interrupted}", highlight=False)


def main(argv: list[str] | None = None) -> None:
    """Console-script entry point."""
    debug = os.environ.get("FACTSTREAM_DEBUG", "").lower() in {"1", "true", "yes"}
    try:
        if os.environ.get("FACTSTREAM_TRACE_HOOKS"):
            _setup_logging(logging.WARNING)
        _add_plugin_commands()
        reflow_help(app)
        app(args=argv, prog_name="factstream")
    except FactstreamError as exc:
        err.print(f"[bold red]error:[/bold red] {exc}", highlight=False, soft_wrap=True)
        sys.exit(exc.exit_code)
    except SystemExit as exc:
        if exc.code == INTERRUPTED:  # typer turns a command's KeyboardInterrupt into Exit(130), silently
            _say_interrupted()
        raise
    except KeyboardInterrupt:
        _say_interrupted()
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
