"""``factstream export`` interrupted, and with nothing to do (issue 33), as real processes.

Ctrl-C (SIGINT) or SIGTERM, while the JVM starts or while a range is written, ends the export with
one line and exit code 130, and no Spark process of the run is left: each run gets a marker on its
JVM's command line (``SPARK_SUBMIT_OPTS``), looked for among all processes afterwards. A rerun exports
every fact exactly once. An export with nothing new, and the job listing, start no JVM at all: they run
with ``JAVA_HOME`` pointing at a ``java`` that only records that it was called.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import psutil
import pyarrow.parquet as pq
import pytest

from factstream.testing import wait_until
from tests.export import test_cli

pytestmark = pytest.mark.slow

#: How long a run with Spark may take here, its JVM's start included.
SPARK_SECONDS = 300

#: The environment of an export subprocess that loads the export test plugin (a fixture).
cli_env = test_cli.cli_env
_checkpoints = test_cli._checkpoints
insert_facts = test_cli.insert_facts


def spark_processes(marker: str) -> list[psutil.Process]:
    found = []
    for proc in psutil.process_iter(attrs=["cmdline"]):
        if any(marker in arg for arg in proc.info["cmdline"] or []):
            found.append(proc)
    return found


class Export:
    """One ``factstream export`` process whose JVM carries a marker of its own."""

    def __init__(self, env: dict[str, str], cwd: Path, *args: str) -> None:
        self.marker = f"factstream.test.run={uuid.uuid4().hex}"
        env = {**env, "SPARK_SUBMIT_OPTS": f"-D{self.marker}", "NO_COLOR": "1", "COLUMNS": "200"}
        self.popen = subprocess.Popen(
            [sys.executable, "-m", "factstream", "export", *args],
            env=env,
            cwd=cwd,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )

    def interrupt(self, sig: int) -> tuple[int, str]:
        """Send ``sig``; return the exit code and stderr (it must exit within 30 s)."""
        self.popen.send_signal(sig)
        _, stderr = self.popen.communicate(timeout=30)
        return self.popen.returncode, stderr

    def assert_no_spark_left(self) -> None:
        wait_until(lambda: not spark_processes(self.marker), 5, "the run's Spark processes to be gone")


def export(env: dict[str, str], cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``factstream export ARGS`` to its end (Spark's start-up alone took 55 s on a busy 2-core machine)."""
    return subprocess.run(
        [sys.executable, "-m", "factstream", "export", *args],
        env={**env, "NO_COLOR": "1", "COLUMNS": "200"},
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=SPARK_SECONDS,
    )


def export_args(out: Path) -> list[str]:
    return ["ledger_raw", "--master", "local[2]", "--output", str(out)]


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_an_export_interrupted_during_its_write_exits_130_and_a_rerun_exports_once(cli_env, export_db, tmp_path, sig):
    facts = 300_000
    insert_facts(export_db, facts)
    out = tmp_path / "out"
    out.mkdir()
    run = Export(cli_env, tmp_path, *export_args(out))
    staging = out / "ledger_raw" / "_staging"
    wait_until(lambda: staging.exists() or run.popen.poll() is not None, SPARK_SECONDS, "the export to write")
    assert run.popen.poll() is None, "the export finished before it could be interrupted"

    code, stderr = run.interrupt(sig)

    assert code == 130, stderr
    assert stderr.strip().splitlines()[-1] == "interrupted", stderr
    for noise in ("Traceback", "py4j", "ERROR"):  # the JVM's own start-up warnings come before
        assert noise not in stderr, stderr
    run.assert_no_spark_left()
    assert _checkpoints(export_db) == [("ledger_raw", 0)]

    result = export(cli_env, tmp_path, *export_args(out))
    assert result.returncode == 0, result.stderr
    ids = pq.read_table(out / "ledger_raw", columns=["stream_id"]).column("stream_id").to_pylist()
    assert len(ids) == facts and sorted(ids) == list(range(2, facts + 2))


def test_ctrl_c_while_the_jvm_starts_leaves_no_jvm(cli_env, export_db, tmp_path):
    insert_facts(export_db, 10)
    out = tmp_path / "out"
    out.mkdir()
    run = Export(cli_env, tmp_path, *export_args(out))
    wait_until(lambda: spark_processes(run.marker) or run.popen.poll() is not None, SPARK_SECONDS, "the JVM to start")
    time.sleep(0.5)  # into the JVM's start-up, before the gateway answers
    assert run.popen.poll() is None

    code, stderr = run.interrupt(signal.SIGINT)

    assert code == 130, stderr
    assert "Traceback" not in stderr, stderr
    run.assert_no_spark_left()
    assert _checkpoints(export_db) in ([], [("ledger_raw", 0)])


@pytest.fixture
def no_java(tmp_path: Path, cli_env: dict[str, str]) -> tuple[dict[str, str], Path]:
    """``cli_env`` with a ``JAVA_HOME`` whose ``java`` records its call (and fails); the record file."""
    called = tmp_path / "java-was-called"
    java = tmp_path / "fake-jdk" / "bin" / "java"
    java.parent.mkdir(parents=True)
    java.write_text(f'#!/bin/sh\necho "$@" >> {called}\nexit 1\n')
    java.chmod(0o755)
    return {**cli_env, "JAVA_HOME": str(java.parent.parent)}, called


def test_an_export_with_nothing_new_starts_no_jvm(run_cli, cli_env, export_db, tmp_path, no_java):
    insert_facts(export_db, 20)
    out = tmp_path / "out"
    out.mkdir()
    first = export(cli_env, tmp_path, *export_args(out))
    assert first.returncode == 0, first.stderr
    env, called = no_java

    again = run_cli("export", *export_args(out), env=env)

    assert again.returncode == 0, again.stderr
    assert "up to date" in again.stdout, again.stdout
    assert not called.exists(), "a JVM was started for an export with nothing new"
    assert dict(_checkpoints(export_db))["ledger_raw"] == 21

    insert_more = run_cli("export", *export_args(out), env=env)  # still nothing new: the same answer
    assert insert_more.returncode == 0 and not called.exists(), insert_more.stderr


def test_export_without_a_job_lists_the_jobs_without_spark(run_cli, export_db, no_java):
    env, called = no_java
    insert_facts(export_db, 30)

    result = run_cli("export", env=env)

    assert result.returncode == 0, result.stderr
    rows = {line.split("│")[1].strip(): line for line in result.stdout.splitlines() if line.count("│") > 3}
    assert "ledger_raw" in rows and "never ran" in rows["ledger_raw"], result.stdout
    assert "30" in rows["ledger_raw"].split("│")[5], result.stdout  # pending facts
    assert not called.exists()
