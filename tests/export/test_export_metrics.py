"""Real export runs recorded in ``export_runs`` as they end (exported, up to date, failed) and logged as
``export run begun`` / ``export run finished`` with their fields (Spark: one test)."""

from __future__ import annotations

import logging
from pathlib import Path

import psycopg
import pytest

from factstream.db.engine import libpq_url
from factstream.export.plan import ExportError
from factstream.export.runner import ExportRunner
from factstream.logs import record_fields
from tests.export.test_runner import _write_ledger


def recorded(url: str) -> list[tuple[object, ...]]:
    with psycopg.connect(libpq_url(url)) as conn:
        return conn.execute(
            "SELECT job, stream_name, outcome, rows, upto, error IS NOT NULL, runs, rows_total "
            "FROM export_runs ORDER BY id"
        ).fetchall()


def test_each_run_is_recorded_and_logged_as_it_ends_a_failed_one_too(
    spark, export_db, export_plugins, loop_thread, tmp_path: Path, caplog: pytest.LogCaptureFixture
):
    ids = _write_ledger(loop_thread, export_db, export_plugins, 12)
    (tmp_path / "out").mkdir()
    (tmp_path / "elsewhere").mkdir()
    job = export_plugins.registry.export_jobs.get("ledger_raw")
    caplog.set_level(logging.INFO, logger="factstream.export.runs")

    ExportRunner(spark, export_plugins, export_db, (tmp_path / "out").as_uri()).run(job)
    ExportRunner(spark, export_plugins, export_db, (tmp_path / "out").as_uri()).run(job)
    with pytest.raises(ExportError, match="has exported up to"):
        ExportRunner(spark, export_plugins, export_db, (tmp_path / "elsewhere").as_uri()).run(job)

    upto = max(ids)
    assert recorded(export_db) == [
        ("ledger_raw", "ledger", "exported", 12, upto, False, 1, 12),
        ("ledger_raw", "ledger", "up_to_date", 0, upto, False, 1, 12),
        ("ledger_raw", "ledger", "failed", 0, upto, True, 1, 12),
    ]
    lines = [(r.getMessage(), record_fields(r)) for r in caplog.records if r.name == "factstream.export.runs"]
    assert [msg for msg, _ in lines] == ["export run begun", "export run finished"] * 3
    assert lines[0][1] == {"job": "ledger_raw", "stream": "ledger", "checkpoint": 0}
    finished = lines[1][1]
    assert (finished["outcome"], finished["rows"], finished["upto"]) == ("exported", 12, upto)
    assert finished["seconds"] > 0
    assert lines[5][1]["outcome"] == "failed" and "has exported up to" in lines[5][1]["error"]
