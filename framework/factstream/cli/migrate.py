"""``factstream migrate``: upgrade every branch, or show, add, undo or detach one (the work is
:mod:`factstream.migrate`'s)."""

from __future__ import annotations

import logging
import sys
from typing import Annotated, Any

import typer
from rich.table import Table

from factstream.cli import session
from factstream.cli.log_setup import log_handler
from factstream.cli.session import err, out
from factstream.errors import FactstreamError

migrate_app = typer.Typer(
    help="Database migrations: the core branch and one branch per plugin. `factstream migrate` alone upgrades "
    "every branch to its head (--plugin NAME: that branch only); the commands below show, add, undo or detach."
)


def _migrator(doing: str | None = None) -> Any:
    from factstream.migrate import Migrator

    return Migrator(session.database(doing), session.state.plugins)


#: What alembic logs that ``migrate`` shows without ``-v``: one line per revision applied or undone.
ALEMBIC_PROGRESS = ("Running upgrade", "Running downgrade")


def _alembic_progress() -> None:
    """Show alembic's progress lines on stderr; its set-up chatter ("Context impl PostgresqlImpl.",
    "Will assume transactional DDL.") only with ``-v``."""
    handler = log_handler(show_level=False)
    if not session.state.verbose:
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
    migrator = Migrator("postgresql://unused/unused", session.state.plugins)
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
