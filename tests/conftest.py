"""Shared test helpers for factstream's own suite (plugin authors get theirs from factstream.testing)."""

from __future__ import annotations

import contextlib
import io
import logging
import os
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from unittest import mock

import pytest

from tests import class_archive

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
    "tests/test_getting_started.py",
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


def pytest_configure(config: pytest.Config) -> None:
    # The suite's Spark JVMs: quick flags and, where ./dev test made one, a class-data archive
    # (tests/class_archive.py); the standalone cluster's master and worker take the flags alone.
    os.environ["PYSPARK_SUBMIT_ARGS"] = class_archive.submit_args(class_archive.archive_path())
    os.environ["SPARK_DAEMON_JAVA_OPTS"] = class_archive.QUICK_JVM


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
        return subprocess.run(
            [sys.executable, "-m", "factstream", *args],
            capture_output=True,
            text=True,
            env=_cli_environ(env),
            cwd=cwd or tmp_path,
            timeout=120,
        )

    return run


def _cli_environ(env: dict[str, str] | None) -> dict[str, str]:
    """The environment of a CLI run in a test (``env``, default ``os.environ``): no colours, and tables
    200 columns wide unless the test chose a width (a pytest-xdist worker's environment says 80)."""
    environ = dict(env if env is not None else os.environ)
    if environ.get("COLUMNS") == os.environ.get("COLUMNS"):
        environ["COLUMNS"] = "200"
    environ["NO_COLOR"] = "1"
    return environ


@pytest.fixture
def cli(tmp_path: Path) -> Callable[..., subprocess.CompletedProcess[str]]:
    """Run ``factstream ARGS`` in this process, as :func:`run_cli` runs it in a subprocess: the same entry
    point (``factstream.cli.main``), environment (``env``, default ``os.environ``, with ``COLUMNS=200`` and
    ``NO_COLOR``) and working directory (default: an empty temporary directory); the same result (exit
    code, stdout, stderr). For what is not about the process: help texts, usage and config errors,
    ``tokens``, ``migrate``. Exit codes at a signal, environment inheritance and ``run`` keep
    :func:`run_cli`. Plugins the test installed (``plugin_installer``) are seen, as they are in-process.
    ``columns=N`` sets the terminal's width whatever the environment says (a pytest-xdist worker's says 80,
    which ``env`` inherits and which is therefore taken as nobody's choice)."""

    def run(
        *args: str, env: dict[str, str] | None = None, cwd: Path | None = None, columns: int | None = None
    ) -> subprocess.CompletedProcess[str]:
        environ = _cli_environ(env)
        if columns is not None:
            environ["COLUMNS"] = str(columns)
        stdout, stderr = io.StringIO(), io.StringIO()
        with _cli_invocation(environ, cwd or tmp_path, stdout, stderr) as main:
            code = 0
            try:
                main(list(args))
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
                if isinstance(exc.code, str):
                    stderr.write(exc.code + "\n")
        return subprocess.CompletedProcess(["factstream", *args], code, stdout.getvalue(), stderr.getvalue())

    return run


@contextlib.contextmanager
def _cli_invocation(
    environ: dict[str, str], cwd: Path, stdout: io.StringIO, stderr: io.StringIO
) -> Iterator[Callable[[list[str]], None]]:
    """One CLI invocation's process-wide state set up and put back: the environment, the working
    directory, sys.stdout/sys.stderr, the CLI's consoles' width, its per-invocation state and the
    plugin commands it adds to its app, and the logging it configures."""
    from factstream import cli as cli_module

    app = cli_module.app
    commands, groups = list(app.registered_commands), list(app.registered_groups)
    widths = cli_module.out._width, cli_module.err._width  # None: Rich measures the terminal each time
    loggers = _logging_state()
    width = int(environ["COLUMNS"]) if environ.get("COLUMNS", "").isdigit() else 200
    cli_module.state = cli_module.State()
    cli_module.out.width = cli_module.err.width = width
    try:
        with (
            mock.patch.dict(os.environ, environ, clear=True),
            contextlib.chdir(cwd),
            contextlib.redirect_stdout(stdout),
            contextlib.redirect_stderr(stderr),
        ):
            yield cli_module.main
    finally:
        cli_module.state = cli_module.State()
        app.registered_commands[:], app.registered_groups[:] = commands, groups
        cli_module.out._width, cli_module.err._width = widths
        _restore_logging(loggers)


def _logging_state() -> dict[str, tuple[list[logging.Handler], int, bool]]:
    """Every logger's handlers, level and ``propagate`` (the root's under ``""``)."""
    named = [logging.getLogger(n) for n in list(logging.Logger.manager.loggerDict)]
    return {
        logger.name if logger is not logging.root else "": (list(logger.handlers), logger.level, logger.propagate)
        for logger in [logging.root, *named]
        if isinstance(logger, logging.Logger)
    }


def _restore_logging(saved: dict[str, tuple[list[logging.Handler], int, bool]]) -> None:
    """Put back what :func:`_logging_state` saw; loggers created since lose what was added to them."""
    for name, now in _logging_state().items():
        handlers, level, propagate = saved.get(name, ([], logging.NOTSET, True))
        logger = logging.getLogger(name or None)
        if now != (handlers, level, propagate):
            logger.handlers[:] = handlers
            logger.setLevel(level)
            logger.propagate = propagate
