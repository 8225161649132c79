"""What the plugins registered, validated, with the name of the plugin behind every entry.

The registry is filled by :class:`factstream.plugin.manager.PluginHost` calling each plugin's registration
hooks with a ``register`` callable bound to that plugin, so every error can name the plugin (and, for a
duplicate, both plugins). :meth:`Registry.finish` then checks references between specs that may come
from different plugins.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from typing import Any, Generic, TypeVar

from factstream.errors import PluginError
from factstream.plugin.commands import CommandHandlerSpec
from factstream.plugin.specs import (
    CacheSpec,
    CommandSpec,
    ExportJobSpec,
    InvalidationSpec,
    MigrationSpec,
    RouteSpec,
    SettingsSpec,
)
from factstream.plugin.streams import RowsHandlerSpec, StreamSpec

T = TypeVar("T")


@dataclass(frozen=True)
class Registered(Generic[T]):
    """A spec and the plugin that registered it."""

    plugin: str
    spec: T


@dataclass
class _Table(Generic[T]):
    """Specs of one kind keyed by a unique name; a second registration of a name is an error."""

    kind: str
    key: Callable[[T], str]
    entries: dict[str, Registered[T]] = field(default_factory=dict)

    def add(self, plugin: str, spec: T) -> None:
        name = self.key(spec)
        existing = self.entries.get(name)
        if existing is not None:
            who = (
                f"plugin {plugin!r} registered it twice"
                if existing.plugin == plugin
                else "registered by both plugins {!r} and {!r}".format(*sorted((existing.plugin, plugin)))
            )
            raise PluginError(f"duplicate {self.kind} {name!r}: {who}")
        self.entries[name] = Registered(plugin, spec)

    def __iter__(self) -> Iterator[Registered[T]]:
        return iter(self.entries.values())

    def __contains__(self, name: object) -> bool:
        return name in self.entries

    def __len__(self) -> int:
        return len(self.entries)

    def get(self, name: str) -> T:
        return self.entries[name].spec

    def owner(self, name: str) -> str:
        return self.entries[name].plugin

    def names(self) -> list[str]:
        return list(self.entries)

    def by_plugin(self, plugin: str) -> list[T]:
        return [r.spec for r in self.entries.values() if r.plugin == plugin]


class Registry:
    """All specs registered by the loaded plugins, one table per kind."""

    def __init__(self) -> None:
        self.streams: _Table[StreamSpec[Any]] = _Table("stream", lambda s: s.name)
        self.caches: _Table[CacheSpec] = _Table("cache", lambda s: s.name)
        self.invalidations: list[Registered[InvalidationSpec]] = []
        #: In registration order: the order in which the reader pipeline calls the handlers.
        self.rows_handlers: list[Registered[RowsHandlerSpec[Any]]] = []
        self.migrations: _Table[MigrationSpec] = _Table("migration branch", lambda s: "")
        self.export_jobs: _Table[ExportJobSpec] = _Table("export job", lambda s: s.name)
        self.routes: _Table[RouteSpec] = _Table("route", lambda s: ",".join(s.methods) + " " + s.path)
        self.commands: _Table[CommandSpec] = _Table("command", lambda s: s.name)
        #: Replication commands the plugins handle, by wire name (one plugin each).
        self.command_handlers: _Table[CommandHandlerSpec[Any]] = _Table("handler of command", lambda s: s.name)
        #: Keyed by plugin name: the ``plugins.<name>`` section each plugin's model validates.
        self.settings: _Table[SettingsSpec] = _Table("settings", lambda s: "")
        self._finished = False

    # -- registration ------------------------------------------------------------------------------

    def _open(self, plugin: str, spec: object) -> None:
        if self._finished:
            raise PluginError(f"plugin {plugin!r} tried to register {type(spec).__name__} after start-up")

    def add_stream(self, plugin: str, spec: StreamSpec[Any]) -> None:
        """Record ``spec`` for ``plugin``; each ``add_*`` raises :class:`PluginError` naming the plugin(s)."""
        self._open(plugin, spec)
        self.streams.add(plugin, spec)

    def add_rows_handler(self, plugin: str, spec: RowsHandlerSpec[Any]) -> None:
        self._open(plugin, spec)
        self.rows_handlers.append(Registered(plugin, spec))

    def add_cache(self, plugin: str, spec: CacheSpec) -> None:
        self._open(plugin, spec)
        self.caches.add(plugin, spec)

    def add_invalidation(self, plugin: str, spec: InvalidationSpec) -> None:
        self._open(plugin, spec)
        self.invalidations.append(Registered(plugin, spec))

    def add_migrations(self, plugin: str, spec: MigrationSpec) -> None:
        self._open(plugin, spec)
        if plugin in self.migrations:
            raise PluginError(f"plugin {plugin!r} registered more than one migrations directory")
        self.migrations.entries[plugin] = Registered(plugin, spec)

    def add_export_job(self, plugin: str, spec: ExportJobSpec) -> None:
        self._open(plugin, spec)
        self.export_jobs.add(plugin, spec)

    def add_route(self, plugin: str, spec: RouteSpec) -> None:
        self._open(plugin, spec)
        for method in spec.methods:
            # One entry per method, keeping the access level the whole spec resolved to.
            self.routes.add(plugin, replace(spec, methods=(method,)))

    def add_command(self, plugin: str, spec: CommandSpec) -> None:
        self._open(plugin, spec)
        self.commands.add(plugin, spec)

    def add_command_handler(self, plugin: str, spec: CommandHandlerSpec[Any]) -> None:
        self._open(plugin, spec)
        self.command_handlers.add(plugin, spec)

    def add_settings(self, plugin: str, spec: SettingsSpec) -> None:
        self._open(plugin, spec)
        if plugin in self.settings:
            raise PluginError(f"plugin {plugin!r} registered settings more than once")
        if any(r.spec.model is spec.model for r in self.settings):
            raise PluginError(f"plugin {plugin!r} registered settings model {spec.model.__name__}, already registered")
        self.settings.entries[plugin] = Registered(plugin, spec)

    def handlers_of(self, stream: str) -> list[Registered[RowsHandlerSpec[Any]]]:
        """The rows handlers of ``stream``, in registration order."""
        return [r for r in self.rows_handlers if r.spec.stream.name == stream]

    def finish(self) -> None:
        """Check references across plugins; after this nothing more can be registered."""
        problems: list[str] = []
        sequences: dict[str, str] = {}
        sync_keys: dict[str, str] = {}
        for reg in self.streams:
            s = reg.spec
            other = s.name if s.kept else sequences.setdefault(s.sequence, s.name)
            if other != s.name:
                problems.append(
                    f"streams {other!r} (plugin {self.streams.owner(other)!r}) and {s.name!r} "
                    f"(plugin {reg.plugin!r}) both use sequence {s.sequence!r}"
                )
            if s.sync_key is not None:
                other = sync_keys.setdefault(s.sync_key, s.name)
                if other != s.name:
                    first, second = sorted((other, s.name))
                    problems.append(
                        f"sync key {s.sync_key!r} is claimed by streams {first!r} (plugin "
                        f"{self.streams.owner(first)!r}) and {second!r} (plugin {self.streams.owner(second)!r})"
                    )
        for inv in self.invalidations:
            if inv.spec.stream not in self.streams:
                problems.append(f"plugin {inv.plugin!r} declares an invalidation on unknown stream {inv.spec.stream!r}")
            if inv.spec.cache not in self.caches:
                problems.append(f"plugin {inv.plugin!r} declares an invalidation of unknown cache {inv.spec.cache!r}")
        for handler in self.rows_handlers:
            stream = handler.spec.stream
            if stream.name in self.streams and self.streams.get(stream.name).row_type is not stream.row_type:
                registered = self.streams.get(stream.name).row_type
                problems.append(
                    f"plugin {handler.plugin!r} handles rows of stream {stream.name!r} as "
                    f"{stream.row_type.__name__}, but plugin {self.streams.owner(stream.name)!r} registered it "
                    f"with row type {registered.__name__}"
                )
        for handled in self.command_handlers:
            command = handled.spec
            if command.stream not in self.streams:
                problems.append(
                    f"plugin {handled.plugin!r} handles {command.name} on the writers of unknown stream "
                    f"{command.stream!r}"
                )
        for job in self.export_jobs:
            if job.spec.stream not in self.streams:
                problems.append(
                    f"plugin {job.plugin!r}: export job {job.spec.name!r} reads unknown stream {job.spec.stream!r}"
                )
            elif self.streams.get(job.spec.stream).kept:
                problems.append(
                    f"plugin {job.plugin!r}: export job {job.spec.name!r} reads stream {job.spec.stream!r}, whose "
                    "writer keeps its facts (kept=True): there is no table to export"
                )
        if problems:
            raise PluginError("invalid plugin registrations:\n  - " + "\n  - ".join(problems))
        self._finished = True

    def finish_commands(self, builtin: frozenset[str]) -> None:
        """Reject plugin CLI commands whose names clash with the built-in ones."""
        clashes = [c for c in self.commands if c.spec.name in builtin]
        if clashes:
            raise PluginError(
                "; ".join(f"plugin {c.plugin!r} registers command {c.spec.name!r}, which is built in" for c in clashes)
            )
