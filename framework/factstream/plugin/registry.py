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
from factstream.plugin.specs import (
    CacheSpec,
    CommandSpec,
    ExportJobSpec,
    InvalidationSpec,
    MigrationSpec,
    RouteSpec,
    SettingsSpec,
)
from factstream.plugin.streams import StreamSpec

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
        self.streams: _Table[StreamSpec] = _Table("stream", lambda s: s.name)
        self.caches: _Table[CacheSpec] = _Table("cache", lambda s: s.name)
        self.invalidations: list[Registered[InvalidationSpec]] = []
        self.migrations: _Table[MigrationSpec] = _Table("migration branch", lambda s: "")
        self.export_jobs: _Table[ExportJobSpec] = _Table("export job", lambda s: s.name)
        self.routes: _Table[RouteSpec] = _Table("route", lambda s: ",".join(s.methods) + " " + s.path)
        self.commands: _Table[CommandSpec] = _Table("command", lambda s: s.name)
        #: Keyed by plugin name: the ``plugins.<name>`` section each plugin's model validates.
        self.settings: _Table[SettingsSpec] = _Table("settings", lambda s: "")
        self._finished = False

    # -- registration ------------------------------------------------------------------------------

    def add(self, plugin: str, spec: Any) -> None:
        """Record ``spec`` for ``plugin``; raises :class:`PluginError` naming the plugin(s)."""
        if self._finished:
            raise PluginError(f"plugin {plugin!r} tried to register {type(spec).__name__} after start-up")
        if isinstance(spec, StreamSpec):
            self.streams.add(plugin, spec)
        elif isinstance(spec, CacheSpec):
            self.caches.add(plugin, spec)
        elif isinstance(spec, InvalidationSpec):
            self.invalidations.append(Registered(plugin, spec))
        elif isinstance(spec, MigrationSpec):
            if plugin in self.migrations:
                raise PluginError(f"plugin {plugin!r} registered more than one migrations directory")
            self.migrations.entries[plugin] = Registered(plugin, spec)
        elif isinstance(spec, ExportJobSpec):
            self.export_jobs.add(plugin, spec)
        elif isinstance(spec, RouteSpec):
            for method in spec.methods:
                # One entry per method, keeping the access level the whole spec resolved to.
                self.routes.add(plugin, replace(spec, methods=(method,)))
        elif isinstance(spec, CommandSpec):
            self.commands.add(plugin, spec)
        elif isinstance(spec, SettingsSpec):
            if plugin in self.settings:
                raise PluginError(f"plugin {plugin!r} registered settings more than once")
            if any(r.spec.model is spec.model for r in self.settings):
                raise PluginError(
                    f"plugin {plugin!r} registered settings model {spec.model.__name__}, already registered"
                )
            self.settings.entries[plugin] = Registered(plugin, spec)
        else:
            raise PluginError(f"plugin {plugin!r} registered {spec!r}, which is not a factstream spec")

    def finish(self) -> None:
        """Check references across plugins; after this nothing more can be registered."""
        problems: list[str] = []
        sequences: dict[str, str] = {}
        sync_keys: dict[str, str] = {}
        for reg in self.streams:
            s = reg.spec
            other = sequences.setdefault(s.sequence, s.name)
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
        for job in self.export_jobs:
            if job.spec.stream not in self.streams:
                problems.append(
                    f"plugin {job.plugin!r}: export job {job.spec.name!r} reads unknown stream {job.spec.stream!r}"
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
