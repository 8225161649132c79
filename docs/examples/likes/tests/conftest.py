"""Install this project through its entry point for every test, so it need not be installed."""

from pathlib import Path

import pytest

PROJECT = Path(__file__).resolve().parent.parent


@pytest.fixture(autouse=True)
def likes_plugin(plugin_installer):
    return plugin_installer.from_project(PROJECT)
