"""Architecture rules, checked on the source: plugins use only the public API; the core imports no plugin.

This is the project's import contract (an equivalent of import-linter that also covers plugin
projects that are not installed, such as the test plugins and the templates).
"""

from __future__ import annotations

import ast
import inspect
import itertools
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

import factstream
from factstream.plugin import hookspecs

ROOT = Path(__file__).resolve().parent.parent
CORE = ROOT / "framework" / "factstream"
PLUGIN_ROOTS = [ROOT / "plugins", ROOT / "tests" / "plugin_projects", ROOT / "templates"]
PUBLIC = "factstream"


def imported_modules(path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.append((node.lineno, node.module))
            # ``from factstream import db`` reaches a private module too.
            if node.module == PUBLIC:
                found += [(node.lineno, f"{PUBLIC}.{a.name}") for a in node.names if a.name not in factstream.__all__]
    return found


def is_test_file(path: Path) -> bool:
    return "tests" in path.parts[-3:-1] or path.name.startswith("test_") or path.name == "conftest.py"


def plugin_violations(root: Path) -> list[str]:
    """Imports of factstream internals from plugin code under ``root``."""
    out = []
    for path in sorted(root.rglob("*.py")):
        for line, module in imported_modules(path):
            if module == PUBLIC or not module.startswith(PUBLIC + "."):
                continue
            if module == f"{PUBLIC}.testing" and is_test_file(path):
                continue
            out.append(
                f"{path.relative_to(root.parent)}:{line} imports {module} (plugins may import only 'factstream')"
            )
    return out


def core_violations(core: Path, plugin_packages: set[str]) -> list[str]:
    out = []
    for path in sorted(core.rglob("*.py")):
        for line, module in imported_modules(path):
            top = module.split(".")[0]
            if top in plugin_packages or re.match(r"^factstream_\w+$", top):
                out.append(f"{path.relative_to(core.parent)}:{line} imports plugin package {module}")
    return out


def bundled_plugin_packages() -> set[str]:
    return {p.name for p in (ROOT / "plugins").glob("*/factstream_*") if p.is_dir()}


@pytest.mark.parametrize("root", PLUGIN_ROOTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_plugins_import_only_the_public_api(root):
    if not root.exists():
        pytest.skip(f"{root.relative_to(ROOT)} does not exist yet")
    assert plugin_violations(root) == []


def test_core_imports_no_bundled_plugin():
    assert core_violations(CORE, bundled_plugin_packages()) == []


def test_the_import_checks_catch_violations(tmp_path):
    plugin = tmp_path / "plugins" / "bad" / "factstream_bad"
    plugin.mkdir(parents=True)
    (plugin / "__init__.py").write_text(
        "import factstream\nfrom factstream.db.engine import create_engine\nfrom factstream import plugin\n"
    )
    (plugin / "tests").mkdir()
    (plugin / "tests" / "test_ok.py").write_text("from factstream.testing import PluginInstaller\n")
    core = tmp_path / "core"
    core.mkdir()
    (core / "x.py").write_text("import factstream_bad.rows\n")

    assert plugin_violations(tmp_path / "plugins") == [
        "plugins/bad/factstream_bad/__init__.py:2 imports factstream.db.engine (plugins may import only 'factstream')",
        "plugins/bad/factstream_bad/__init__.py:3 imports factstream.plugin (plugins may import only 'factstream')",
    ]
    assert core_violations(core, {"factstream_bad"}) == ["core/x.py:1 imports plugin package factstream_bad.rows"]


TYPED_PLUGIN_ROOTS = [ROOT / "plugins", ROOT / "tests" / "plugin_projects"]


def _is_hookimpl(decorator: ast.expr) -> bool:
    target = decorator.func if isinstance(decorator, ast.Call) else decorator
    return (isinstance(target, ast.Attribute) and target.attr == "hookimpl") or (
        isinstance(target, ast.Name) and target.id == "hookimpl"
    )


def _mentions_any(annotation: ast.expr) -> bool:
    if isinstance(annotation, ast.Constant) and isinstance(annotation.value, str):  # a string annotation
        annotation = ast.parse(annotation.value, mode="eval").body
    return any(
        (isinstance(node, ast.Name) and node.id == "Any") or (isinstance(node, ast.Attribute) and node.attr == "Any")
        for node in ast.walk(annotation)
    )


def untyped_hooks(root: Path) -> list[str]:
    """Hook implementations under ``root`` with a parameter or return that is not annotated, or is ``Any``."""
    out = []
    for path in sorted(root.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            if not any(_is_hookimpl(d) for d in node.decorator_list):
                continue
            where = f"{path.relative_to(root.parent)}:{node.lineno} {node.name}"
            for arg in [*node.args.posonlyargs, *node.args.args, *node.args.kwonlyargs]:
                if arg.annotation is None:
                    out.append(f"{where}: parameter {arg.arg!r} is not annotated")
                elif _mentions_any(arg.annotation):
                    out.append(f"{where}: parameter {arg.arg!r} is Any")
            if node.returns is None:
                out.append(f"{where}: the return is not annotated")
            elif _mentions_any(node.returns):
                out.append(f"{where}: returns Any")
    return out


@pytest.mark.parametrize("root", TYPED_PLUGIN_ROOTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_plugin_hooks_are_typed_without_any(root):
    """The bundled and test plugins type their hooks with the plugin API (``HostApi`` ...), never ``Any``."""
    assert untyped_hooks(root) == []


def test_bundled_route_endpoints_take_the_host_api_and_no_any():
    import typing

    from factstream.plugin.manager import load_plugins

    registry = load_plugins().registry
    bundled = {p.name for p in (ROOT / "plugins").iterdir() if (p / "pyproject.toml").exists()}
    routes = [r for r in registry.routes if r.plugin in bundled]
    if not routes:
        pytest.skip("the bundled plugins are not installed (uv sync --all-packages)")
    for reg in routes:
        endpoint = reg.spec.endpoint
        hints = typing.get_type_hints(endpoint)
        params = list(inspect.signature(endpoint).parameters)
        where = f"{reg.plugin}: {reg.spec.path} ({endpoint.__name__})"
        assert len(params) == 2 and hints.get(params[1]) is factstream.HostApi, where
        assert set(hints) == {*params, "return"}, f"{where}: every parameter and the return are annotated"
        assert typing.Any not in hints.values(), f"{where} takes or returns Any"


def test_the_typing_check_catches_untyped_hooks(tmp_path):
    plugin = tmp_path / "plugins" / "loose" / "factstream_loose"
    plugin.mkdir(parents=True)
    (plugin / "__init__.py").write_text(
        "from typing import Any\nimport factstream\n\n"
        "@factstream.hookimpl\ndef startup(host: Any) -> None: ...\n\n"
        "@factstream.hookimpl\nasync def shutdown(host): ...\n"
    )
    assert untyped_hooks(tmp_path / "plugins") == [
        "plugins/loose/factstream_loose/__init__.py:5 startup: parameter 'host' is Any",
        "plugins/loose/factstream_loose/__init__.py:8 shutdown: parameter 'host' is not annotated",
        "plugins/loose/factstream_loose/__init__.py:8 shutdown: the return is not annotated",
    ]


def test_public_api_exports_exist():
    for name in factstream.__all__:
        assert hasattr(factstream, name), name


HOOKS = [name for name, fn in inspect.getmembers(hookspecs, inspect.isfunction) if hasattr(fn, "factstream_spec")]


@pytest.mark.parametrize("hook", HOOKS)
def test_every_hook_is_documented_with_its_signature(hook):
    fn = getattr(hookspecs, hook)
    assert inspect.getdoc(fn), f"hook {hook} has no docstring"
    guide = (ROOT / "docs" / "writing-plugins.md").read_text()
    params = ", ".join(inspect.signature(fn).parameters)
    assert f"def {hook}({params})" in guide, f"docs/writing-plugins.md does not show `def {hook}({params})`"


def test_required_hooks_exist():
    required = {
        "register_streams",
        "register_caches",
        "register_invalidations",
        "register_migrations",
        "register_export_jobs",
        "register_routes",
        "register_commands",
        "startup",
        "shutdown",
    }
    assert required <= set(HOOKS)


REPLICATION = CORE / "replication"


def core_imports(path: Path) -> set[str]:
    """The ``factstream`` modules ``path`` imports, at run time or under ``TYPE_CHECKING``
    (``from a.b import c`` counts as ``a.b.c``: ``c`` may be a module)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found |= {node.module} | {f"{node.module}.{alias.name}" for alias in node.names}
    return {module for module in found if module.startswith(PUBLIC + ".")}


def test_the_wire_codec_imports_nothing_of_replication_outside_itself():
    """The codec is a leaf: transports and the reader build on it, it builds on neither."""
    for path in sorted((REPLICATION / "wire").rglob("*.py")):
        outside = {
            m
            for m in core_imports(path)
            if m.startswith(f"{PUBLIC}.replication") and not m.startswith(f"{PUBLIC}.replication.wire")
        }
        assert outside == set(), f"{path.relative_to(CORE)} imports {sorted(outside)}"


@pytest.mark.parametrize("transport", ["tcp.py", "tcp_connection.py", "redis.py", "redis_subscribe.py"])
def test_transports_import_the_codec_not_the_reader(transport):
    assert f"{PUBLIC}.replication.handler" not in core_imports(REPLICATION / transport)


# -- no import cycles ------------------------------------------------------------------------------


def module_name(path: Path, core: Path) -> str:
    parts = list(path.relative_to(core.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph(core: Path) -> dict[str, dict[str, int]]:
    """Every module of the package at ``core`` -> the package's modules it imports (with a line number).

    Counts every import: at module level, inside functions and under ``TYPE_CHECKING``; relative ones;
    and ``importlib.import_module("...")`` with a literal name, which hides a dependency rather than
    removing it. ``from a.b import c`` is an edge to ``a.b.c`` when that is a module, else to ``a.b``;
    a name that is not a module of the package counts for its nearest enclosing module.
    """
    paths = {module_name(path, core): path for path in sorted(core.rglob("*.py"))}
    graph: dict[str, dict[str, int]] = {}
    for name, path in paths.items():
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        targets: list[tuple[int, str]] = []
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                targets += [(node.lineno, alias.name) for alias in node.names]
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                    module = ".".join(base + ([node.module] if node.module else []))
                else:
                    module = node.module or ""
                for alias in node.names:
                    submodule = f"{module}.{alias.name}"
                    targets.append((node.lineno, submodule if submodule in paths else module))
            elif (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute | ast.Name)
                and (node.func.attr if isinstance(node.func, ast.Attribute) else node.func.id) == "import_module"
                and node.args
                and isinstance(node.args[0], ast.Constant)
                and isinstance(node.args[0].value, str)
            ):
                targets.append((node.lineno, node.args[0].value))
        edges: dict[str, int] = {}
        for line, target in targets:
            while target and target not in paths:
                target = target.rpartition(".")[0]
            if target and target != name:
                edges.setdefault(target, line)
        graph[name] = edges
    return graph


def import_cycles(graph: dict[str, dict[str, int]]) -> list[list[str]]:
    """One cycle (``[a, b, ..., a]``) through each group of modules that import each other.

    The groups are the strongly connected components (Tarjan's algorithm, iteratively); within each, a
    shortest cycle is reported through each module not yet on a reported one, so every module of the
    group appears and a fix can start from a concrete chain.
    """
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    components.append(sorted(component))
    cycles = []
    for component in components:
        members, covered = set(component), set()
        for start in component:
            if start in covered:
                continue
            paths = {start: [start]}
            queue = [start]
            while queue:  # breadth first, inside the component, back to start
                node = queue.pop(0)
                if start in graph[node]:
                    cycles.append([*paths[node], start])
                    covered.update(paths[node])
                    break
                for child in sorted(graph[node]):
                    if child in members and child not in paths:
                        paths[child] = [*paths[node], child]
                        queue.append(child)
    return cycles


def describe_cycle(cycle: list[str], graph: dict[str, dict[str, int]]) -> str:
    return " -> ".join(f"{a} (line {graph[a][b]})" for a, b in itertools.pairwise(cycle)) + f" -> {cycle[-1]}"


def test_the_core_has_no_import_cycles():
    """No module of factstream imports itself back, at run time, in a function or under TYPE_CHECKING."""
    graph = import_graph(CORE)
    cycles = [describe_cycle(cycle, graph) for cycle in import_cycles(graph)]
    for cycle in cycles:
        print("import cycle:", cycle)
    assert cycles == []


def test_the_cycle_check_catches_cycles(tmp_path):
    core = tmp_path / "pkg"
    (core / "sub").mkdir(parents=True)
    (core / "__init__.py").write_text("")
    (core / "low.py").write_text(
        "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pkg.sub.high import H\n"
    )
    (core / "sub" / "__init__.py").write_text("")
    (core / "sub" / "high.py").write_text("from ..low import L\n")
    (core / "a.py").write_text("def f():\n    from pkg import b\n")
    (core / "b.py").write_text("import importlib\nimportlib.import_module('pkg.a')\n")
    (core / "leaf.py").write_text("import pkg.low\n")

    graph = import_graph(core)

    assert graph["pkg.leaf"] == {"pkg.low": 1}
    assert [describe_cycle(cycle, graph) for cycle in import_cycles(graph)] == [
        "pkg.a (line 2) -> pkg.b (line 2) -> pkg.a",
        "pkg.low (line 3) -> pkg.sub.high (line 1) -> pkg.low",
    ]


# -- layers ----------------------------------------------------------------------------------------

ARCHITECTURE = ROOT / "docs" / "architecture.md"


def documented_layers(text: str, heading: str = "## Layers") -> list[tuple[str, list[str]]]:
    """The layers of the table under ``heading`` (docs/architecture.md's "Layers" for the core), lowest
    first: ``(name, module names)``.

    Module names are relative to the package (``caches.lru``); ``__init__`` is the package itself. A
    layer's name starts with its rank (``3. write wing``); two rows of one rank are side by side.
    """
    level = heading.split(" ", 1)[0]
    section = text.split(f"\n{heading}\n", 1)[1].split(f"\n{level} ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("|")][2:]  # after the header and rule
    return [(row.split("|")[1].strip(), re.findall(r"`([^`]+)`", row.split("|")[2])) for row in rows]


def layer_violations(graph: dict[str, dict[str, int]], layers: list[tuple[str, list[str]]]) -> list[str]:
    """Imports in ``graph`` (:func:`import_graph`: every import counts, lazy and type-only ones too) that
    run up ``layers``, and modules that no layer places.

    A module belongs to the layer of the longest listed name that is it or a package above it. Layers
    of one rank (their names start with the same number) are side by side: neither imports the other.
    Importing a module runs the ``__init__`` of each package above it: that counts as importing what
    that ``__init__`` imports (nothing, for most packages; a leaf helper, for one whose names are
    imported at first use), unless the importer is inside the package already (Python ran it first).
    The top package's own ``__init__`` (the public API) runs before any module; only its imports are
    checked.
    """
    level = {name: index for index, (_, names) in enumerate(layers) for name in names}
    ranks = [int(m.group()) if (m := re.match(r"\d+", name)) else index for index, (name, _) in enumerate(layers)]

    def layer_of(module: str) -> int | None:
        parts = module.split(".")[1:] or ["__init__"]
        for end in range(len(parts), 0, -1):
            if ".".join(parts[:end]) in level:
                return level[".".join(parts[:end])]
        return None

    out = [f"{module} is in no layer (add it to the Layers table)" for module in graph if layer_of(module) is None]
    for module, edges in sorted(graph.items()):
        mine = layer_of(module)
        if mine is None:
            continue
        for target, line in sorted(edges.items()):
            parts = target.split(".")
            packages = [".".join(parts[:end]) for end in range(2, len(parts))]
            runs = [target] + [p for p in packages if graph.get(p) and p != module and not module.startswith(p + ".")]
            for ran in runs:
                # the target itself, or what running a package's ``__init__`` on the way imports
                reached = [(ran, "imports")] if ran == target else [
                    (dep, f"imports {target}, which runs {ran}, which imports") for dep in sorted(graph[ran])
                ]  # fmt: skip
                for dep, how in reached:
                    theirs = layer_of(dep)
                    if theirs is None or theirs == mine or ranks[theirs] < ranks[mine]:
                        continue
                    beside = ", beside it" if ranks[theirs] == ranks[mine] else ""
                    where = f"{module} (line {line}, layer {layers[mine][0]})"
                    out.append(f"{where} {how} {dep} (layer {layers[theirs][0]}{beside})")
    return out


def test_the_layers_table_places_every_core_module_and_names_only_real_ones():
    layers = documented_layers(ARCHITECTURE.read_text())
    names = [name for _, layer in layers for name in layer]
    modules = {module.removeprefix(PUBLIC).lstrip(".") or "__init__" for module in import_graph(CORE)}
    assert len(layers) > 5
    assert len(names) == len(set(names)), "a module is listed in two layers"
    assert [n for n in names if not any(m == n or m.startswith(n + ".") for m in modules)] == []


def test_no_core_import_runs_up_the_layers():
    """Every import of the core (module level, in a function, under TYPE_CHECKING, ``import_module``)
    goes to its own layer or one below, and so does what every package ``__init__`` it runs imports
    (docs/architecture.md, "Layers")."""
    violations = layer_violations(import_graph(CORE), documented_layers(ARCHITECTURE.read_text()))
    for violation in violations:
        print("layers:", violation)
    assert violations == []


def test_the_layer_check_catches_imports_up_and_through_a_package_init(tmp_path):
    core = tmp_path / "pkg"
    for package in ("low", "high", "box", "quiet"):
        (core / package).mkdir(parents=True)
    (core / "__init__.py").write_text("from pkg.high.top import T\n")  # runs before every module: exempt
    (core / "base.py").write_text("def f():\n    from pkg.high import top\n")  # a lazy import counts
    (core / "low" / "__init__.py").write_text("from pkg.low.a import A\n")
    (core / "low" / "a.py").write_text("from pkg.quiet.deep import D\nimport pkg.base\n")
    (core / "low" / "b.py").write_text("from pkg.low import a\n")  # runs its own package: fine
    (core / "quiet" / "__init__.py").write_text('"""Imports nothing: passing through it costs nothing."""\n')
    (core / "quiet" / "deep.py").write_text("")
    (core / "box" / "__init__.py").write_text("from pkg.box.machine import M\n")  # a package that loads a lot
    (core / "cheap").mkdir()
    (core / "cheap" / "__init__.py").write_text("import pkg.base\n")  # loads only what is below: fine
    (core / "cheap" / "thing.py").write_text("")
    (core / "box" / "item.py").write_text("")
    (core / "box" / "machine.py").write_text("import pkg.high.top\n")
    (core / "high" / "__init__.py").write_text("")
    (core / "high" / "top.py").write_text("")
    (core / "mid.py").write_text("from pkg.low.b import B\nfrom pkg.box.item import I\nimport pkg.cheap.thing\n")
    (core / "stray.py").write_text("")
    (core / "left.py").write_text("import pkg.low.a\n")
    (core / "right.py").write_text("import pkg.left\n")  # a wing importing the one beside it
    layers = [
        ("1. bottom", ["base", "quiet", "box.item", "cheap.thing"]),
        ("2. lower", ["low", "mid"]),
        ("3. left wing", ["left"]),
        ("3. right wing", ["right"]),
        ("4. upper", ["high", "box", "cheap", "__init__"]),
    ]

    assert layer_violations(import_graph(core), layers) == [
        "pkg.stray is in no layer (add it to the Layers table)",
        "pkg.base (line 2, layer 1. bottom) imports pkg.high.top (layer 4. upper)",
        "pkg.mid (line 2, layer 2. lower) imports pkg.box.item, which runs pkg.box, which imports pkg.box.machine"
        " (layer 4. upper)",
        "pkg.right (line 1, layer 3. right wing) imports pkg.left (layer 3. left wing, beside it)",
    ]


def plugin_packages() -> list[Path]:
    return sorted(
        package
        for root in ("plugins", "tests/plugin_projects", "docs/examples")
        for package in (ROOT / root).glob("*/factstream_*")
        if (package / "__init__.py").exists()
    )


#: Where each bundled plugin's layer table is: its page, and the table's heading there.
PLUGIN_LAYERS = {
    "factstream_events": ("docs/plugins/events.md", "## Layers"),
    "factstream_account_data": ("docs/plugins/account_data.md", "## Layers"),
    "factstream_to_device": ("docs/plugins/to_device.md", "## Layers"),
    "factstream_receipts": ("docs/plugins/receipts.md", "## Layers"),
    "factstream_typing": ("docs/plugins/typing.md", "## Layers"),
    "factstream_presence": ("docs/plugins/presence.md", "## Layers"),
    "factstream_caches": ("docs/caches.md", "### Layers of the caches plugin"),
}


def test_every_bundled_plugin_has_a_layer_table():
    assert set(PLUGIN_LAYERS) == bundled_plugin_packages()


def test_the_plugin_packages_are_found_where_they_are():
    """The test plugin projects and the docs' example are checked too (a renamed folder once hid them)."""
    found = {str(p.relative_to(ROOT)).split("/")[0:2][0] for p in plugin_packages()}
    assert found == {"plugins", "tests", "docs"}
    assert len([p for p in plugin_packages() if "plugin_projects" in p.parts]) >= 5


@pytest.mark.parametrize("package", sorted(PLUGIN_LAYERS))
def test_each_bundled_plugins_layer_table_places_every_module_and_no_import_runs_up_it(package):
    doc, heading = PLUGIN_LAYERS[package]
    [path] = (ROOT / "plugins").glob(f"*/{package}")
    layers = documented_layers((ROOT / doc).read_text(), heading)
    graph = import_graph(path)
    names = [name for _, layer in layers for name in layer]
    modules = {module.removeprefix(package).lstrip(".") or "__init__" for module in graph}
    assert len(names) == len(set(names)), f"{doc}: a module is listed in two layers"
    assert [n for n in names if not any(m == n or m.startswith(n + ".") for m in modules)] == [], doc
    violations = layer_violations(graph, layers)
    for violation in violations:
        print("layers:", violation)
    assert violations == []


@pytest.mark.parametrize("package", plugin_packages(), ids=lambda p: str(p.relative_to(ROOT)))
def test_each_plugin_package_has_no_import_cycles(package):
    graph = import_graph(package)
    assert [describe_cycle(cycle, graph) for cycle in import_cycles(graph)] == []


def test_the_new_stream_template_renders_a_plugin_without_import_cycles(tmp_path):
    from factstream.scaffold import StreamPlugin, write_plugin

    write_plugin(StreamPlugin("likes", "who likes what", ("main",), sync=True, export=True), tmp_path / "likes")
    graph = import_graph(tmp_path / "likes" / "factstream_likes")
    assert len(graph) > 3
    assert import_cycles(graph) == []


def test_import_factstream_loads_the_plugin_api_and_registers_no_metrics():
    """``import factstream`` loads what a plugin author needs, not the machinery behind it, and leaves
    Prometheus' default registry as it was (the host registers the core's collectors when it starts);
    importing every module of the core registers none either."""
    script = """
import importlib, json, pkgutil, sys
from prometheus_client import REGISTRY
before = set(REGISTRY._collector_to_names)
import factstream
loaded = sorted(m for m in sys.modules if m.startswith("factstream"))
for module in pkgutil.walk_packages(factstream.__path__, "factstream."):
    if module.name != "factstream.__main__":
        importlib.import_module(module.name)
added = [type(c).__name__ for c in set(REGISTRY._collector_to_names) - before]
print(json.dumps({"loaded": loaded, "added": added}))
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=True)
    result = json.loads(done.stdout.splitlines()[-1])
    loaded = set(result["loaded"])
    assert {f"{PUBLIC}.plugin.api", f"{PUBLIC}.plugin.hookspecs", f"{PUBLIC}.caches.lru"} <= loaded
    machinery = [
        m
        for m in loaded
        if m.startswith(tuple(f"{PUBLIC}.{p}" for p in ("host", "replication", "sync", "export", "testing", "cli")))
        or m in {f"{PUBLIC}.idgen.generator", f"{PUBLIC}.caches.registry", f"{PUBLIC}.plugin.manager"}
    ]
    assert machinery == []
    assert result["added"] == []


# -- every hook has a test -------------------------------------------------------------------------

#: For every hook, a test that exercises it: ``(test file, test function)``. The test must exist and
#: name the hook in its own source or in its module (the plugin source it installs).
HOOK_TESTS = {
    "register_hookspecs": (
        "tests/core/test_plugin_hookspecs.py",
        "test_register_hookspecs_of_the_guide_answers_through_a_route_and_the_host_api",
    ),
    "register_streams": ("tests/core/test_plugins.py", "test_two_streams_claiming_one_sync_key_are_rejected"),
    "register_caches": (
        "tests/replication/test_pipeline.py",
        "test_a_writers_own_rows_reach_its_rows_handlers_locally_in_order_once",
    ),
    "register_invalidations": (
        "tests/replication/test_pipeline.py",
        "test_a_rows_handler_and_a_waiter_after_the_advance_both_see_the_invalidation",
    ),
    "register_rows_handlers": (
        "tests/replication/test_pipeline.py",
        "test_a_rows_handler_gets_its_streams_rows_and_no_other_streams",
    ),
    "register_migrations": (
        "tests/core/test_migrate.py",
        "test_first_revision_of_a_new_plugin_starts_its_branch_on_the_core",
    ),
    "register_export_jobs": ("tests/export/test_cli.py", "test_export_all_runs_every_job_and_prints_a_summary"),
    "register_routes": (
        "tests/host/test_http_api.py",
        "test_a_plugin_route_shadowing_a_core_route_fails_the_start_naming_both",
    ),
    "register_commands": ("tests/core/test_cli.py", "test_plugins_add_commands_to_the_cli"),
    "register_command_handlers": (
        "tests/replication/test_plugin_commands.py",
        "test_over_tcp_a_worker_s_commands_reach_main_in_order_and_main_handles_its_own",
    ),
    "register_settings": (
        "tests/core/test_plugin_settings.py",
        "test_values_come_from_the_file_and_the_environment_overrides_them",
    ),
    "register_requirements": (
        "tests/core/test_plugin_requirements.py",
        "test_a_required_plugin_s_hooks_run_first_and_its_shutdown_last",
    ),
    "startup": ("tests/core/test_plugins.py", "test_startup_failure_names_the_plugin_and_shutdown_runs_all"),
    "shutdown": ("tests/core/test_plugins.py", "test_startup_failure_names_the_plugin_and_shutdown_runs_all"),
}


def test_every_hook_has_a_test():
    assert sorted(HOOK_TESTS) == sorted(HOOKS), "add the new hook's test to HOOK_TESTS"


@pytest.mark.parametrize("hook", sorted(HOOK_TESTS))
def test_the_test_of_each_hook_exists_and_uses_it(hook):
    path, name = HOOK_TESTS[hook]
    module = (ROOT / path).read_text()
    tests = {
        node.name: ast.get_source_segment(module, node) or ""
        for node in ast.walk(ast.parse(module))
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name.startswith("test_")
    }
    assert name in tests, f"{path} has no test {name}"
    assert hook in tests[name] or hook in module, f"{path}::{name} does not use hook {hook}"


# -- sizes: modules a reader can hold, functions a reader can follow -----------------------------------

MAX_MODULE_LINES = 600
MAX_FUNCTION_LINES = 80


def product_modules() -> list[Path]:
    """The core's modules and the bundled plugins' (their migrations aside: generated-style DDL)."""
    roots = [CORE, *sorted((ROOT / "plugins").glob("*/factstream_*"))]
    return [p for root in roots for p in sorted(root.rglob("*.py")) if "migrations" not in p.parts]


def size_problems(path: Path) -> list[str]:
    """A module over :data:`MAX_MODULE_LINES` lines, and each function over :data:`MAX_FUNCTION_LINES`
    lines (decorators included) whose line above is not a comment saying why it is long."""
    text = path.read_text()
    lines = text.splitlines()
    problems = [f"{path.name}: {len(lines)} lines"] if len(lines) > MAX_MODULE_LINES else []
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.end_lineno is not None:
            start = min([d.lineno for d in node.decorator_list] + [node.lineno])
            length = node.end_lineno - start + 1
            above = lines[start - 2].strip() if start >= 2 else ""
            if length > MAX_FUNCTION_LINES and not above.startswith("#"):
                problems.append(f"{path.name}: {node.name} is {length} lines, without a comment saying why")
    return problems


def test_no_product_module_is_over_600_lines_nor_a_function_over_80_without_a_reason():
    problems = [problem for path in product_modules() for problem in size_problems(path)]
    assert problems == []


def test_the_size_check_catches_a_long_module_and_an_unexplained_long_function(tmp_path):
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_FUNCTION_LINES))
    long_function = tmp_path / "long_function.py"
    long_function.write_text(f"def unexplained():\n{body}\n\n\n# long on purpose: a table\ndef explained():\n{body}\n")
    assert size_problems(long_function) == [
        f"long_function.py: unexplained is {MAX_FUNCTION_LINES + 1} lines, without a comment saying why"
    ]
    long_module = tmp_path / "long_module.py"
    long_module.write_text("x = 1\n" * (MAX_MODULE_LINES + 1))
    assert size_problems(long_module) == [f"long_module.py: {MAX_MODULE_LINES + 1} lines"]
