"""Logs of the ``factstream`` command: unwrapped lines when stderr is a file or a pipe.

Rich wraps what it prints to the console's width, 80 columns when stderr is not a terminal, which
split long log lines and tracebacks in log files. Off a terminal every record is one plain line.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from factstream.testing import PluginInstaller

LONG_MESSAGE = "a long warning that must stay on one line: " + "x" * 300
LONG_REASON = "a long reason that must stay on one line: " + "y" * 200

CHATTY = f"""
import logging

import factstream
from factstream import CommandSpec

log = logging.getLogger("factstream_chatty")


def chatty() -> None:
    log.warning({LONG_MESSAGE!r})
    try:
        raise ValueError({LONG_REASON!r})
    except ValueError:
        log.exception("the chatty command failed")


@factstream.hookimpl
def register_commands(register):
    register(CommandSpec(name="chatty", app=chatty, help="Log a long line and a traceback."))
"""


def run_chatty(plugin_installer: PluginInstaller, tmp_path: Path, stderr_to: str) -> str:
    """Run ``factstream chatty`` as a service would (no terminal, no COLUMNS); return its stderr."""
    plugin_installer.from_source("chatty", CHATTY)
    env = {k: v for k, v in plugin_installer.env().items() if k not in {"COLUMNS", "LINES"}}
    args = [sys.executable, "-m", "factstream", "chatty"]
    if stderr_to == "pipe":
        result = subprocess.run(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env, cwd=tmp_path)
        assert result.returncode == 0, result.stderr
        return result.stderr.decode()
    log_path = tmp_path / "factstream.log"
    with log_path.open("wb") as log:
        result = subprocess.run(args, stdout=subprocess.DEVNULL, stderr=log, env=env, cwd=tmp_path)
    stderr = log_path.read_text()
    assert result.returncode == 0, stderr
    return stderr


@pytest.mark.parametrize("stderr_to", ["pipe", "file"])
def test_a_long_log_record_arrives_on_one_line_with_its_level_and_logger(
    plugin_installer: PluginInstaller, tmp_path: Path, stderr_to: str
) -> None:
    lines = run_chatty(plugin_installer, tmp_path, stderr_to).splitlines()

    [record] = [line for line in lines if "a long warning" in line]
    assert record.endswith(f" WARNING factstream_chatty: {LONG_MESSAGE}"), record


@pytest.mark.parametrize("stderr_to", ["pipe", "file"])
def test_a_logged_traceback_arrives_intact_as_python_prints_it(
    plugin_installer: PluginInstaller, tmp_path: Path, stderr_to: str
) -> None:
    lines = run_chatty(plugin_installer, tmp_path, stderr_to).splitlines()

    record = " ERROR factstream_chatty: the chatty command failed"
    start = next(i for i, line in enumerate(lines) if line.endswith(record))
    traceback = lines[start + 1 :]
    assert traceback[0] == "Traceback (most recent call last):"
    assert traceback[1].startswith('  File "') and traceback[1].endswith(", in chatty"), traceback[1]
    assert traceback[2] == f"    raise ValueError({LONG_REASON!r})"
    assert traceback[-1] == f"ValueError: {LONG_REASON}"
