"""Packaging: the wheel ships migrations and templates; the template renders a working plugin."""

from __future__ import annotations

import shutil
import subprocess
import zipfile
from pathlib import Path

import pytest

from factstream.migrate import Migrator
from factstream.plugin.manager import load_plugins
from factstream.scaffold import render_stream_plugin

ROOT = Path(__file__).resolve().parents[2]


def test_rendered_template_is_a_plugin_that_loads_and_migrates(tmp_path, plugin_installer, fresh_database):
    project = render_stream_plugin("page_views", tmp_path / "page-views", "pages people looked at")
    plugin_installer.from_project(project)

    host = load_plugins()
    migrator = Migrator(fresh_database, host)
    migrator.upgrade()

    assert host.plugins["page_views"].distribution == "factstream-page-views"
    assert host.registry.streams.get("page_views").row_fields == ("key",)
    assert {s.branch: s.current for s in migrator.status()}["page_views"] == "page_views_0001"
    done = subprocess.run(["ruff", "check", "--no-cache", str(project)], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout


@pytest.mark.slow
def test_wheel_contains_migrations_and_templates(tmp_path):
    uv = shutil.which("uv")
    if uv is None:
        pytest.skip("uv is not installed")
    subprocess.run([uv, "build", "--wheel", "--out-dir", str(tmp_path), str(ROOT)], check=True, capture_output=True)
    [wheel] = tmp_path.glob("factstream-*.whl")

    names = zipfile.ZipFile(wheel).namelist()

    assert "factstream/_migrations/env.py" in names
    assert "factstream/_migrations/versions/fs_core_0001_stream_positions.py" in names
    assert "factstream/_templates/stream-plugin/pyproject.toml.tmpl" in names
