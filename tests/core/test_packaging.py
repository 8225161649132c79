"""Packaging: the wheel ships migrations, the templates `factstream new-stream` renders, and py.typed."""

from __future__ import annotations

import shutil
import subprocess
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


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
    assert "factstream/_templates/stream-plugin/pyproject.toml.mako" in names
    assert "factstream/_templates/stream-plugin/dot_gitignore.mako" in names
    assert "factstream/py.typed" in names  # plugins type-check against the public API
