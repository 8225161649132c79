"""The plugin manager: discovery through entry points, allow/block lists, tracing, typed hook calls.

Plugins are found in the entry-point group ``factstream``; the entry-point name is the plugin's identity
(its migration branch label, what an operator blocks, what errors name). The core registers its own
features through the same hooks as a plugin named ``factstream``.

Environment escape hatches (read when the manager is built):

``FACTSTREAM_LOAD_PLUGINS``
    Comma-separated entry-point names: load only these (empty: load none). Unknown names are an error.
``FACTSTREAM_BLOCK_PLUGINS``
    Comma-separated entry-point names never to load.
``FACTSTREAM_TRACE_HOOKS``
    ``1`` logs every hook call (plugin, hook, arguments, result) on the ``factstream.hooks`` logger.
"""

from __future__ import annotations

import difflib
import inspect
import logging
import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from importlib import metadata
from types import ModuleType
from typing import Any

import pluggy

from factstream.errors import PluginError
from factstream.plugin import core, hookspecs
from factstream.plugin.registry import Registry
from factstream.plugin.rows import RowsHook, positional_arity

ENTRY_POINT_GROUP = "factstream"
CORE_PLUGIN = "factstream"
REGISTRATION_HOOKS = (
    "register_streams",
    "register_caches",
    "register_migrations",
    "register_invalidations",
    "register_export_jobs",
    "register_routes",
    "register_commands",
    "register_settings",
)

trace_log = logging.getLogger("factstream.hooks")
log = logging.getLogger(__name__)


@dataclass(frozen=True)
class PluginInfo:
    """A loaded plugin: its identity, where it came from and its version."""

    name: str
    module: str
    distribution: str | None
    version: str | None
    builtin: bool = False


@dataclass(frozen=True)
class PluginSelection:
    """Which entry-point plugins to load: ``only`` (None = all) minus ``blocked``."""

    only: frozenset[str] | None = None
    blocked: frozenset[str] = field(default_factory=frozenset)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> PluginSelection:
        env = os.environ if environ is None else environ

        def names(var: str) -> frozenset[str]:
            return frozenset(n.strip() for n in env.get(var, "").split(",") if n.strip())

        only = names("FACTSTREAM_LOAD_PLUGINS") if "FACTSTREAM_LOAD_PLUGINS" in env else None
        return cls(only=only, blocked=names("FACTSTREAM_BLOCK_PLUGINS"))


def _trace_enabled(environ: Mapping[str, str]) -> bool:
    return environ.get("FACTSTREAM_TRACE_HOOKS", "").strip().lower() in {"1", "true", "yes", "on"}


class PluginHost:
    """The loaded plugins and a typed facade over their hooks.

    Hooks are called one plugin at a time, in pluggy's call order (``tryfirst``/``trylast``, then the
    most recently registered first), rather than through pluggy's multi-call, so that a plugin that
    raises or registers something invalid is reported by name.
    """

    def __init__(self, *, trace: bool = False) -> None:
        self.pm = pluggy.PluginManager(ENTRY_POINT_GROUP)
        self.pm.add_hookspecs(hookspecs)
        self.plugins: dict[str, PluginInfo] = {}
        self.trace = trace
        self._registry: Registry | None = None
        self._impl_cache: dict[str, list[tuple[str, Callable[..., Any]]]] = {}
        self._params: dict[Callable[..., Any], frozenset[str]] = {}
        if trace:
            self.pm.trace.root.setwriter(lambda msg: trace_log.info("%s", msg.rstrip()))
            self.pm.enable_tracing()

    # -- loading -----------------------------------------------------------------------------------

    def add(self, name: str, plugin: object, info: PluginInfo | None = None) -> None:
        """Register ``plugin`` (a module or object with hook implementations) under ``name``."""
        if name in self.plugins:
            raise PluginError(f"two plugins are named {name!r}: {self.plugins[name].module} and {_module_name(plugin)}")
        _check_hook_names(name, plugin)
        try:
            self.pm.register(plugin, name=name)
        except pluggy.PluginValidationError as exc:
            raise PluginError(f"plugin {name!r} has an invalid hook implementation: {exc}") from exc
        self.plugins[name] = info or PluginInfo(name, _module_name(plugin), None, None)
        self._registry = None
        self._impl_cache.clear()

    def check_pending(self) -> None:
        """Fail loudly if any hook implementation has no matching spec (a misspelt hook)."""
        try:
            self.pm.check_pending()
        except pluggy.PluginValidationError as exc:
            raise PluginError(str(exc)) from exc

    # -- registration ------------------------------------------------------------------------------

    @property
    def registry(self) -> Registry:
        """Everything the plugins registered; built (and validated) on first use."""
        if self._registry is None:
            registry = Registry()
            for hook in REGISTRATION_HOOKS:
                for plugin_name, function in self._impls(hook):
                    self._call(plugin_name, hook, function, register=_binder(registry, plugin_name, hook, self))
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

    def rows_hook(self, host: object) -> RowsHook:
        """The ``on_rows`` implementations bound to ``host``, for the reader pipeline (plugin/rows.py).

        With tracing on, every implementation is called through the traced keyword path.
        """
        impls = [
            (name, function, 0 if self.trace else positional_arity(function))
            for name, function in self._impls("on_rows")
        ]
        return RowsHook(host, impls, self._call)

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

    # -- internals ---------------------------------------------------------------------------------

    def _impls(self, hook: str) -> list[tuple[str, Callable[..., Any]]]:
        cached = self._impl_cache.get(hook)
        if cached is not None:
            return cached
        caller = getattr(self.pm.hook, hook)
        out = []
        # pluggy calls the list from the end: honour its order (tryfirst/trylast, last-registered first).
        for impl in reversed(caller.get_hookimpls()):
            if impl.hookwrapper or impl.wrapper:
                raise PluginError(
                    f"plugin {impl.plugin_name!r} wraps hook {hook}; factstream hooks do not support wrappers"
                )
            out.append((impl.plugin_name, impl.function))
        self._impl_cache[hook] = out
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


def _binder(registry: Registry, plugin_name: str, hook: str, host: PluginHost) -> Callable[[Any], None]:
    def register(spec: Any) -> None:
        if host.trace:
            trace_log.info("  %s registered %r", plugin_name, spec)
        registry.add(plugin_name, spec)

    register.__name__ = f"register[{plugin_name}]"
    return register


def _module_name(plugin: object) -> str:
    if isinstance(plugin, ModuleType):
        return plugin.__name__
    return f"{type(plugin).__module__}.{type(plugin).__qualname__}"


def _check_hook_names(name: str, plugin: object) -> None:
    """Reject functions marked ``@hookimpl`` whose name is not a known hook, suggesting the right one."""
    known = sorted(n for n in dir(hookspecs) if hasattr(getattr(hookspecs, n), "factstream_spec"))
    for attr in dir(plugin):
        try:
            value = getattr(plugin, attr)
        except Exception:  # a property that raises is not a hook implementation
            continue
        if callable(value) and hasattr(value, "factstream_impl") and attr not in known:
            close = difflib.get_close_matches(attr, known, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise PluginError(
                f"plugin {name!r} implements unknown hook {attr!r}{hint}; known hooks: {', '.join(known)}"
            )


def _entry_points() -> list[metadata.EntryPoint]:
    return sorted(metadata.entry_points(group=ENTRY_POINT_GROUP), key=lambda ep: ep.name)


def discover(selection: PluginSelection) -> list[tuple[PluginInfo, Callable[[], object]]]:
    """Find the selected entry-point plugins; returns their info and a loader for each."""
    eps = _entry_points()
    seen: dict[str, metadata.EntryPoint] = {}
    for ep in eps:
        if ep.name == CORE_PLUGIN:
            raise PluginError(
                f"distribution {_dist_name(ep)!r} declares a plugin named {CORE_PLUGIN!r}, "
                "which is reserved for the core"
            )
        if ep.name in seen and seen[ep.name].value != ep.value:
            a, b = sorted((seen[ep.name], ep), key=lambda e: (_dist_name(e) or "", e.value))
            raise PluginError(
                f"two installed plugins are named {ep.name!r}: {a.value} (distribution {_dist_name(a)!r}) "
                f"and {b.value} (distribution {_dist_name(b)!r}); uninstall one of them"
            )
        seen[ep.name] = ep
    if selection.only is not None:
        unknown = sorted(selection.only - set(seen))
        if unknown:
            raise PluginError(
                f"FACTSTREAM_LOAD_PLUGINS names {', '.join(map(repr, unknown))}, which "
                f"{'is' if len(unknown) == 1 else 'are'} not installed (installed: {', '.join(sorted(seen)) or 'none'})"
            )
    chosen = []
    for name, ep in seen.items():
        if name in selection.blocked or (selection.only is not None and name not in selection.only):
            continue
        info = PluginInfo(name, ep.value, _dist_name(ep), ep.dist.version if ep.dist else None)
        chosen.append((info, _loader(ep)))
    return chosen


def installed_plugin_names() -> list[str]:
    """Names of every installed entry-point plugin, selected or not."""
    return sorted({ep.name for ep in _entry_points()})


def _dist_name(ep: metadata.EntryPoint) -> str | None:
    return ep.dist.name if ep.dist is not None else None


def _loader(ep: metadata.EntryPoint) -> Callable[[], object]:
    def load() -> object:
        try:
            return ep.load()
        except Exception as exc:
            raise PluginError(
                f"plugin {ep.name!r} ({ep.value}) cannot be imported: {type(exc).__name__}: {exc}"
            ) from exc

    return load


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
    host.add(CORE_PLUGIN, core, PluginInfo(CORE_PLUGIN, core.__name__, "factstream", _core_version(), builtin=True))
    for info, load in discover(selection):
        host.add(info.name, load(), info)
    for name, plugin in extra:
        if name in selection.blocked:
            continue
        host.add(name, plugin)
    host.check_pending()
    return host


def _core_version() -> str | None:
    try:
        return metadata.version("factstream")
    except metadata.PackageNotFoundError:
        return None
