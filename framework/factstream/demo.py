"""``factstream demo``: the main job on the embedded defaults.

For now it shows the foundation end to end: it starts (or reuses) the database, upgrades every
migration branch, and prints the loaded plugins and every stream's persisted writer positions. Later
issues grow it into the multi-process demo.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Protocol

import sqlalchemy as sa
from rich.console import Console
from rich.table import Table

from factstream.db.engine import check_database, database_url, sync_url
from factstream.db.metadata import stream_positions
from factstream.migrate import Migrator

if TYPE_CHECKING:
    from factstream.config import Settings
    from factstream.plugin.manager import PluginHost


class DemoState(Protocol):
    """What the demo reads of the command line's state (``factstream.cli.State`` is one).

    Properties, so that each is still loaded lazily, when the demo first needs it; declared here so that
    the demo, which the CLI runs, does not import the CLI.
    """

    @property
    def settings(self) -> Settings: ...

    @property
    def plugins(self) -> PluginHost: ...


def run_demo(state: DemoState, out: Console) -> None:
    settings = state.settings
    with out.status("starting the database..."):
        url = database_url(settings)
        check_database(url, settings.database.connect_timeout)
    where = (
        "embedded PostgreSQL under " + str(settings.state_dir) if not settings.database.url else "configured database"
    )
    out.print(f"[green]database ready[/green] ({where})")

    host = state.plugins
    migrator = Migrator(url, host)
    try:
        with out.status("migrating every branch..."):
            migrator.upgrade()
        statuses = migrator.status()
    finally:
        migrator.close()
    out.print(
        f"[green]migrated[/green] {len(statuses)} branch(es): " + ", ".join(f"{s.branch}@{s.current}" for s in statuses)
    )

    plugins = Table(title="plugins")
    for col in ("plugin", "version", "streams"):
        plugins.add_column(col)
    for name, info in host.plugins.items():
        plugins.add_row(name, info.version or "-", ", ".join(host.registered_by(name)["streams"]) or "-")
    out.print(plugins)

    engine = sa.create_engine(sync_url(url), poolclass=sa.pool.NullPool)
    try:
        with engine.connect() as conn:
            rows = conn.execute(
                sa.select(stream_positions).order_by(stream_positions.c.stream_name, stream_positions.c.instance_name)
            ).all()
    finally:
        engine.dispose()
    positions = Table(title="stream positions (persisted, per writer)")
    for col in ("stream", "writer", "position"):
        positions.add_column(col)
    known = {(r.stream_name, r.instance_name): r.stream_id for r in rows}
    for reg in host.registry.streams:
        # Streams anyone may write show the instances that have written them (the rows below).
        for writer in settings.writers_for(reg.spec.name) if reg.spec.writers == "configured" else []:
            pos = known.pop((reg.spec.name, writer), None)
            positions.add_row(reg.spec.name, writer, "-" if pos is None else str(pos))
    for (stream, writer), pos in sorted(known.items()):
        positions.add_row(stream, writer, str(pos))
    if not positions.row_count:
        positions.add_row("(no streams registered)", "-", "-")
    out.print(positions)
