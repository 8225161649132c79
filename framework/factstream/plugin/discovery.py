"""Finding plugins: the entry points of group ``factstream``, and which of them to load.

An installed plugin is an entry point of the group; its name is the plugin's identity. Which ones load
is a :class:`PluginSelection` (``FACTSTREAM_LOAD_PLUGINS``, ``FACTSTREAM_BLOCK_PLUGINS``), and each one
it leaves out is remembered with why (:class:`LeftOut`). The manager (``factstream.plugin.manager``)
loads what :func:`discover` finds.
"""

from __future__ import annotations

import enum
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from importlib import metadata

from factstream.errors import PluginError

ENTRY_POINT_GROUP = "factstream"
#: The core's name as a plugin: reserved, no distribution may declare it.
CORE_PLUGIN = "factstream"


@dataclass(frozen=True)
class PluginInfo:
    """A loaded plugin: its identity, where it came from and its version."""

    name: str
    module: str
    distribution: str | None
    version: str | None
    builtin: bool = False


class LeftOut(enum.Enum):
    """Why an installed plugin is not loaded: the environment variable that leaves it out."""

    BLOCKED = "blocked by FACTSTREAM_BLOCK_PLUGINS"
    NOT_SELECTED = "not named in FACTSTREAM_LOAD_PLUGINS"


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

    def left_out(self, name: str) -> LeftOut | None:
        """Why this selection leaves the installed plugin ``name`` out; None when it loads it.

        Blocking wins: a plugin both blocked and not named in ``only`` is reported as blocked, since
        naming it in ``FACTSTREAM_LOAD_PLUGINS`` alone would not load it.
        """
        if name in self.blocked:
            return LeftOut.BLOCKED
        if self.only is not None and name not in self.only:
            return LeftOut.NOT_SELECTED
        return None


def _entry_points() -> list[metadata.EntryPoint]:
    return sorted(metadata.entry_points(group=ENTRY_POINT_GROUP), key=lambda ep: ep.name)


def discover(
    selection: PluginSelection, left_out: dict[str, LeftOut] | None = None
) -> list[tuple[PluginInfo, Callable[[], object]]]:
    """Find the selected entry-point plugins; returns their info and a loader for each.

    Each installed plugin the selection leaves out is added to ``left_out`` (when given), with why.
    """
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
        why = selection.left_out(name)
        if why is not None:
            if left_out is not None:
                left_out[name] = why
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


def core_version() -> str | None:
    try:
        return metadata.version("factstream")
    except metadata.PackageNotFoundError:
        return None
