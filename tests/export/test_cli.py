"""``factstream export`` end to end in a subprocess: errors are one paragraph with exit 2 and leave the
checkpoint alone; a run prints a summary and moves the checkpoint."""

from __future__ import annotations

import os
from pathlib import Path

import psycopg
import pytest

from factstream.db.engine import libpq_url

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def cli_env(plugin_installer, export_db):
    """Environment for a ``factstream`` subprocess that loads the export test plugin by entry point."""
    plugin_installer.from_source(
        "exporttest", "from tests.export.exportplugin import register_export_jobs, register_streams\n"
    )
    env = plugin_installer.env()
    env["PYTHONPATH"] = os.pathsep.join([env["PYTHONPATH"], str(ROOT)])
    env["FACTSTREAM_DATABASE__URL"] = export_db
    return env


def _checkpoints(url: str) -> list[tuple[str, int]]:
    with psycopg.connect(libpq_url(url)) as conn:
        return [(r[0], r[1]) for r in conn.execute("SELECT job, upto FROM export_checkpoints ORDER BY job")]


def insert_facts(url: str, facts: int) -> None:
    """Store ``facts`` ledger credits at positions 2 to ``facts + 1``."""
    with psycopg.connect(libpq_url(url), autocommit=True) as conn:
        conn.execute(
            "INSERT INTO ledger_credits SELECT g, 'w', 'acc' || (g %% 7), g, repeat('x', 40)"
            " FROM generate_series(2, %s) AS g",
            (facts + 1,),
        )
        conn.execute("SELECT setval('ledger_seq', %s)", (facts + 1,))


def _one_paragraph_error(result) -> None:
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith("error:")
    assert "Traceback" not in result.stderr
    assert "\n\n" not in result.stderr.strip()


def test_export_help_describes_the_options(run_cli):
    result = run_cli("export", "--help")
    assert result.returncode == 0
    for option in ("--all", "--master", "--output", "--full", "--conf"):
        assert option in result.stdout


def test_unknown_job_is_a_one_paragraph_error(run_cli, cli_env, export_db):
    result = run_cli("export", "nope", env=cli_env)
    _one_paragraph_error(result)
    assert "unknown export job 'nope'" in result.stderr
    assert "ledger_raw" in result.stderr
    assert _checkpoints(export_db) == []


def test_unreachable_master_is_a_one_paragraph_error(run_cli, cli_env, export_db):
    result = run_cli("export", "ledger_raw", "--master", "spark://127.0.0.1:9", env=cli_env)
    _one_paragraph_error(result)
    assert "cannot reach the Spark master" in result.stderr
    assert _checkpoints(export_db) == []


def test_missing_output_location_is_a_one_paragraph_error(run_cli, cli_env, export_db, tmp_path):
    result = run_cli("export", "--all", "--output", str(tmp_path / "nowhere"), env=cli_env)
    _one_paragraph_error(result)
    assert "does not exist" in result.stderr
    assert _checkpoints(export_db) == []


def test_export_all_runs_every_job_and_prints_a_summary(run_cli, cli_env, export_db, tmp_path):
    with psycopg.connect(libpq_url(export_db), autocommit=True) as conn:
        conn.execute("INSERT INTO ledger_credits SELECT g, 'w', 'acc', g, NULL FROM generate_series(2, 41) AS g")
        conn.execute("SELECT setval('ledger_seq', 41)")
    out = tmp_path / "my exports [2026]"  # a space and brackets: a local path is not a URI to escape
    out.mkdir()

    result = run_cli("export", "--all", "--master", "local[2]", "--output", str(out), env=cli_env)

    assert result.returncode == 0, result.stderr
    assert "ledger_raw" in result.stdout and "(0, 41]" in result.stdout
    assert dict(_checkpoints(export_db))["ledger_raw"] == 41
    # Every job ran, the test plugin's and any installed bundled plugin's (caches_hourly, ...).
    written = {p.name for p in out.iterdir()}
    assert {"rewind_all", "ledger_raw", "ledger_signed", "shouty_all"} <= written
    assert all(name in result.stdout for name in written)


def test_export_killed_during_the_write_and_rerun_writes_each_fact_once(run_cli, cli_env, export_db, tmp_path):
    import signal
    import subprocess
    import sys
    import time

    facts = 400_000
    insert_facts(export_db, facts)
    out = tmp_path / "out"
    out.mkdir()
    args = [sys.executable, "-m", "factstream", "export", "ledger_raw", "--master", "local[2]", "--output", str(out)]
    proc = subprocess.Popen(args, env=cli_env, cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    staging = out / "ledger_raw" / "_staging"
    deadline = time.monotonic() + 90
    while not staging.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    killed = proc.poll() is None
    if killed:
        proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    assert killed, "the export finished before it could be killed during its write"
    assert _checkpoints(export_db) == [("ledger_raw", 0)]

    result = run_cli("export", "ledger_raw", "--master", "local[2]", "--output", str(out), env=cli_env)

    assert result.returncode == 0, result.stderr
    assert dict(_checkpoints(export_db))["ledger_raw"] == facts + 1
    import pyarrow.parquet as pq

    ids = pq.read_table(out / "ledger_raw", columns=["stream_id"]).column("stream_id").to_pylist()
    assert len(ids) == facts and sorted(ids) == list(range(2, facts + 2))
