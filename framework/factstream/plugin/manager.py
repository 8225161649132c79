"""The plugin manager: discovery through entry points, allow/block lists, tracing, typed hook calls.

Plugins are found in the entry-point group ``factstream``; the entry-point name is the plugin's identity
(its migration branch label, what an operator blocks, what errors name). The core registers its own
features through the same hooks as a plugin named ``factstream``.

Plugins may define hooks of their own (``register_hookspecs``). Those are added before any other hook
is called, and only then are hook names checked: an implementation of a hook that neither the core
nor a loaded plugin defines is a misspelling, refused with a suggestion, unless it is marked
``@factstream.hookimpl(defined_by="plugin")`` for a plugin that is not loaded, in which case it is
ignored with a warning (see :meth:`PluginHost.resolve_hooks`).

Environment escape hatches (read when the manager is built):

``FACTSTREAM_LOAD_PLUGINS``
    Comma-separated entry-point names: load only these (empty: load none). Unknown names are an error.
``FACTSTREAM_BLOCK_PLUGINS``
    Comma-separated entry-point names never to load.
``FACTSTREAM_TRACE_HOOKS``
    ``1`` logs every hook call (plugin, hook, arguments, result) on the ``factstream.hooks`` logger.

The manager remembers which installed plugins the first two left out, and why (:attr:`PluginHost.left_out`):
a database holding the migrations of a plugin that is not loaded is then refused with the switch to
change, rather than as if the plugin were not installed (``factstream/migrate.py``).
"""

from __future__ import annotations

import difflib
import inspect
import logging
import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from types import ModuleType
from typing import Any, Generic, ParamSpec, TypeVar, cast

import pluggy

from factstream.errors import PluginError
from factstream.plugin import core, hookspecs, requirements
from factstream.plugin.commands import CommandHandlerSpec
from factstream.plugin.discovery import (
    CORE_PLUGIN,
    ENTRY_POINT_GROUP,
    LeftOut,
    PluginInfo,
    PluginSelection,
    core_version,
    discover,
    installed_plugin_names,
)
from factstream.plugin.registry import Registry
from factstream.plugin.rows import Reset, StreamHandlers, bind_handlers, bind_resets
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
from factstream.plugin.streams import RowsHandlerSpec, StreamSpec

__all__ = [
    "CORE_PLUGIN",
    "ENTRY_POINT_GROUP",
    "LeftOut",
    "PluginHost",
    "PluginInfo",
    "PluginSelection",
    "discover",
    "installed_plugin_names",
    "load_plugins",
]

#: The hooks the core defines (``factstream/plugin/hookspecs.py``); no plugin may define one again.
CORE_HOOKS = frozenset(n for n in dir(hookspecs) if hasattr(getattr(hookspecs, n), "factstream_spec"))
#: The hook that adds plugins' own hook specs; it runs before every other hook.
HOOKSPECS_HOOK = "register_hookspecs"

S = TypeVar("S")
P = ParamSpec("P")
R = TypeVar("R")


@dataclass(frozen=True)
class Registration(Generic[S]):
    """A registration hook: the one spec type its ``register`` takes, and where the registry keeps it."""

    hook: str
    spec_type: type[S]
    add: Callable[[Registry, str, S], None]

    def binder(self, registry: Registry, plugin_name: str, trace: bool) -> Callable[[S], None]:
        """The ``register`` callable handed to ``plugin_name``'s implementation of the hook.

        It takes exactly this hook's spec type: anything else is a :class:`PluginError` naming the
        plugin, the hook and the type it takes (a ``CacheSpec`` given to ``register_streams``, say).
        """
        hook, spec_type, add = self.hook, self.spec_type, self.add

        def register(spec: S) -> None:
            if not isinstance(spec, spec_type):
                raise PluginError(
                    f"plugin {plugin_name!r} registered {spec!r} in {hook}, which takes a {spec_type.__name__}"
                )
            if trace:
                trace_log.info("  %s registered %r", plugin_name, spec)
            add(registry, plugin_name, spec)

        register.__name__ = f"register[{plugin_name}]"
        return register


#: The registration hooks, in the order they run (``register_rows_handlers`` is handed the streams).
REGISTRATIONS: tuple[Registration[Any], ...] = (
    Registration("register_streams", StreamSpec, Registry.add_stream),
    Registration("register_rows_handlers", RowsHandlerSpec, Registry.add_rows_handler),
    Registration("register_caches", CacheSpec, Registry.add_cache),
    Registration("register_migrations", MigrationSpec, Registry.add_migrations),
    Registration("register_invalidations", InvalidationSpec, Registry.add_invalidation),
    Registration("register_export_jobs", ExportJobSpec, Registry.add_export_job),
    Registration("register_routes", RouteSpec, Registry.add_route),
    Registration("register_commands", CommandSpec, Registry.add_command),
    Registration("register_command_handlers", CommandHandlerSpec, Registry.add_command_handler),
    Registration("register_settings", SettingsSpec, Registry.add_settings),
)
REGISTRATION_HOOKS = tuple(r.hook for r in REGISTRATIONS)

trace_log = logging.getLogger("factstream.hooks")
log = logging.getLogger(__name__)


def _trace_enabled(environ: Mapping[str, str]) -> bool:
    return environ.get("FACTSTREAM_TRACE_HOOKS", "").strip().lower() in {"1", "true", "yes", "on"}


class PluginHost:
    """The loaded plugins and a typed facade over their hooks.

    Hooks are called one plugin at a time, in pluggy's call order (``tryfirst``/``trylast``, then the
    most recently registered first), rather than through pluggy's multi-call, so that a plugin that
    raises or registers something invalid is reported by name. That holds for the hooks plugins
    define too (:meth:`call_hook`, :meth:`call_first`).
    """

    def __init__(self, *, trace: bool = False) -> None:
        self.pm = pluggy.PluginManager(ENTRY_POINT_GROUP)
        self.pm.add_hookspecs(hookspecs)
        self.plugins: dict[str, PluginInfo] = {}
        self.trace = trace
        #: Each hook a plugin defined (``register_hookspecs``) -> that plugin's name.
        self.hook_owners: dict[str, str] = {}
        #: ``(plugin, hook)`` of the implementations ignored because the plugin defining the hook is not loaded.
        self.ignored: set[tuple[str, str]] = set()
        #: Installed plugins that the selection left out, and why (:func:`load_plugins` fills it in). A
        #: plugin that is not loaded and not here is not installed.
        self.left_out: dict[str, LeftOut] = {}
        self._registry: Registry | None = None
        self._impl_cache: dict[str, list[tuple[str, Callable[..., Any]]]] = {}
        self._params: dict[Callable[..., Any], frozenset[str]] = {}
        #: The plugins whose ``register_hookspecs`` ran (it runs once per plugin).
        self._specs_added: set[str] = set()
        #: Whether every plugin's hooks are added and every implementation's name is checked.
        self._resolved = False
        #: Each plugin's requirements (``register_requirements``), once collected and checked.
        self._requirements: dict[str, list[RequirementSpec]] | None = None
        if trace:
            self.pm.trace.root.setwriter(lambda msg: trace_log.info("%s", msg.rstrip()))
            self.pm.enable_tracing()

    # -- loading -----------------------------------------------------------------------------------

    def add(self, name: str, plugin: object, info: PluginInfo | None = None) -> None:
        """Register ``plugin`` (a module or object with hook implementations) under ``name``.

        Arguments are checked against the hooks already known; hook names are not checked yet, since a
        plugin may implement a hook that a plugin added after it defines: :meth:`resolve_hooks` checks
        them, before any hook is called.
        """
        if name in self.plugins:
            raise PluginError(f"two plugins are named {name!r}: {self.plugins[name].module} and {_module_name(plugin)}")
        try:
            self.pm.register(plugin, name=name)
        except pluggy.PluginValidationError as exc:
            raise PluginError(f"plugin {name!r} has an invalid hook implementation: {exc}") from exc
        self.plugins[name] = info or PluginInfo(name, _module_name(plugin), None, None)
        self._registry = None
        self._resolved = False
        self._requirements = None
        self._impl_cache.clear()

    def resolve_hooks(self) -> None:
        """Add every plugin's own hooks (``register_hookspecs``), then check every implementation's name.

        Runs once after the last :meth:`add` (again after a later one, for the new plugins only);
        :func:`load_plugins` calls it, and every hook call makes sure it ran, so no hook is called
        before every hook is known. Refused with a :class:`PluginError`:

        * a hook a plugin defines that the core or another plugin defines too (naming both);
        * an implementation of a hook nobody defines (a misspelling: the message suggests the closest
          hook, and names the plugin defining it if it is a plugin's);
        * an implementation of another plugin's hook that is not marked ``defined_by`` that plugin.

        An implementation marked ``@factstream.hookimpl(defined_by="x")`` whose hook is undefined
        because plugin ``x`` is not loaded (blocked, or not installed) is ignored, with one warning
        naming both plugins: a plugin that implements another's hooks starts without it.
        """
        if self._resolved:
            return
        for plugin_name, function in self._ordered_impls(HOOKSPECS_HOOK):
            if plugin_name not in self._specs_added:
                self._call(plugin_name, HOOKSPECS_HOOK, function, register=self._spec_binder(plugin_name))
                self._specs_added.add(plugin_name)
        self._check_hook_names()
        self._resolved = True

    # -- registration ------------------------------------------------------------------------------

    @property
    def registry(self) -> Registry:
        """Everything the plugins registered; built (and validated) on first use."""
        if self._registry is None:
            registry = Registry()
            for registration in REGISTRATIONS:
                hook = registration.hook
                for plugin_name, function in self._impls(hook):
                    register = registration.binder(registry, plugin_name, self.trace)
                    # ``streams`` is taken by register_rows_handlers only (each implementation gets
                    # the arguments it names): every stream is registered by then.
                    streams = [r.spec for r in registry.streams]
                    self._call(plugin_name, hook, function, register=register, streams=streams)
            registry.finish()
            self._registry = registry
        return self._registry

    def registered_by(self, plugin: str) -> dict[str, list[str]]:
        """What one plugin registered, by kind (for ``factstream plugins``)."""
        reg = self.registry
        return {
            "streams": [s.name for s in reg.streams.by_plugin(plugin)],
            "caches": [c.name for c in reg.caches.by_plugin(plugin)],
            "export_jobs": [j.name for j in reg.export_jobs.by_plugin(plugin)],
            "commands": [c.name for c in reg.commands.by_plugin(plugin)],
        }

    # -- lifecycle ---------------------------------------------------------------------------------

    async def startup(self, host: object) -> None:
        """Run every plugin's ``startup(host)``; the first failure stops start-up, naming the plugin."""
        for plugin_name, function in self._impls("startup"):
            result = self._call(plugin_name, "startup", function, host=host)
            if inspect.isawaitable(result):
                await _named(plugin_name, "startup", result)

    def has_impls(self, hook: str) -> bool:
        return bool(getattr(self.pm.hook, hook).get_hookimpls())

    def rows_handlers(self, host: object) -> dict[str, StreamHandlers]:
        """Each handled stream's rows handlers bound to ``host``, for the reader pipeline (plugin/rows.py).

        In hook order of the plugins, each plugin's handlers in the order it registered them; with
        tracing on, every call is logged.
        """
        return bind_handlers(host, self.registry.rows_handlers, trace=self.trace)

    def reset_handlers(self, host: object) -> dict[str, Reset]:
        """Per kept stream, its rows handlers' ``reset`` bound to ``host`` as one call, in the rows handlers' order."""
        return bind_resets(host, self.registry.rows_handlers)

    async def shutdown(self, host: object) -> list[PluginError]:
        """Run every ``shutdown(host)`` in reverse order; failures are collected, not raised."""
        errors: list[PluginError] = []
        for plugin_name, function in self._impls("shutdown")[::-1]:
            try:
                result = self._call(plugin_name, "shutdown", function, host=host)
                if inspect.isawaitable(result):
                    await _named(plugin_name, "shutdown", result)
            except PluginError as exc:
                errors.append(exc)
        return errors

    # -- hooks plugins define ----------------------------------------------------------------------

    async def call_hook(self, spec: Callable[P, R], /, *args: P.args, **kwargs: P.kwargs) -> list[R]:
        """Call every implementation of the plugin-defined hook ``spec`` (the ``@factstream.hookspec``
        function itself); their results but None, in order.

        Implementations run one at a time in pluggy's order (``tryfirst``, the others with the plugin
        loaded last first, ``trylast``), each with the arguments it names (a subset of the spec's); an
        awaitable result is awaited before the next implementation runs. One that raises stops the call
        with a :class:`PluginError` naming the plugin and the hook (the exception chained). A hook no
        loaded plugin defines, or a core hook, raises :class:`KeyError`.
        """
        name, arguments = self._hook_call(spec, args, kwargs)
        results = []
        for plugin_name, function in self._plugin_hook(name):
            result = self._call(plugin_name, name, function, **arguments)
            if inspect.isawaitable(result):
                result = await _named(plugin_name, name, result)
            if result is not None:
                results.append(result)
        return results

    async def call_first(self, spec: Callable[P, R], /, *args: P.args, **kwargs: P.kwargs) -> R | None:
        """Like :meth:`call_hook`, but stop at the first result (awaited) that is not None and return it.

        None when every implementation returned None, or there is none. The implementations after the
        one that answered are not called: a ``trylast`` implementation is a default.
        """
        name, arguments = self._hook_call(spec, args, kwargs)
        for plugin_name, function in self._plugin_hook(name):
            result = self._call(plugin_name, name, function, **arguments)
            if inspect.isawaitable(result):
                result = await _named(plugin_name, name, result)
            if result is not None:
                return cast(R, result)
        return None

    def _hook_call(
        self, spec: Callable[..., object], args: tuple[object, ...], kwargs: dict[str, Any]
    ) -> tuple[str, dict[str, Any]]:
        """The hook's name and the call's arguments by name (positional ones bound to the spec's names)."""
        name = getattr(spec, "__name__", None)
        if name is None or not hasattr(spec, f"{ENTRY_POINT_GROUP}_spec"):
            raise TypeError(f"call_hook and call_first take a @factstream.hookspec function, not {spec!r}")
        if args:
            kwargs = dict(inspect.signature(spec).bind_partial(*args, **kwargs).arguments)
        return name, kwargs

    def _plugin_hook(self, name: str) -> list[tuple[str, Callable[..., Any]]]:
        """The implementations of a plugin-defined hook, resolved once per name (cleared by :meth:`add`)."""
        if self._resolved and name in self.hook_owners:
            cached = self._impl_cache.get(name)
            if cached is not None:
                return cached
        self.resolve_hooks()
        if name not in self.hook_owners:
            raise KeyError(self._not_callable(name))
        return self._impls(name)

    def _not_callable(self, name: str) -> str:
        if name in CORE_HOOKS:
            return (
                f"hook {name!r} is a core hook, which only the host calls; call_hook and call_first call "
                "the hooks plugins define (register_hookspecs)"
            )
        close = difflib.get_close_matches(name, list(self.hook_owners), n=1)
        hint = f" (did you mean {close[0]!r}, defined by plugin {self.hook_owners[close[0]]!r}?)" if close else ""
        return f"no loaded plugin defines hook {name!r}{hint}; {self._plugin_hooks_listing()}"

    def _plugin_hooks_listing(self) -> str:
        if not self.hook_owners:
            return "no plugin defines hooks"
        owned = ", ".join(f"{hook} ({owner!r})" for hook, owner in sorted(self.hook_owners.items()))
        return f"hooks defined by plugins: {owned}"

    def _spec_binder(self, plugin_name: str) -> Callable[[ModuleType | type], None]:
        """The ``register`` callable of one plugin's ``register_hookspecs``: checks, then adds a namespace."""

        def register(namespace: ModuleType | type) -> None:
            names = self._spec_names(plugin_name, namespace)
            for hook in names:
                if hook in CORE_HOOKS:
                    core_and_plugin = f"the core ({CORE_PLUGIN!r}) and plugin {plugin_name!r}"
                    raise PluginError(f"duplicate hook {hook!r}: defined by both {core_and_plugin}")
                owner = self.hook_owners.get(hook)
                if owner == plugin_name:
                    raise PluginError(f"duplicate hook {hook!r}: plugin {plugin_name!r} defined it twice")
                if owner is not None:
                    first, second = sorted((owner, plugin_name))
                    raise PluginError(f"duplicate hook {hook!r}: defined by both plugins {first!r} and {second!r}")
            try:
                # Checks the implementations already registered against the new specs.
                self.pm.add_hookspecs(namespace)
            except pluggy.PluginValidationError as exc:
                implementer = self.pm.get_name(exc.plugin) or _module_name(exc.plugin)
                raise PluginError(f"plugin {implementer!r} has an invalid hook implementation: {exc}") from exc
            for hook in names:
                self.hook_owners[hook] = plugin_name
            if self.trace:
                trace_log.info("  %s defined hooks %s", plugin_name, ", ".join(names))

        register.__name__ = f"register[{plugin_name}]"
        return register

    def _spec_names(self, plugin_name: str, namespace: object) -> list[str]:
        """The ``@factstream.hookspec`` functions of ``namespace``, which must be a module or a class."""
        if not (isinstance(namespace, ModuleType) or inspect.isclass(namespace)):
            raise PluginError(
                f"plugin {plugin_name!r} registered {namespace!r} as hook specs; "
                "register a module or a class holding @factstream.hookspec functions"
            )
        names = []
        for name in sorted(dir(namespace)):
            opts = self.pm.parse_hookspec_opts(namespace, name)
            if opts is None:
                continue
            if opts.get("historic"):
                raise PluginError(
                    f"plugin {plugin_name!r} defines hook {name!r} as historic, which factstream does not support"
                )
            names.append(name)
        if not names:
            raise PluginError(
                f"plugin {plugin_name!r} registered {_namespace_name(namespace)} as hook specs, "
                "but it holds no @factstream.hookspec function"
            )
        return names

    def _check_hook_names(self) -> None:
        """Refuse misspelt hooks and undeclared implementations of other plugins' hooks (:meth:`resolve_hooks`)."""
        order = {name: index for index, name in enumerate(self.plugins)}
        found = sorted(
            (
                (impl.plugin_name, hook, impl)
                for hook, caller in vars(self.pm.hook).items()
                if not hook.startswith("_")
                for impl in caller.get_hookimpls()
            ),
            key=lambda item: (order.get(item[0], len(order)), item[1]),
        )
        for plugin_name, hook, impl in found:
            defined_by = getattr(impl.function, hookspecs.DEFINED_BY_ATTRIBUTE, None)
            owner = CORE_PLUGIN if hook in CORE_HOOKS else self.hook_owners.get(hook)
            if owner is None:
                if defined_by is not None and defined_by not in self.plugins:
                    if (plugin_name, hook) not in self.ignored:
                        self.ignored.add((plugin_name, hook))
                        log.warning(
                            "plugin %r implements hook %r of plugin %r, which is not loaded (blocked or not "
                            "installed); the implementation is ignored",
                            plugin_name,
                            hook,
                            defined_by,
                        )
                    continue
                raise PluginError(self._unknown_hook(plugin_name, hook, defined_by))
            if defined_by is None:
                if owner in (CORE_PLUGIN, plugin_name):
                    continue
                raise PluginError(
                    f"plugin {plugin_name!r} implements hook {hook!r} of plugin {owner!r}: mark it "
                    f"@factstream.hookimpl(defined_by={owner!r}), so that where {owner!r} is not loaded it is "
                    "ignored rather than refused as an unknown hook"
                )
            if defined_by != owner:
                where = f"the core ({CORE_PLUGIN!r})" if owner == CORE_PLUGIN else f"plugin {owner!r}"
                raise PluginError(
                    f"plugin {plugin_name!r} implements hook {hook!r} as a hook of plugin {defined_by!r} "
                    f"(defined_by), but {where} defines it"
                )

    def _unknown_hook(self, plugin_name: str, hook: str, defined_by: str | None) -> str:
        """Why an implementation of ``hook`` is refused, with the closest hook it may have meant."""
        if defined_by is not None:  # a loaded plugin that does not define it
            theirs = sorted(h for h, owner in self.hook_owners.items() if owner == defined_by)
            close = difflib.get_close_matches(hook, theirs, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            return (
                f"plugin {plugin_name!r} implements hook {hook!r} of plugin {defined_by!r}, which {defined_by!r} "
                f"does not define{hint}; hooks of {defined_by!r}: {', '.join(theirs) or 'none'}"
            )
        known = sorted(CORE_HOOKS)
        close = difflib.get_close_matches(hook, known + sorted(self.hook_owners), n=1)
        hint = ""
        if close:
            owner = self.hook_owners.get(close[0])
            hint = f" (did you mean {close[0]!r}" + (f", defined by plugin {owner!r}" if owner else "") + "?)"
        listing = f"known hooks: {', '.join(known)}"
        if self.hook_owners:
            listing += f"; {self._plugin_hooks_listing()}"
        return f"plugin {plugin_name!r} implements unknown hook {hook!r}{hint}; {listing}"

    # -- internals ---------------------------------------------------------------------------------

    @property
    def requirements(self) -> requirements.Requirements:
        """Each plugin's requirements (``register_requirements``), collected once and checked: a required
        plugin that is not loaded, or requirements that loop, are a :class:`PluginError`."""
        if self._requirements is None:
            self.resolve_hooks()
            collected: dict[str, list[RequirementSpec]] = {}
            for plugin_name, function in self._ordered_impls(requirements.HOOK):
                self._call(
                    plugin_name, requirements.HOOK, function, register=requirements.binder(plugin_name, collected)
                )
            requirements.check(collected, self.plugins, self.left_out)
            self._requirements = collected
        return self._requirements

    def _impls(self, hook: str) -> list[tuple[str, Callable[..., Any]]]:
        """A hook's implementations in call order, once every plugin's hooks are known (cached per hook):
        pluggy's order, with each plugin after the plugins it requires (``register_requirements``)."""
        cached = self._impl_cache.get(hook)
        if cached is not None:
            return cached
        self.resolve_hooks()
        out = self._ordered_impls(hook)
        needs = self.requirements
        if needs and hook != requirements.HOOK:
            order = requirements.dependency_order([name for name, _ in out], needs)
            out.sort(key=lambda impl: order.index(impl[0]))
        self._impl_cache[hook] = out
        return out

    def _ordered_impls(self, hook: str) -> list[tuple[str, Callable[..., Any]]]:
        caller = getattr(self.pm.hook, hook)
        out = []
        # pluggy calls the list from the end: honour its order (tryfirst/trylast, last-registered first).
        for impl in reversed(caller.get_hookimpls()):
            if impl.hookwrapper or impl.wrapper:
                raise PluginError(
                    f"plugin {impl.plugin_name!r} wraps hook {hook}; factstream hooks do not support wrappers"
                )
            out.append((impl.plugin_name, impl.function))
        return out

    def _call(self, plugin_name: str, hook: str, function: Callable[..., Any], **kwargs: Any) -> Any:
        wanted = self._params.get(function)
        if wanted is None:
            wanted = self._params[function] = frozenset(inspect.signature(function).parameters)
        args = {k: v for k, v in kwargs.items() if k in wanted}
        if self.trace:
            trace_log.info("call %s.%s(%s)", plugin_name, hook, ", ".join(args))
        try:
            result = function(**args)
        except PluginError:
            raise
        except Exception as exc:
            raise PluginError(f"plugin {plugin_name!r} failed in hook {hook}: {type(exc).__name__}: {exc}") from exc
        if self.trace:
            trace_log.info("done %s.%s -> %r", plugin_name, hook, result)
        return result


async def _named(plugin_name: str, hook: str, awaitable: Any) -> Any:
    try:
        return await awaitable
    except PluginError:
        raise
    except Exception as exc:
        raise PluginError(f"plugin {plugin_name!r} failed in hook {hook}: {type(exc).__name__}: {exc}") from exc


def _module_name(plugin: object) -> str:
    if isinstance(plugin, ModuleType):
        return plugin.__name__
    return f"{type(plugin).__module__}.{type(plugin).__qualname__}"


def _namespace_name(namespace: ModuleType | type) -> str:
    if isinstance(namespace, ModuleType):
        return namespace.__name__
    return f"{namespace.__module__}.{namespace.__qualname__}"


def load_plugins(
    selection: PluginSelection | None = None,
    *,
    extra: Iterable[tuple[str, object]] = (),
    environ: Mapping[str, str] | None = None,
) -> PluginHost:
    """Build a :class:`PluginHost` with the core, the selected entry-point plugins and ``extra`` ones.

    ``extra`` (name, plugin) pairs are registered as if discovered; tests use it for in-process plugins.
    """
    env = os.environ if environ is None else environ
    selection = selection or PluginSelection.from_env(env)
    host = PluginHost(trace=_trace_enabled(env))
    host.add(CORE_PLUGIN, core, PluginInfo(CORE_PLUGIN, core.__name__, "factstream", core_version(), builtin=True))
    for info, load in discover(selection, host.left_out):
        host.add(info.name, load(), info)
    for name, plugin in extra:
        if name in selection.blocked:
            host.left_out[name] = LeftOut.BLOCKED
            continue
        host.add(name, plugin)
    host.resolve_hooks()
    return host
