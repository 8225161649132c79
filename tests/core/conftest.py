"""The core's tests describe the core with the plugins each test installs, whatever else is installed.

The bundled plugins (plugins/*) are installed in the development environment, which would add their
streams and migration branches to what these tests see; they are blocked here (the operator's
``FACTSTREAM_BLOCK_PLUGINS`` switch, which subprocesses inherit too).
"""

from __future__ import annotations

import os
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def bundled_plugin_names() -> list[str]:
    names = []
    for project in sorted((ROOT / "plugins").glob("*/pyproject.toml")):
        meta = tomllib.loads(project.read_text())["project"]
        names += list(meta.get("entry-points", {}).get("factstream", {}))
    return names


@pytest.fixture(autouse=True)
def _without_bundled_plugins(monkeypatch: pytest.MonkeyPatch) -> None:
    blocked = [n for n in os.environ.get("FACTSTREAM_BLOCK_PLUGINS", "").split(",") if n]
    monkeypatch.setenv("FACTSTREAM_BLOCK_PLUGINS", ",".join([*blocked, *bundled_plugin_names()]))
