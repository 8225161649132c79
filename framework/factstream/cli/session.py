"""What every command of ``factstream`` shares: the two consoles, the invocation's :class:`State` and the
database its config names.

``out`` and ``err`` are made once and never replaced (a test changes their width in place), so a
module may import them by name. ``state`` is replaced for each invocation a test runs in-process
(assigning ``factstream.cli.state`` replaces this module's), so commands read it as ``session.state``
when they run and never keep it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from rich.console import Console

from factstream.config import Settings, load_config
from factstream.errors import PluginError
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


def database(doing: str | None = None) -> str:
    """The database's URL, once it answers; ``doing`` (e.g. "migrating") names it on stderr first."""
    from factstream.db.engine import check_database, database_url, describe_database

    settings = state.settings
    url = database_url(settings)
    if doing:
        err.print(f"{doing} {describe_database(settings, url)}", highlight=False, markup=False, soft_wrap=True)
    check_database(url, settings.database.connect_timeout)
    return url
