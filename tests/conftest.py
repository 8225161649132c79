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

# -- tiers (docs/getting-started.md, "Running the tests"; ./dev test --help) ------------------------------
#
# e2e: the test runs something outside its own process: factstream processes, a CLI subprocess, a fresh
# environment (uv, a wheel, ./dev), Spark, the browser, the docs build. scale: soaks, sweeps and the
# scale tests. ./dev test --fast leaves both out; ./dev test and CI run everything.

#: A test using one of these fixtures starts processes.
E2E_FIXTURES = frozenset({"process_cluster", "run_cli", "redis_server", "spark", "copy"})
#: Folders and files whose tests run something outside the test's process.
E2E_PATHS = (
    "tests/export/",
    "tests/demo/",
    "tests/scaffold/",
    "tests/host/test_dashboard_browser.py",
    "tests/test_docs_site.py",
    "tests/core/test_packaging.py",
    "tests/core/test_dev_script.py",
    "tests/core/test_interrupt.py",
    "tests/core/test_embedded.py",
    "tests/core/test_cli_logging.py",
    "tests/core/test_rows_typing.py",
    "tests/core/test_writing_plugins_guide.py",
    "tests/bundled/events/test_events_doc.py",
    "tests/idgen/test_concurrency.py",
    "tests/replication/test_tls.py",
)
#: The soaks and the scale tests; and, by name, the sweeps (``test_sweep_...``).
SCALE_PATHS = (
    "tests/bundled/events/test_sync_soak.py",
    "tests/bundled/events/test_state_scale.py",
    "tests/bundled/events/test_pagination_scale.py",
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark every test with its tiers (``e2e``, ``scale``), by the rules above."""
    for item in items:
        path = Path(str(item.fspath)).resolve().relative_to(ROOT).as_posix()
        if path.endswith("_processes.py") or path.startswith(E2E_PATHS) or E2E_FIXTURES & set(item.fixturenames):
            item.add_marker(pytest.mark.e2e)
        if path.startswith(SCALE_PATHS) or item.name.startswith("test_sweep_"):
            item.add_marker(pytest.mark.scale)


@pytest.fixture
def notes_project() -> Path:
    """The trivial test plugin project under tests/plugin_projects/notes."""
    return TEST_PLUGINS / "notes"


@pytest.fixture
def run_cli(tmp_path: Path) -> Callable[..., subprocess.CompletedProcess[str]]:
    """Run the real ``factstream`` command in a subprocess (cwd: an empty temporary directory)."""

    def run(*args: str, env: dict[str, str] | None = None, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
        full_env = dict(env if env is not None else os.environ)
        if full_env.get("COLUMNS") == os.environ.get("COLUMNS"):
            # Not chosen by the test (a pytest-xdist worker's environment says 80): wide enough for tables.
            full_env["COLUMNS"] = "200"
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
