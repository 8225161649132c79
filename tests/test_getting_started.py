"""Every command docs/getting-started.md shows, run as its reader runs it.

The reader has run the README's command (``./dev demo`` or ``./dev test``) in the checkout: ``.venv`` is
synced, and ``uv`` is on their PATH (``./dev`` says how when it is not). The guide's commands are read from
its ``sh`` blocks; every one of them must be named in :data:`CHECKS` with how it is checked, so a
command added to the guide without a check fails :func:`test_every_command_of_the_guide_is_checked`.
Most run here, as shown; the ones that start the demo or the whole suite are the commands other tests
run (named below), and the staged ``./dev test`` runs are narrowed to one file through
``PYTEST_ADDOPTS``, which pytest adds to every stage's arguments.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.demo.test_demo import fresh_copy

ROOT = Path(__file__).resolve().parents[1]
GUIDE = ROOT / "docs" / "getting-started.md"
PLUGINS = sorted(p.name for p in (ROOT / "plugins").iterdir() if (p / "pyproject.toml").is_file())


def guide_commands() -> list[str]:
    """Each command line of the guide's ``sh`` blocks, without its trailing comment."""
    commands = []
    for block in re.findall(r"^```sh\n(.*?)^```", GUIDE.read_text(), re.MULTILINE | re.DOTALL):
        for line in block.splitlines():
            command = re.sub(r"\s+#\s.*$", "", line).strip()
            if command:
                commands.append(command)
    return commands


def reader_env(**extra: str) -> dict[str, str]:
    """The reader's shell: this run's environment less what the test run itself sets (its worker's ports,
    pytest's options, the outer run's virtual environment)."""
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("PYTEST_", "FACTSTREAM_PORTS", "VIRTUAL_ENV", "UV_PROJECT", "PYTHONPATH"))
    }
    uv = os.environ.get("UV") or shutil.which("uv")
    if uv is None:
        pytest.fail("uv is not on PATH: the guide's uv commands cannot run (./dev puts it there)")
    env["PATH"] = os.pathsep.join([str(Path(uv).parent), env.get("PATH", "")])
    env.update(COLUMNS="200", **extra)
    return env


def sh(script: str, *, cwd: Path, env: dict[str, str], timeout: float = 600) -> str:
    """``script`` in bash, ``-e``: the output, or a failure that shows it."""
    done = subprocess.run(
        ["bash", "-ec", script], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False
    )
    output = done.stdout + done.stderr
    assert done.returncode == 0, f"{script}\nexit {done.returncode}:\n{output[-6000:]}"
    return output


def staged(selection: str, tmp_path: Path) -> dict[str, str]:
    """The reader's environment with every stage of ``./dev test`` narrowed to ``selection``."""
    return reader_env(PYTEST_ADDOPTS=f"-p no:cacheprovider --basetemp={tmp_path / 'inner'} {selection}")


# -- the checks --------------------------------------------------------------------------------------


def check_uv_install(commands: list[str], tmp_path: Path, database_url: str) -> None:
    output = sh("\n".join(commands), cwd=ROOT, env=reader_env())
    assert "Usage: factstream" in output, output
    for name in ("run", "migrate", "demo", "export", "new-stream"):
        assert re.search(rf"^│ {name} ", output, re.MULTILINE), output


def check_pip_install(commands: list[str], tmp_path: Path, database_url: str) -> None:
    """The pip route, in a fresh copy of the checkout (``pip install .`` builds there), every plugin for
    ``NAME``; then the installed command lists them."""
    copy = fresh_copy(tmp_path / "checkout").root
    script = []
    for command in commands:
        if "NAME" in command:
            script += [command.replace("NAME", name) for name in PLUGINS]
        else:
            script.append(command)
    env = reader_env(PIP_DISABLE_PIP_VERSION_CHECK="1", PIP_PROGRESS_BAR="off", PIP_NO_COMPILE="1")
    output = sh("\n".join([*script, "factstream plugins"]), cwd=copy, env=env, timeout=900)
    assert "Usage: factstream" in output, output
    for name in PLUGINS:
        assert re.search(rf"^│ {re.escape(name.replace('-', '_'))} ", output, re.MULTILINE), output
    installed = sh(". .venv/bin/activate\npython -c 'import factstream; print(factstream.__file__)'", cwd=copy, env=env)
    assert "/.venv/lib/" in installed, installed  # the copy's environment, not the checkout's


def check_own_postgres(commands: list[str], tmp_path: Path, database_url: str) -> None:
    """The guide's URL names a database of its own; here it is a fresh one on the test server."""
    [command] = commands
    url = re.search(r"FACTSTREAM_DATABASE__URL=(\S+)", command)
    assert url, command
    output = sh(command.replace(url.group(1), database_url), cwd=ROOT, env=reader_env())
    status = sh(f"FACTSTREAM_DATABASE__URL={database_url} uv run factstream migrate status", cwd=ROOT, env=reader_env())
    assert "needs upgrade" not in status and "factstream" in status, output + status


def check_dev_test(commands: list[str], tmp_path: Path, database_url: str) -> None:
    [command] = commands
    if command == "./dev test --help":
        output = sh(command, cwd=ROOT, env=reader_env())
        assert "usage: ./dev test" in output and "--fast" in output and "serial" in output, output
    elif command == "./dev test":
        output = sh(command, cwd=ROOT, env=staged("tests/sync/test_notifier.py", tmp_path))
        for stage in ("stage 1 of 3", "stage 2 of 3", "stage 3 of 3", "dev: all 3 stages passed"):
            assert stage in output, output
    elif command == "./dev test --fast":
        output = sh(command, cwd=ROOT, env=staged("tests/sync/test_notifier.py", tmp_path))
        assert "--fast: the e2e and scale tests are left out" in output and "all 2 stages passed" in output, output
    elif command == "./dev test -k migrate -n 2":
        # Narrowed to one file: over the whole suite, -k migrate selects this test too.
        output = sh(command, cwd=ROOT, env=staged("tests/core/test_migrate.py", tmp_path))
        assert re.search(r"\b[1-9]\d* passed\b", output) and "created: 2/2 workers" in output, output[-3000:]
    else:
        output = sh(command, cwd=ROOT, env=reader_env())
        assert re.search(r"\b[1-9]\d* passed\b", output) and " failed" not in output, output[-3000:]


def elsewhere(test: str) -> Callable[[list[str], Path, str], None]:
    """A command another test runs as the guide shows it: ``test`` must exist."""

    def check(commands: list[str], tmp_path: Path, database_url: str) -> None:
        path, _, name = test.partition("::")
        assert re.search(rf"^(    )?def {name.split('::')[-1]}\(", (ROOT / path).read_text(), re.MULTILINE), test

    check.__doc__ = test
    return check


#: Each command of the guide, grouped as the guide's blocks group them, with its check.
CHECKS: dict[tuple[str, ...], Callable[[list[str], Path, str], None]] = {
    ("uv sync --all-packages --inexact", "uv run factstream --help"): check_uv_install,
    (
        "python3 -m venv .venv",
        ". .venv/bin/activate",
        "pip install .",
        "pip install ./plugins/NAME",
        "factstream --help",
    ): check_pip_install,
    # The reader's own clone: the demo's tests run on what a fresh clone holds; ./dev demo is ./dev's
    # sync step (tests/core/test_dev_script.py), then `factstream demo`, which they run.
    ("git clone <the repository> factstream && cd factstream",): elsewhere("tests/demo/test_demo.py::fresh_copy"),
    ("./dev demo",): elsewhere("tests/demo/test_demo.py::full_run"),
    ("./dev demo --keep-running --no-export",): elsewhere(
        "tests/demo/test_demo.py::test_keep_running_serves_the_printed_commands"
    ),
    (
        "FACTSTREAM_DATABASE__URL=postgresql://postgres@127.0.0.1:5432/factstream uv run factstream migrate",
    ): check_own_postgres,
    ("./dev test",): check_dev_test,
    ("./dev test --fast",): check_dev_test,
    ("./dev test tests/sync/test_notifier.py",): check_dev_test,
    ("./dev test -k migrate -n 2",): check_dev_test,
    ("./dev test --help",): check_dev_test,
}


def test_every_command_of_the_guide_is_checked():
    named = [command for group in CHECKS for command in group]
    assert guide_commands() == named, "docs/getting-started.md's commands changed: update CHECKS"


@pytest.mark.slow
@pytest.mark.parametrize("commands", list(CHECKS), ids=lambda group: group[0][:40])
def test_the_guides_commands_work_as_shown(commands, tmp_path, fresh_database):
    CHECKS[commands](list(commands), tmp_path, fresh_database)
