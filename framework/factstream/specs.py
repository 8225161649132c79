"""Frozen, typed specs that plugins hand to the ``register`` callables of the registration hooks.

Each spec validates itself on construction (``__post_init__``), so a malformed spec fails inside the
plugin's hook, where :class:`factstream.plugins.PluginHost` can name the plugin. Cross-references
(an invalidation naming a cache, an export job naming a stream) are checked once every plugin has
registered, in :meth:`factstream.registry.Registry.finish`.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

#: Names of streams, caches, jobs, commands and sync keys: lower-case identifiers, usable as SQL and
#: alembic branch labels without quoting.
NAME_RE = re.compile(r"^[a-z][a-z0-9_]{0,62}$")


def check_name(kind: str, value: object) -> str:
    """Return ``value`` if it is a valid factstream name, else raise ``ValueError`` saying why."""
    if not isinstance(value, str) or not NAME_RE.match(value):
        raise ValueError(
            f"invalid {kind} name {value!r}: use 1-63 characters, lower-case letters, digits and '_', "
            "starting with a letter"
        )
    return value


@dataclass(frozen=True)
class CacheSpec:
    """A named cache a plugin reads through.

    ``key_arity`` is the number of components of each key (``("@alice:hs", "m.push_rules")`` has 2);
    invalidations with another arity are refused. ``depends_on_room_state`` marks caches that the
    ``cs_cache_fake`` fan-out must clear when a room's current state changes.
    """

    name: str
    max_size: int = 10_000
    key_arity: int = 1
    depends_on_room_state: bool = False

    def __post_init__(self) -> None:
        check_name("cache", self.name)
        if not isinstance(self.max_size, int) or self.max_size < 1:
            raise ValueError(f"cache {self.name!r}: max_size must be a positive integer, not {self.max_size!r}")
        if not isinstance(self.key_arity, int) or self.key_arity < 0:
            raise ValueError(f"cache {self.name!r}: key_arity must be >= 0, not {self.key_arity!r}")


@dataclass(frozen=True)
class InvalidationSpec:
    """When a row of ``stream`` is replicated, invalidate ``keys(row)`` in cache ``cache``.

    ``keys`` returns an iterable of key tuples; ``None`` as the whole result clears the cache.
    """

    stream: str
    cache: str
    keys: Callable[[Any], Iterable[tuple[Any, ...]] | None]

    def __post_init__(self) -> None:
        check_name("stream", self.stream)
        check_name("cache", self.cache)
        if not callable(self.keys):
            raise ValueError(f"invalidation of {self.cache!r} on {self.stream!r}: keys must be callable")


@dataclass(frozen=True)
class MigrationSpec:
    """Where a plugin's alembic revisions live (one directory = one branch)."""

    versions_dir: Path

    def __post_init__(self) -> None:
        path = Path(self.versions_dir)
        object.__setattr__(self, "versions_dir", path)
        if not path.is_dir():
            raise ValueError(f"migrations directory {str(path)!r} does not exist")

    @classmethod
    def from_package(cls, package: str) -> MigrationSpec:
        """The spec for the revisions kept in importable package ``package`` (a directory package)."""
        try:
            root = resources.files(package)
        except ModuleNotFoundError as exc:
            raise ValueError(f"migrations package {package!r} cannot be imported: {exc}") from exc
        return cls(Path(str(root)))


@dataclass(frozen=True)
class ExportJobSpec:
    """A Spark export job over one stream: rows go through ``transform`` and are written as ``format``."""

    name: str
    stream: str
    transform: Callable[[Any], Any] | None = None
    partition_by: tuple[str, ...] = ()
    format: str = "parquet"
    description: str = ""

    def __post_init__(self) -> None:
        check_name("export job", self.name)
        check_name("stream", self.stream)
        object.__setattr__(self, "partition_by", tuple(self.partition_by))
        if self.transform is not None and not callable(self.transform):
            raise ValueError(f"export job {self.name!r}: transform must be callable")


HTTP_METHODS = frozenset({"GET", "POST", "PUT", "DELETE", "PATCH"})


@dataclass(frozen=True)
class RouteSpec:
    """An HTTP route the host serves: ``endpoint`` is an async callable taking the request."""

    path: str
    endpoint: Callable[..., Any]
    methods: tuple[str, ...] = ("GET",)
    name: str = ""

    def __post_init__(self) -> None:
        if not isinstance(self.path, str) or not self.path.startswith("/"):
            raise ValueError(f"route path {self.path!r} must start with '/'")
        methods = tuple(m.upper() for m in self.methods)
        bad = [m for m in methods if m not in HTTP_METHODS]
        if bad or not methods:
            raise ValueError(f"route {self.path!r}: unsupported HTTP method(s) {bad or '(none)'}")
        object.__setattr__(self, "methods", methods)
        if not callable(self.endpoint):
            raise ValueError(f"route {self.path!r}: endpoint must be callable")


@dataclass(frozen=True)
class CommandSpec:
    """A CLI sub-command: ``app`` is a ``typer.Typer`` (a command group) or a plain function."""

    name: str
    app: Any
    help: str = ""

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not re.match(r"^[a-z][a-z0-9-]*$", self.name):
            raise ValueError(f"invalid command name {self.name!r}: lower-case letters, digits and '-'")
        if not callable(self.app):
            raise ValueError(f"command {self.name!r}: app must be a typer.Typer or a function")
