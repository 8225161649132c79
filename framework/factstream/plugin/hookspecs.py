"""Hook specifications: the extension points every stream plugin (bundled or third-party) uses.

A plugin is a module (or object) with functions decorated ``@factstream.hookimpl`` whose names match
the specs below, or the specs another plugin defines (``register_hookspecs``); it is found through
the ``factstream`` entry-point group, and the entry-point name is its identity. Registration hooks
receive a ``register`` callable that takes one frozen, typed spec per call; the host validates each
spec when it is registered and rejects duplicates naming both plugins. Hook implementations may
accept a subset of the arguments (pluggy passes only what they name).

Hooks are grouped by lifecycle phase:

* **registration** (host start-up, before anything runs): ``register_hookspecs`` first, then the
  other ``register_*``;
* **lifecycle** (the host process): ``startup`` and ``shutdown``.

Rows reach plugins through the handlers they register with ``register_rows_handlers``: one typed
handler per stream (:class:`~factstream.RowsHandlerSpec`), called by the host's reader pipeline.

``factstream.plugin.manager.PluginHost`` calls these hooks one plugin at a time so that an exception or a bad
spec is reported with the plugin's name. The hooks plugins define are called the same way, by whoever
holds a host, with the spec function itself: ``host.call_hook(spec, ...)`` and
``host.call_first(spec, ...)``, typed by the spec's signature.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from types import ModuleType
from typing import TYPE_CHECKING, Any, TypeVar, overload

import pluggy

if TYPE_CHECKING:
    from factstream.plugin.api import HostApi
    from factstream.plugin.commands import RegisterCommandHandler
    from factstream.plugin.specs import (
        CacheSpec,
        CommandSpec,
        ExportJobSpec,
        InvalidationSpec,
        MigrationSpec,
        RequirementSpec,
        RouteSpec,
        SettingsSpec,
    )
    from factstream.plugin.streams import RegisterRowsHandler, RegisterStream, StreamSpec

F = TypeVar("F", bound=Callable[..., object])

#: The attribute ``@factstream.hookimpl(defined_by=...)`` sets on the function it marks.
DEFINED_BY_ATTRIBUTE = "factstream_defined_by"

hookspec = pluggy.HookspecMarker("factstream")
"""The marker for hook specifications (``@factstream.hookspec``): the core's below, and those a plugin
defines for other plugins to implement (``register_hookspecs``). ``firstresult=True`` declares a
hook whose callers want the first non-None answer (``host.call_first``)."""


class HookimplMarker:
    """``@factstream.hookimpl``: pluggy's implementation marker, plus ``defined_by``.

    ``@factstream.hookimpl`` and ``@factstream.hookimpl(tryfirst=True)`` (or ``trylast=True``) mark
    an implementation as pluggy's marker does. ``defined_by="events"`` says that the hook is one the
    plugin ``events`` defines (``register_hookspecs``): where ``events`` is not loaded (blocked, not
    installed) the implementation is then ignored with a warning rather than refused as a misspelt
    hook, so a plugin that works beside ``events`` also starts without it. The manager requires it on
    every implementation of another plugin's hook for that reason.

    ``wrapper``/``hookwrapper`` are accepted so that the manager can refuse them by name (factstream
    calls one plugin at a time and cannot honour wrappers), ``specname`` and ``optionalhook`` for
    pluggy compatibility (every hook name is checked whatever ``optionalhook`` says).
    """

    def __init__(self, project_name: str) -> None:
        self.project_name = project_name
        self._pluggy = pluggy.HookimplMarker(project_name)

    @overload
    def __call__(
        self,
        function: F,
        *,
        tryfirst: bool = False,
        trylast: bool = False,
        defined_by: str | None = None,
        specname: str | None = None,
        wrapper: bool = False,
        hookwrapper: bool = False,
        optionalhook: bool = False,
    ) -> F: ...

    @overload
    def __call__(
        self,
        function: None = None,
        *,
        tryfirst: bool = False,
        trylast: bool = False,
        defined_by: str | None = None,
        specname: str | None = None,
        wrapper: bool = False,
        hookwrapper: bool = False,
        optionalhook: bool = False,
    ) -> Callable[[F], F]: ...

    def __call__(
        self,
        function: F | None = None,
        *,
        tryfirst: bool = False,
        trylast: bool = False,
        defined_by: str | None = None,
        specname: str | None = None,
        wrapper: bool = False,
        hookwrapper: bool = False,
        optionalhook: bool = False,
    ) -> F | Callable[[F], F]:
        if defined_by is not None and (not isinstance(defined_by, str) or not defined_by):
            raise ValueError(f"defined_by must name the plugin that defines the hook, not {defined_by!r}")
        mark = self._pluggy(
            tryfirst=tryfirst,
            trylast=trylast,
            specname=specname,
            wrapper=wrapper,
            hookwrapper=hookwrapper,
            optionalhook=optionalhook,
        )

        def decorate(func: F) -> F:
            mark(func)
            if defined_by is not None:
                setattr(func, DEFINED_BY_ATTRIBUTE, defined_by)
            return func

        return decorate if function is None else decorate(function)


hookimpl = HookimplMarker("factstream")
"""The marker for hook implementations (``@factstream.hookimpl``). It lives beside the specs, below the
manager, so the core's own plugin (`factstream.plugin.core`) can use it without importing the
manager that loads it."""

# ---------------------------------------------------------------------------------------------------
# registration


@hookspec
def register_hookspecs(register: Callable[[ModuleType | type], None]) -> None:
    """Define hooks of the plugin's own, for other plugins to implement.

    Call ``register(namespace)`` with a module or class holding ``@factstream.hookspec`` functions
    (documented stubs, as below). It runs when the plugins load, before any other hook, so every
    plugin's hooks are known before hook names are checked. A hook name another plugin defines, or a
    core hook's, is rejected at start-up naming both plugins. Call the hooks from a running host with
    the spec function: ``host.call_hook(spec, ...)`` (every result) or ``host.call_first(spec, ...)``
    (the first that is not None, for ``firstresult=True`` specs); mypy checks the arguments and the
    result against the spec's signature. Other plugins implement them with
    ``@factstream.hookimpl(defined_by="<this plugin>")``.

    Example::

        class PolicyHooks:
            @staticmethod
            @factstream.hookspec(firstresult=True)
            def check_like(host: HostApi, like: LikeRow) -> str | None:
                '''Why ``like`` is refused, or None to let it through.'''

        @factstream.hookimpl
        def register_hookspecs(register):
            register(PolicyHooks)
    """


@hookspec
def register_streams(register: RegisterStream) -> None:
    """Register the plugin's streams.

    Call ``register(StreamSpec(...))`` once per stream. Stream names are global: a name already
    registered by another plugin is rejected at start-up with an error naming both plugins.

    Example::

        @factstream.hookimpl
        def register_streams(register):
            register(StreamSpec(name="likes", row_type=LikeRow,
                                tables=(StreamTable("likes", "instance_name", "stream_id"),)))
    """


@hookspec
def register_rows_handlers(register: RegisterRowsHandler, streams: Sequence[StreamSpec[Any]]) -> None:
    """React to a stream's rows: register one typed handler per stream.

    Call ``register(RowsHandlerSpec(stream=SPEC, handler=fn))`` with the stream's spec (yours, or
    imported from the plugin that registers it) and ``fn(host, instance, token, rows, local)``, whose
    ``rows`` have the stream's row type (``Sequence[LikeRow]``): mypy checks one against the other.
    ``streams`` are the specs every plugin registered (``register_streams`` runs first), for a plugin
    that reacts to every stream. Runs with the other registration hooks; the handlers are called only
    in a host process.

    The handlers run in a host process for every token's rows of their stream, in stream order per
    writer: rows another process wrote (``local=False``) and, once their transaction committed and
    every earlier ID of this writer is complete, the rows this process wrote itself (``local=True``),
    so a plugin sees its own writes in order too and writes each reaction once. The host's reader
    pipeline runs, for every token: the stream's cache invalidations (``InvalidationSpec``), then
    the handlers (in hook order, each plugin's in the order it registered them), then (replicated
    rows only) the stream's position advances, then waiters and ``/sync`` long polls wake. So what a
    handler reads through a cache is already invalidated, and whatever it invalidates is invalid
    before anyone can observe the new position. A handler may be a coroutine function (awaited);
    an exception is logged with the plugin's name and does not stop the stream. A stream nobody
    handles costs the reader nothing.

    Example::

        def remember_likes(host: HostApi, instance: str, token: int, rows: Sequence[LikeRow], local: bool) -> None:
            host.state(RecentLikes).add(token, rows)

        @factstream.hookimpl
        def register_rows_handlers(register: RegisterRowsHandler) -> None:
            register(RowsHandlerSpec(stream=LIKES_STREAM, handler=remember_likes))
    """


@hookspec
def register_caches(register: Callable[[CacheSpec], None]) -> None:
    """Register named caches the plugin reads through.

    Call ``register(CacheSpec(name=..., max_size=...))``, or register ``cached_specs(StoreClass)``
    for a store whose methods are decorated with ``@cached(name=...)``. Cache names are global; every
    process gets every cache, in ``host.caches`` (see docs/caches.md).
    """


@hookspec
def register_invalidations(register: Callable[[InvalidationSpec], None]) -> None:
    """Declare which caches to invalidate when rows of a stream are replicated.

    Call ``register(InvalidationSpec(stream=..., cache=..., keys=fn))`` where ``fn(row)`` returns the
    cache keys a row makes stale. The stream and the cache may belong to other plugins; an unknown
    stream or cache is rejected at start-up.
    """


@hookspec
def register_migrations(register: Callable[[MigrationSpec], None]) -> None:
    """Register the directory holding the plugin's alembic revisions.

    Call ``register(MigrationSpec.from_package("factstream_likes.migrations"))`` at most once. The
    revisions form one alembic branch whose label is the plugin's entry-point name and whose first
    revision ``depends_on`` the core branch. ``factstream migrate new --plugin NAME -m MSG`` writes new
    revisions there.
    """


@hookspec
def register_export_jobs(register: Callable[[ExportJobSpec], None]) -> None:
    """Register Spark export jobs over the plugin's streams.

    Call ``register(ExportJobSpec(name=..., stream=..., transform=fn))``. Job names are global and
    the stream must be registered (by any plugin).
    """


@hookspec
def register_routes(register: Callable[[RouteSpec], None]) -> None:
    """Add HTTP routes to the host's API.

    Call ``register(RouteSpec(path="/likes/{user_id}", methods=("GET",), endpoint=fn))``. A path and
    method pair registered twice is rejected naming both plugins.
    """


@hookspec
def register_commands(register: Callable[[CommandSpec], None]) -> None:
    """Add sub-commands to the ``factstream`` CLI.

    Call ``register(CommandSpec(name="likes", app=typer_app_or_function, help="..."))``. A name that
    clashes with a built-in command or another plugin's command is rejected.
    """


@hookspec
def register_settings(register: Callable[[SettingsSpec], None]) -> None:
    """Declare the plugin's settings: the ``plugins.<name>`` section of the configuration.

    Call ``register(SettingsSpec(model=MySettings))`` at most once, with a pydantic model whose fields
    (with their defaults) are the plugin's settings. The host validates the section when it starts; a
    bad value stops start-up with an error naming the plugin and the key. Read the values with
    ``host.plugin_settings(MySettings)``.
    """


@hookspec
def register_command_handlers(register: RegisterCommandHandler) -> None:
    """Handle replication commands of the reference's protocol on the writers of a stream.

    Call ``register(CommandHandlerSpec(command=UserSyncCommand, stream="presence", handler=fn,
    forget=gone, resend=again))``: ``fn(host, sender, command)`` runs on the writers of ``stream`` for
    every such command, in arrival order; ``gone(host, instance)`` once an instance whose commands
    were handled is gone (its TCP link closed, or its process ended); ``again(host)`` gives the commands
    to send again whenever this process's replication link (re)connects. Send with
    ``host.send_command(command)``. One plugin handles each command; see ``factstream.plugin.commands``
    and docs/writing-plugins.md, "Commands a plugin handles".
    """


@hookspec
def register_requirements(register: Callable[[RequirementSpec], None]) -> None:
    """Declare the plugins this plugin needs loaded beside it.

    Call ``register(RequirementSpec(plugin="events", reason="typing notifications go to a room's joined
    members"))`` once per plugin needed. It runs before the other registration hooks. A host that lacks
    a required plugin refuses to start, naming both plugins, the reason and why the plugin is missing
    (not installed, blocked, not selected); requirements that loop are refused too. Every hook of a
    required plugin runs before the requiring plugin's (``shutdown`` in reverse: after it).
    """


# ---------------------------------------------------------------------------------------------------
# lifecycle


@hookspec
def startup(host: HostApi) -> None:
    """Called once when a host process has started (database reachable, migrations checked).

    ``host`` is the running host (:class:`~factstream.HostApi`); a coroutine function may be used and
    is awaited. An exception stops the host start-up with an error naming the plugin. Background work
    belongs in ``host.spawn(...)``: the host cancels it when it stops.
    """


@hookspec
def shutdown(host: HostApi) -> None:
    """Called once when a host process stops, in the reverse of the ``startup`` order.

    A coroutine function may be used and is awaited. An exception is reported (logged by the host)
    with the plugin's name and does not prevent the other plugins' shutdown hooks from running.
    """
