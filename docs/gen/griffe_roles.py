"""A griffe extension of the docs site (mkdocs.yml, the python handler's ``extensions``): the Sphinx roles
of the docstrings (``:class:`~factstream.HostApi```, ``:meth:`call_hook```) become links of the API
reference, checked by ``mkdocs build --strict``.

A role whose target griffe resolves, from where the docstring is, to an object the reference shows (a
name of ``factstream.__all__`` or ``factstream.testing.__all__``, or a documented public member of one)
becomes a cross-reference to it. A target that resolves elsewhere (a private module of the core, the
standard library) is shown as code. A target that does not resolve at all (a method renamed, a class
removed) stays a cross-reference, to the name as written, which fails the strict build: a docstring that
names something gone is a broken link.
"""

from __future__ import annotations

import builtins
import re
from typing import Any

import griffe

ROLE = re.compile(r":(?:class|meth|func|attr|mod|data|obj|exc):`(~?)([^`]+)`")
#: The modules whose ``__all__`` the API reference renders (docs/reference/api.md).
RENDERED_MODULES = ("factstream", "factstream.testing")


class SphinxRoles(griffe.Extension):
    """Rewrite the roles of every docstring of the package once it is loaded."""

    def on_package(self, *, pkg: griffe.Module, **kwargs: Any) -> None:
        if pkg.path != "factstream":
            return
        shown = shown_paths(pkg)
        for obj in objects(pkg):
            if obj.docstring is not None:
                obj.docstring.value = ROLE.sub(lambda m, obj=obj: link(obj, m, pkg, shown), obj.docstring.value)


def objects(obj: griffe.Object, seen: set[str] | None = None) -> list[griffe.Object]:
    """``obj`` and every object defined under it (aliases left out: their targets are visited)."""
    seen = seen if seen is not None else set()
    if obj.path in seen:
        return []
    seen.add(obj.path)
    found = [obj]
    for member in obj.members.values():
        if not member.is_alias:
            found += objects(member, seen)  # type: ignore[arg-type]
    return found


def shown_paths(pkg: griffe.Module) -> set[str]:
    """The canonical paths of what the API reference shows: each exported name's object and its
    documented public members."""
    shown: set[str] = set()
    for module_path in RENDERED_MODULES:
        module = pkg if module_path == pkg.path else pkg[module_path.removeprefix("factstream.")]
        shown.add(module.path)
        for name in module.exports or []:
            target = module[name]
            target = target.final_target if target.is_alias else target
            shown.add(target.path)
            for member_name, member in target.members.items():
                if not member_name.startswith("_") and not member.is_alias and member.docstring is not None:
                    shown.add(member.path)
    return shown


def resolve(obj: griffe.Object, target: str, pkg: griffe.Module) -> str | None:
    """The path ``target`` names from where ``obj`` is, or None if nothing by that name exists."""
    if target.startswith("factstream."):
        try:
            found = pkg[target.removeprefix("factstream.")]
        except (KeyError, griffe.AliasResolutionError):
            return None
        return str(found.final_target.path if found.is_alias else found.path)
    first, _, rest = target.partition(".")
    scope: griffe.Object | None = obj
    while scope is not None:
        if first in scope.members:
            base = scope.members[first]
            try:
                base = base.final_target if base.is_alias else base
                path = base.path + (f".{rest}" if rest else "")
                return resolve(base, path, pkg) if path.startswith("factstream.") else path
            except griffe.AliasResolutionError:
                return base.path
        scope = scope.parent
    return None


def link(obj: griffe.Object, match: re.Match[str], pkg: griffe.Module, shown: set[str]) -> str:
    short, target = match.group(1), match.group(2)
    text = f"`{target.rsplit('.', 1)[-1] if short else target}`"
    path = resolve(obj, target, pkg)
    if path is None:
        if target.split(".")[0] in dir(builtins):
            return text
        return f"[{text}][{target}]"  # unresolved: a broken cross-reference, so that --strict fails
    return f"[{text}][{path}]" if path in shown else text
