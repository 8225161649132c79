"""Installing plugin distributions for one test: :class:`PluginInstaller` (the ``plugin_installer``
fixture of :mod:`factstream.testing`).

A plugin is installed the way pip would leave it, into a temporary ``site-packages`` put first on
``sys.path``: its package copied (or written from source) and a ``*.dist-info`` with its ``factstream``
entry points, so the manager discovers it through real entry points. ``cleanup`` forgets its modules
and the tables it declared, so the next test imports it afresh.
"""

from __future__ import annotations

import os
import re
import shutil
import sys
import textwrap
import tomllib
from dataclasses import dataclass
from importlib import invalidate_caches
from pathlib import Path

from factstream.db.metadata import metadata
from factstream.plugin.manager import PluginHost, PluginSelection, load_plugins


@dataclass(frozen=True)
class InstalledPlugin:
    """A plugin installed by :class:`PluginInstaller`: its entry-point name and where its files are."""

    name: str
    distribution: str
    module: str
    package_dir: Path


class PluginInstaller:
    """Installs plugin distributions into a temporary ``sys.path`` entry for one test."""

    def __init__(self, root: Path) -> None:
        self.site = root / "site-packages"
        self.site.mkdir(parents=True)
        self.installed: list[InstalledPlugin] = []
        self._tables_before = set(metadata.tables)
        sys.path.insert(0, str(self.site))
        invalidate_caches()

    def from_project(self, project_dir: Path | str) -> InstalledPlugin:
        """Install a plugin project (a directory with ``pyproject.toml`` and its package) by copying it.

        Every ``factstream`` entry point of the project is installed; the first is returned.
        """
        project = Path(project_dir)
        meta = tomllib.loads((project / "pyproject.toml").read_text())["project"]
        eps: dict[str, str] = meta.get("entry-points", {}).get("factstream", {})
        if not eps:
            raise ValueError(f"{project}/pyproject.toml declares no 'factstream' entry point")
        packages = {value.split(":")[0].split(".")[0] for value in eps.values()}
        for pkg in packages:
            source = next((p for p in (project / pkg, project / "src" / pkg) if p.is_dir()), None)
            if source is None:
                raise ValueError(f"package {pkg!r} not found in {project}")
            shutil.copytree(source, self.site / pkg, ignore=shutil.ignore_patterns("__pycache__"))
        self._write_dist_info(meta["name"], meta.get("version", "0.0.0"), eps)
        first_name, first_value = next(iter(eps.items()))
        module = first_value.split(":")[0]
        plugin = InstalledPlugin(first_name, meta["name"], module, self.site / module.split(".")[0])
        self.installed.append(plugin)
        return plugin

    def from_source(
        self,
        name: str,
        source: str,
        *,
        version: str = "1.0.0",
        module: str | None = None,
        files: dict[str, str] | None = None,
        distribution: str | None = None,
    ) -> InstalledPlugin:
        """Install a one-module plugin whose ``__init__.py`` is ``source``.

        ``files`` adds further files inside the package (``{"migrations/__init__.py": ""}``).
        """
        module = module or f"factstream_{name}"
        package = self.site / module
        package.mkdir()
        (package / "__init__.py").write_text(textwrap.dedent(source))
        for rel, text in (files or {}).items():
            target = package / rel
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(textwrap.dedent(text))
        dist = distribution or f"factstream-{name.replace('_', '-')}"
        self._write_dist_info(dist, version, {name: module})
        plugin = InstalledPlugin(name, dist, module, package)
        self.installed.append(plugin)
        return plugin

    def uninstall(self, plugin: InstalledPlugin) -> None:
        """Remove a plugin's package and metadata, as ``pip uninstall`` would."""
        shutil.rmtree(plugin.package_dir, ignore_errors=True)
        for info in self.site.glob(f"{_normalise(plugin.distribution)}-*.dist-info"):
            shutil.rmtree(info)
        self._forget_modules(plugin.module.split(".")[0])
        self.installed.remove(plugin)
        invalidate_caches()

    def env(self) -> dict[str, str]:
        """Environment for a subprocess that should see the installed plugins."""
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(self.site), env.get("PYTHONPATH", "")) if p)
        return env

    def plugin_host(self, *, only_installed: bool = False) -> PluginHost:
        """The core and the plugins loaded now: every installed one (as ``load_plugins()``, honouring
        ``FACTSTREAM_BLOCK_PLUGINS``), or with ``only_installed`` just those this installer installed, so
        that plugins installed in the environment (the bundled ones, in this repository) stay out."""
        if only_installed:
            return load_plugins(PluginSelection(only=frozenset(p.name for p in self.installed)))
        return load_plugins()

    def _write_dist_info(self, dist: str, version: str, eps: dict[str, str]) -> None:
        info = self.site / f"{_normalise(dist)}-{version}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")
        lines = ["[factstream]"] + [f"{k} = {v}" for k, v in eps.items()]
        (info / "entry_points.txt").write_text("\n".join(lines) + "\n")
        invalidate_caches()

    @staticmethod
    def _forget_modules(top: str) -> None:
        for mod in [m for m in sys.modules if m == top or m.startswith(top + ".")]:
            del sys.modules[mod]

    def cleanup(self) -> None:
        for plugin in list(self.installed):
            self._forget_modules(plugin.module.split(".")[0])
        if str(self.site) in sys.path:
            sys.path.remove(str(self.site))
        # Plugins declare their tables on the shared MetaData at import; the next test re-imports them.
        for name in set(metadata.tables) - self._tables_before:
            metadata.remove(metadata.tables[name])
        invalidate_caches()


def _normalise(dist: str) -> str:
    return re.sub(r"[-_.]+", "_", dist).lower()
