"""Architecture rules, checked on the source: plugins use only the public API; the core imports no plugin.

This is the project's import contract (an equivalent of import-linter that also covers plugin
projects that are not installed, such as the test plugins and the templates).
"""

from __future__ import annotations

import ast
import inspect
import re
from pathlib import Path

import pytest

import factstream
from factstream.plugin import hookspecs

ROOT = Path(__file__).resolve().parent.parent
CORE = ROOT / "framework" / "factstream"
PLUGIN_ROOTS = [ROOT / "plugins", ROOT / "tests" / "plugins", ROOT / "templates"]
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


@pytest.mark.parametrize("transport", ["tcp.py", "redis.py"])
def test_transports_import_the_codec_not_the_reader(transport):
    assert f"{PUBLIC}.replication.handler" not in core_imports(REPLICATION / transport)
