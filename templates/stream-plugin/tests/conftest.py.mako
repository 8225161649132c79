"""Fixtures: the plugin as installed (``uv pip install -e .``), or, when it is not, this checkout.

Either way factstream finds it the way it finds every plugin: through its ``factstream`` entry point.
The other fixtures used by the tests (``host_cluster``, ``fresh_database``, ``plugin_installer``) come
from ``factstream.testing``, a pytest plugin installed with factstream.
"""

from importlib.metadata import entry_points
from pathlib import Path

import pytest
from factstream.testing import PluginInstaller

PROJECT = Path(__file__).resolve().parent.parent


@pytest.fixture(autouse=True)
def plugin_env(plugin_installer: PluginInstaller) -> dict[str, str]:
    """The environment of a ``factstream`` command that sees this plugin."""
    if "${name}" not in {ep.name for ep in entry_points(group="factstream")}:
        plugin_installer.from_project(PROJECT)
    return plugin_installer.env()
