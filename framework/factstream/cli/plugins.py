"""``factstream plugins``: the table of loaded plugins."""

from __future__ import annotations

from rich.table import Table

from factstream.cli import session
from factstream.cli.session import out


def plugins_command() -> None:
    """List the loaded plugins: version, streams, migration branch, the plugins each needs.

    FACTSTREAM_LOAD_PLUGINS=a,b loads only those; FACTSTREAM_BLOCK_PLUGINS=a hides one.
    """
    host = session.state.plugins
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
    table.add_column("needs", overflow="fold")
    needs = host.requirements
    for name, info in host.plugins.items():
        what = host.registered_by(name)
        branch = name if name in registry.migrations else "-"
        table.add_row(
            name + (" (core)" if info.builtin else ""),
            info.version or "-",
            info.module,
            ", ".join(what["streams"]) or "-",
            branch,
            ", ".join(spec.plugin for spec in needs.get(name, ())) or "-",
        )
    out.print(table)
