"""Rendered plugins, for real: their own test suites pass, installed or not, alone or side by side.

The first test runs each combination of ``new-stream``'s options through the generated tests in this
environment (the generated conftest installs the project through its entry point for the run). The
second builds a fresh virtual environment as a plugin author would (``uv venv``, ``uv pip install -e``),
with two generated plugins installed next to factstream and the test tools their README names
(``factstream[testing]``), and runs everything there.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from factstream.scaffold import StreamPlugin, write_plugin
from factstream.testing import HostCluster, connect

ROOT = Path(__file__).resolve().parents[2]


def run(args: list[str], cwd: Path, env: dict[str, str] | None = None, timeout: float = 600) -> str:
    """Run a command; fail the test with its output unless it succeeds. Returns stdout and stderr."""
    done = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    output = done.stdout + done.stderr
    assert done.returncode == 0, f"{' '.join(args)} exited {done.returncode}:\n{output[-6000:]}"
    return output


def passed(output: str) -> int:
    """The number of passed tests pytest's summary line reports."""
    summary = [line for line in output.splitlines() if " passed" in line][-1]
    assert "failed" not in summary and "error" not in summary, summary
    return int(summary.split(" passed")[0].split()[-1])


@pytest.mark.slow
@pytest.mark.parametrize(
    ("sync", "export", "writers"),
    [
        (True, True, ("main",)),
        (True, False, ("main", "worker1")),
        (False, True, ("worker1",)),  # the stream is written by an instance that is not main
        (False, False, ("main",)),
    ],
    ids=["sync-export", "sync-two-writers", "export-worker-writes", "neither"],
)
def test_every_combination_passes_its_own_tests(tmp_path, sync, export, writers):
    plugin = StreamPlugin("likes", "who likes what", writers, sync, export)
    project = tmp_path / "factstream-likes"
    write_plugin(plugin, project)
    # The fullest plugin's tests also run as the template's README says to, on pytest-xdist workers.
    parallel = ["-n", "2"] if sync and export else []
    output = run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *parallel, "tests"], cwd=project)
    # 5 bad inputs, entry point, migrations, replication, misdirected, settings x2; + sync; + export
    assert passed(output) == 11 + sync + export, output


def install(args: list[str], cwd: Path, env: dict[str, str]) -> str:
    """A ``uv pip install`` (or a shell command running one), from uv's cache first (``UV_OFFLINE``), then
    from the index if the cache cannot satisfy it.

    Where the index serves files without caching headers (as some mirrors do), uv takes each download
    as new: every ``uv pip install`` of factstream fetched pyspark's 450 MB source again and rebuilt it
    (25 s). The suite's own ``uv sync`` has put everything these installs need in the cache; a fresh
    machine whose cache lacks something still installs from the index.
    """
    done = subprocess.run(args, cwd=cwd, env={**env, "UV_OFFLINE": "1"}, capture_output=True, text=True, timeout=600)
    return done.stdout + done.stderr if done.returncode == 0 else run(args, cwd, env)


def _uv() -> str:
    uv = os.environ.get("UV") or shutil.which("uv")
    if uv is None:
        if os.environ.get("FACTSTREAM_REQUIRE_SERVICES"):
            pytest.fail("uv is needed to build a fresh virtual environment and is not on PATH")
        pytest.skip("uv is not installed")
    return uv


@pytest.mark.slow
def test_two_plugins_installed_in_a_fresh_environment_migrate_replicate_and_pass(tmp_path, fresh_database):
    uv = _uv()
    venv = tmp_path / "venv"
    python = str(venv / "bin" / "python")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VIRTUAL_ENV", "UV_PROJECT", "PYTHONPATH"))}
    env.update(VIRTUAL_ENV=str(venv), PATH=f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}", COLUMNS="200")
    run([uv, "venv", "-q", "--python", sys.executable, str(venv)], cwd=tmp_path, env=env)
    install([uv, "pip", "install", "-q", "--python", python, "-e", str(ROOT)], tmp_path, env)

    # The command as a plugin author runs it, from the fresh environment.
    run(["factstream", "new-stream", "likes", "--description", "who likes what"], cwd=tmp_path, env=env)
    run(
        ["factstream", "new-stream", "reactions", "--writers", "main,worker1", "--no-export"],
        cwd=tmp_path,
        env=env,
    )
    likes, reactions = tmp_path / "factstream-likes", tmp_path / "factstream-reactions"
    install(
        [uv, "pip", "install", "-q", "--python", python, "-e", str(likes), "-e", str(reactions), "mypy>=1.11"],
        tmp_path,
        env,
    )
    # The tests' tools, installed as the generated README says (factstream's testing extra), and nothing else.
    readme = (likes / "README.md").read_text()
    command = re.search(r"^## Test\n.*?```sh\n(uv pip install [^\n#]+?)\s*(#[^\n]*)?\n", readme, re.M | re.S)
    assert command is not None and "factstream[testing]" in command.group(1), readme
    install(["bash", "-c", command.group(1)], likes, env)

    listed = run(["factstream", "plugins"], cwd=tmp_path, env=env)
    for name in ("likes", "reactions"):
        assert any(f" {name} " in line and f"factstream_{name}" in line for line in listed.splitlines()), listed

    migrated = run(["factstream", "migrate"], cwd=tmp_path, env={**env, "FACTSTREAM_DATABASE__URL": fresh_database})
    assert "likes" in migrated and "reactions" in migrated, migrated
    with connect(fresh_database) as conn:
        tables = {r[0] for r in conn.execute("SELECT tablename FROM pg_tables WHERE schemaname = 'public'")}
    assert {"likes", "reactions"} <= tables

    # Each suite runs against the installed plugins (both loaded in every host it starts).
    assert passed(run([python, "-m", "pytest", "-q", "-p", "no:cacheprovider"], cwd=likes, env=env)) == 13
    assert passed(run([python, "-m", "pytest", "-q", "-p", "no:cacheprovider"], cwd=reactions, env=env)) == 12
    # One mypy cache for both packages, new in this test: the first check starts from nothing, and the
    # second reuses what the first found of factstream and its dependencies (about 15 s), not its own.
    mypy_cache = str(tmp_path / "mypy-cache")
    for project, package in ((likes, "factstream_likes"), (reactions, "factstream_reactions")):
        run([sys.executable, "-m", "ruff", "check", "--no-cache", "."], cwd=project)
        run([sys.executable, "-m", "ruff", "format", "--no-cache", "--check", "."], cwd=project)
        run([python, "-m", "mypy", "--strict", "--cache-dir", mypy_cache, package], cwd=project, env=env)


def test_workspace_puts_the_plugin_in_the_checkout_and_its_uv_workspace(run_cli, tmp_path):
    checkout = tmp_path / "checkout"
    (checkout / "framework").mkdir(parents=True)
    (checkout / "pyproject.toml").write_text(
        '[project]\nname = "factstream"\nversion = "0"\n\n[tool.uv.workspace]\nmembers = ["extras/*"]\n'
    )
    result = run_cli("new-stream", "votes", "--workspace", cwd=checkout / "framework")
    assert result.returncode == 0, result.stderr
    project = checkout / "plugins" / "votes"
    assert (project / "factstream_votes" / "rows.py").is_file()
    assert "factstream = { workspace = true }" in (project / "pyproject.toml").read_text()
    assert 'members = ["extras/*", "plugins/votes"]' in (checkout / "pyproject.toml").read_text()
    assert "uv sync --all-packages --inexact" in result.stdout  # keeps what was installed by hand, as ./dev does
    # A glob that covers it already is left alone.
    (checkout / "pyproject.toml").write_text(
        '[project]\nname = "factstream"\nversion = "0"\n\n[tool.uv.workspace]\nmembers = ["plugins/*"]\n'
    )
    assert run_cli("new-stream", "clicks", "--workspace", cwd=checkout).returncode == 0
    assert 'members = ["plugins/*"]\n' in (checkout / "pyproject.toml").read_text()
    assert (checkout / "plugins" / "clicks" / "pyproject.toml").is_file()


def test_a_missing_httpx_is_named_with_what_to_install(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "httpx", None)  # as if not installed
    cluster = HostCluster(tmp_path, database=lambda: "postgresql:///unused")
    with pytest.raises(ModuleNotFoundError, match=re.escape('uv pip install "factstream[testing]"')):
        cluster.client("main")


def test_without_pytest_asyncio_host_cluster_says_what_to_install(tmp_path):
    """pytest-asyncio blocked (``-p no:asyncio``) and unimportable: the fixture fails with the fix."""
    shadow = tmp_path / "shadow"
    (shadow / "pytest_asyncio").mkdir(parents=True)
    (shadow / "pytest_asyncio" / "__init__.py").write_text("raise ImportError('pytest-asyncio is not installed')\n")
    (tmp_path / "test_uses_cluster.py").write_text("def test_it(host_cluster):\n    pass\n")
    env = {**os.environ, "PYTHONPATH": str(shadow)}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:asyncio", "-p", "no:cacheprovider", "test_uses_cluster.py"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 1, done.stdout + done.stderr
    assert "the host_cluster fixture is async and needs pytest-asyncio" in done.stdout, done.stdout
    assert 'uv pip install "factstream[testing]"' in done.stdout, done.stdout
