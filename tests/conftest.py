"""Shared test helpers for factstream's own suite (plugin authors get theirs from factstream.testing)."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
TEST_PLUGINS = ROOT / "tests" / "plugin_projects"


@pytest.fixture
def notes_project() -> Path:
    """The trivial test plugin project under tests/plugin_projects/notes."""
    return TEST_PLUGINS / "notes"


@pytest.fixture
def run_cli(tmp_path: Path) -> Callable[..., subprocess.CompletedProcess[str]]:
    """Run the real ``factstream`` command in a subprocess (cwd: an empty temporary directory)."""

    def run(*args: str, env: dict[str, str] | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
        full_env = dict(env if env is not None else os.environ)
        full_env.setdefault("COLUMNS", "200")
        full_env["NO_COLOR"] = "1"
        return subprocess.run(
            [sys.executable, "-m", "factstream", *args],
            capture_output=True,
            text=True,
            env=full_env,
            cwd=cwd or tmp_path,
            timeout=120,
        )

    return run
