"""Plugins that need other plugins (``register_requirements``): what each needs, checked against what is
loaded, and the order it sets for every hook.

A requirement is a :class:`~factstream.plugin.specs.RequirementSpec`: the entry-point name of the plugin
needed and why. :func:`check` refuses, in one :class:`~factstream.errors.PluginError` naming every
problem, a required plugin that is not loaded (saying why: not installed, blocked, not selected) and
requirements that loop. :func:`dependency_order` puts each plugin after the plugins it needs, and
otherwise keeps the order it is given (pluggy's), so that a plugin without requirements is called
exactly as before.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence

from factstream.errors import PluginError
from factstream.plugin.discovery import LeftOut
from factstream.plugin.specs import RequirementSpec

__all__ = ["Requirements", "binder", "check", "dependency_order"]

#: Each plugin's requirements, by plugin name, in the order it registered them.
Requirements = Mapping[str, Sequence[RequirementSpec]]

HOOK = "register_requirements"


def binder(plugin: str, into: dict[str, list[RequirementSpec]]) -> Callable[[RequirementSpec], None]:
    """The ``register`` callable of ``plugin``'s ``register_requirements``: a ``RequirementSpec`` only,
    never the plugin itself."""

    def register(spec: RequirementSpec) -> None:
        if not isinstance(spec, RequirementSpec):
            raise PluginError(f"plugin {plugin!r} registered {spec!r} in {HOOK}, which takes a RequirementSpec")
        if spec.plugin == plugin:
            raise PluginError(f"plugin {plugin!r} registered a requirement on itself")
        into.setdefault(plugin, []).append(spec)

    register.__name__ = f"register[{plugin}]"
    return register


def check(requirements: Requirements, loaded: Collection[str], left_out: Mapping[str, LeftOut]) -> None:
    """Refuse a required plugin that is not loaded, and requirements that loop (one message for all)."""
    problems = [
        f"plugin {name!r} needs plugin {spec.plugin!r} ({spec.reason}), which {_missing(spec.plugin, name, left_out)}"
        for name, specs in requirements.items()
        for spec in specs
        if spec.plugin not in loaded
    ]
    loop = _loop(requirements, loaded)
    if loop:
        path = " -> ".join(loop)
        problems.append(f"plugins need each other in a loop ({path}): none of them can be set up first")
    if problems:
        raise PluginError("; ".join(problems))


def dependency_order(names: Sequence[str], requirements: Requirements) -> list[str]:
    """``names`` with each after the plugins it needs among them (repeatedly taking the first name whose
    requirements are all placed); otherwise in the order given. Assumes :func:`check` passed."""
    needs = {name: {s.plugin for s in requirements.get(name, ())} & set(names) for name in names}
    placed: list[str] = []
    waiting = list(names)
    while waiting:
        ready = next(name for name in waiting if needs[name] <= set(placed))
        placed.append(ready)
        waiting.remove(ready)
    return placed


def _missing(plugin: str, needed_by: str, left_out: Mapping[str, LeftOut]) -> str:
    reason = left_out.get(plugin)
    if reason is LeftOut.BLOCKED:
        return f"is {reason.value}: unblock it, or block {needed_by!r} too"
    if reason is LeftOut.NOT_SELECTED:
        return f"is {reason.value}: name it there too"
    return "is not installed: install its distribution into this environment (uv pip install, or uv sync)"


def _loop(requirements: Requirements, loaded: Collection[str]) -> list[str]:
    """A loop of requirements among loaded plugins (its plugins, the first one again at the end), or []."""
    graph = {name: [s.plugin for s in specs if s.plugin in loaded] for name, specs in requirements.items()}
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    path: list[str] = []

    def visit(name: str) -> list[str]:
        state[name] = 1
        path.append(name)
        for needed in graph.get(name, ()):
            if state.get(needed) == 1:
                return [*path[path.index(needed) :], needed]
            if needed not in state and (found := visit(needed)):
                return found
        path.pop()
        state[name] = 2
        return []

    for name in sorted(graph):
        if name not in state and (found := visit(name)):
            return found
    return []
