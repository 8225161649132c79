"""Frozen, typed specs that plugins hand to the ``register`` callables of the registration hooks.

Each spec validates itself on construction (``__post_init__``), so a malformed spec fails inside the
plugin's hook, where :class:`factstream.plugin.manager.PluginHost` can name the plugin. Cross-references
(an invalidation naming a cache, an export job naming a stream) are checked once every plugin has
registered, in :meth:`factstream.plugin.registry.Registry.finish`.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from pydantic import BaseModel

from factstream.names import check_name

if TYPE_CHECKING:
    from starlette.requests import Request

    from factstream.plugin.api import HostApi

CURRENT_STATE_CACHE_NAME = "cs_cache_fake"
"""Cache names with a meaning of their own on the caches stream (the reference's "fake" caches):
``cs_cache_fake`` (a room's current state changed), ``ph_cache_fake`` (history purged) and
``dr_cache_fake`` (room deleted). No cache may be registered under them, and they cannot be
invalidated wholesale (a row with a null key)."""
SPECIAL_CACHE_NAMES = frozenset({CURRENT_STATE_CACHE_NAME, "ph_cache_fake", "dr_cache_fake"})

#: What a key of a cache that depends on a room's current state is made of (see ``CacheSpec``).
RoomStateKey = Literal["room", "member", "room_member", "all"]
_ROOM_STATE_ARITY: dict[str, int | None] = {"room": 1, "member": 1, "room_member": 2, "all": None}
_DEFAULT_ROOM_STATE_KEY: dict[int, RoomStateKey] = {0: "all", 1: "room", 2: "room_member"}

#: Types a key component may have. Keys travel as text on the caches stream; components declared
#: ``int`` are converted back on the reader.
KEY_COMPONENT_TYPES: tuple[type, ...] = (str, int)


@dataclass(frozen=True)
class CacheSpec:
    """A named cache a plugin reads through.

    ``key_arity`` is the number of components of each key (``("@alice:hs", "m.push_rules")`` has 2);
    invalidations with another arity are refused. ``key_types`` gives each component's type, ``str``
    or ``int`` (default: every component is a ``str``); a key component of another type is refused.

    ``depends_on_room_state`` marks caches that the ``cs_cache_fake`` fan-out must clear when a
    room's current state changes; ``room_state_key`` says which keys the fan-out invalidates:

    * ``"room"``: keys are ``(room_id,)``: the room's key, on every change of its state;
    * ``"member"``: keys are ``(user_id,)``: one key per member whose membership changed;
    * ``"room_member"``: keys are ``(room_id, user_id)``: one key per changed member;
    * ``"all"``: the whole cache is cleared (for keys that cannot be derived, e.g. pairs of users).

    When left out it follows from ``key_arity``: 1 is ``"room"``, 2 is ``"room_member"``, 0 is ``"all"``.
    """

    name: str
    max_size: int = 10_000
    key_arity: int = 1
    depends_on_room_state: bool = False
    room_state_key: RoomStateKey | None = None
    key_types: tuple[type, ...] = ()

    def __post_init__(self) -> None:
        check_name("cache", self.name)
        if self.name in SPECIAL_CACHE_NAMES:
            raise ValueError(f"cache name {self.name!r} is reserved for the caches stream's special rows")
        if not isinstance(self.max_size, int) or self.max_size < 1:
            raise ValueError(f"cache {self.name!r}: max_size must be a positive integer, not {self.max_size!r}")
        if not isinstance(self.key_arity, int) or self.key_arity < 0:
            raise ValueError(f"cache {self.name!r}: key_arity must be >= 0, not {self.key_arity!r}")
        types = tuple(self.key_types) or (str,) * self.key_arity
        if len(types) != self.key_arity or any(t not in KEY_COMPONENT_TYPES for t in types):
            raise ValueError(
                f"cache {self.name!r}: key_types must give str or int for each of the {self.key_arity} key "
                f"component(s), not {self.key_types!r}"
            )
        object.__setattr__(self, "key_types", types)
        mode = self.room_state_key
        if not self.depends_on_room_state:
            if mode is not None:
                raise ValueError(f"cache {self.name!r}: room_state_key needs depends_on_room_state=True")
            return
        if mode is None:
            mode = _DEFAULT_ROOM_STATE_KEY.get(self.key_arity)
            if mode is None:
                raise ValueError(f"cache {self.name!r}: say which keys room-state changes invalidate (room_state_key)")
            object.__setattr__(self, "room_state_key", mode)
        if mode not in _ROOM_STATE_ARITY:
            raise ValueError(
                f"cache {self.name!r}: room_state_key must be one of {', '.join(_ROOM_STATE_ARITY)}, not {mode!r}"
            )
        arity = _ROOM_STATE_ARITY[mode]
        if arity is not None and (self.key_arity != arity or types != (str,) * arity):
            raise ValueError(
                f"cache {self.name!r}: room_state_key {mode!r} needs keys of {arity} str component(s), "
                f"not key_arity={self.key_arity} with key_types={types!r}"
            )


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


ExportColumnKind = Literal["string", "long", "double", "boolean"]
"""How a column of an :class:`ExportSource` is typed: Spark ``string``, ``bigint``, ``double``, ``boolean``."""
_EXPORT_COLUMN_KINDS = frozenset({"string", "long", "double", "boolean"})


@dataclass(frozen=True)
class ExportSource:
    """A job's own ``SELECT`` in place of its stream's rows (see docs/export.md, "A job's own SQL").

    For streams whose rows are not what an export wants: several rows per stream ID, or the fact
    spread over several tables (the events plugin's ``events`` job reads one row per event from the
    ``events`` index joined to ``event_json`` and ``rooms``). The job keeps everything else of its
    stream: the watermark, the checkpoint, the ranges, the exactly-once commit.

    ``sql`` is one ``SELECT`` returning ``columns`` in order, for the facts whose stream positions lie
    in ``(%(lo)s, %(hi)s]`` (positive wire tokens: a backwards stream's stored IDs are
    ``-position``, so its condition reads ``id < -%(lo)s AND id >= -%(hi)s``). It must read only rows
    of the stream's backing tables in that range (joined to whatever else), so that a range's facts
    never change once below the watermark; ``%`` elsewhere in it is written ``%%``. The values are
    integers, inlined into a ``COPY (sql) TO STDOUT``.

    ``columns`` are ``(name, kind)`` pairs, the SQL casting each to its kind (``::text``,
    ``::bigint``...). ``finish``, if given, takes each ``pyarrow.Table`` read (a slice of a range) and
    returns one with the same columns; it runs in the Spark workers, so it must be a module-level
    function of a module importable there (as a stream's ``update_function`` is).
    """

    sql: str
    columns: tuple[tuple[str, ExportColumnKind], ...]
    finish: Callable[[Any], Any] | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "columns", tuple((str(n), k) for n, k in self.columns))
        if "%(lo)s" not in self.sql or "%(hi)s" not in self.sql:
            raise ValueError("export source: sql must select the range (%(lo)s, %(hi)s]")
        names = [n for n, _ in self.columns]
        if not names or len(set(names)) != len(names):
            raise ValueError(f"export source: columns must be non-empty and unique, not {names}")
        for name, kind in self.columns:
            if not _IDENTIFIER.fullmatch(name):
                raise ValueError(f"export source: column name {name!r} is not an identifier")
            if kind not in _EXPORT_COLUMN_KINDS:
                kinds = ", ".join(sorted(_EXPORT_COLUMN_KINDS))
                raise ValueError(f"export source: column {name!r} has kind {kind!r}; one of {kinds}")
        if self.finish is not None and not callable(self.finish):
            raise ValueError("export source: finish must be callable")


_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


@dataclass(frozen=True)
class ExportJobSpec:
    """A Spark export job over one stream: rows go through ``transform`` and are written as ``format``.

    With ``content=True`` the DataFrame also has a ``content`` column: the fact's whole backing-table
    row as JSON text.
    """

    name: str
    stream: str
    transform: Callable[[Any], Any] | None = None
    partition_by: tuple[str, ...] = ()
    format: str = "parquet"
    description: str = ""
    #: Read each fact's whole backing-table row too, as JSON text in a ``content`` column (for jobs
    #: that need columns the stream's row type leaves out).
    content: bool = False
    #: The job's own SQL instead of the stream's rows (:class:`ExportSource`); not with ``content``.
    source: ExportSource | None = None

    def __post_init__(self) -> None:
        check_name("export job", self.name)
        if self.source is not None and self.content:
            raise ValueError(
                f"export job {self.name!r}: content and source exclude each other (select it in the source)"
            )
        check_name("stream", self.stream)
        object.__setattr__(self, "partition_by", tuple(self.partition_by))
        if self.transform is not None and not callable(self.transform):
            raise ValueError(f"export job {self.name!r}: transform must be callable")


HTTP_METHODS = frozenset({"GET", "POST", "PUT", "DELETE", "PATCH"})


ROUTE_ACCESS = frozenset({"public", "user", "writer"})


@dataclass(frozen=True)
class RouteSpec:
    """An HTTP route the host serves: ``endpoint`` is ``async (request, host) -> response``.

    The endpoint receives the ``starlette.requests.Request`` and the running host
    (:class:`~factstream.HostApi`); ``request.state.user`` is the authenticated user (``None`` on
    public routes) and ``request.path_params`` the path's parameters. It returns a Starlette
    ``Response`` or a JSON-able value (sent as ``application/json``, status 200); raising
    :class:`~factstream.HttpError` answers ``{"errcode", "error"}`` with its status. ``access``:
    ``"public"`` (no token), ``"user"`` (any valid bearer token) or ``"writer"`` (a token allowed to
    write); by default GET routes need ``"user"`` and the others ``"writer"``.
    """

    path: str
    endpoint: Callable[[Request, HostApi], Awaitable[object]]
    methods: tuple[str, ...] = ("GET",)
    name: str = ""
    access: str = ""

    def __post_init__(self) -> None:
        if not isinstance(self.path, str) or not self.path.startswith("/"):
            raise ValueError(f"route path {self.path!r} must start with '/'")
        methods = tuple(m.upper() for m in self.methods)
        bad = [m for m in methods if m not in HTTP_METHODS]
        if bad or not methods:
            raise ValueError(f"route {self.path!r}: unsupported HTTP method(s) {bad or '(none)'}")
        object.__setattr__(self, "methods", methods)
        access = self.access or ("user" if methods == ("GET",) else "writer")
        if access not in ROUTE_ACCESS:
            raise ValueError(f"route {self.path!r}: access must be one of {sorted(ROUTE_ACCESS)}, not {access!r}")
        object.__setattr__(self, "access", access)
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


@dataclass(frozen=True)
class SettingsSpec:
    """The settings a plugin takes: ``model`` (a pydantic model) validates its ``plugins.<name>`` section.

    ``<name>`` is the plugin's entry-point name. The section comes from the YAML configuration, with
    environment overrides like every other key (``FACTSTREAM_PLUGINS__<NAME>__<KEY>``); it is
    validated when the host starts, and a bad value stops start-up naming the plugin and the key.
    The model's defaults apply when the section is absent. Read it with
    ``host.plugin_settings(Model)``.
    """

    model: type[BaseModel]

    def __post_init__(self) -> None:
        if not (isinstance(self.model, type) and issubclass(self.model, BaseModel)):
            raise ValueError(f"settings model must be a pydantic BaseModel subclass, not {self.model!r}")


@dataclass(frozen=True)
class RequirementSpec:
    """Another plugin this plugin needs loaded beside it: ``plugin``, its entry-point name (the name
    ``factstream plugins`` lists), and ``reason``, what for, in a few words (shown to an operator whose
    host lacks it: "typing notifications go to a room's joined members").

    A host that lacks a required plugin (not installed, blocked, or not selected) refuses to start with
    a message naming both plugins and the reason; the required plugin's hooks run before the requiring
    plugin's (its ``startup`` first, its ``shutdown`` last), so the services it keeps are there when the
    requiring plugin's ``startup`` asks for them (``host.state(...)``).
    """

    plugin: str
    reason: str

    def __post_init__(self) -> None:
        if not isinstance(self.plugin, str) or not self.plugin or self.plugin != self.plugin.strip():
            raise ValueError(f"a requirement names a plugin by its entry-point name, not {self.plugin!r}")
        if not isinstance(self.reason, str) or not self.reason.strip():
            raise ValueError(f"the requirement of plugin {self.plugin!r} needs a reason (what it is needed for)")
