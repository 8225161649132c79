"""Export jobs: checkpoint to watermark, exactly once across interruptions, never past the watermark."""

from __future__ import annotations

from pathlib import Path

import psycopg
import pytest

from factstream.db.engine import libpq_url
from factstream.export import checkpoints, runner
from factstream.export.output import JobOutput
from factstream.export.plan import ExportError
from factstream.export.runner import ExportRunner
from tests.export.writers import Writer


class Killed(BaseException):
    """Stands for the process dying at an injected point (not an Exception: nothing catches it)."""


def _write_ledger(loop_thread, url, plugins, n, instance="w1", start=0):
    spec = plugins.registry.streams.get("ledger")

    async def write():
        w = await Writer(url, spec, instance).start()
        try:
            return await w.append(
                "ledger_credits",
                [{"account": f"acc{i % 3}", "amount": i, "memo": "m"} for i in range(start, start + n)],
            )
        finally:
            await w.close()

    return loop_thread.run(write())


def _exported_ids(spark, root: Path, job: str) -> list[int]:
    """Every stream_id in the job's committed output (duplicates kept)."""
    path = root / job
    if not path.exists():
        return []
    return sorted(r.stream_id for r in spark.read.parquet(str(path)).select("stream_id").collect())


def _checkpoint(url: str, job: str) -> int | None:
    with psycopg.connect(libpq_url(url)) as conn:
        cp = checkpoints.read(conn, job)
    return None if cp is None else cp.upto


@pytest.fixture
def out_root(tmp_path: Path) -> Path:
    root = tmp_path / "out"
    root.mkdir()
    return root


def test_export_writes_new_facts_once_and_advances_the_checkpoint(
    spark, export_db, export_plugins, loop_thread, out_root
):
    first = _write_ledger(loop_thread, export_db, export_plugins, 20)
    run = ExportRunner(spark, export_plugins, export_db, out_root.as_uri())
    job = export_plugins.registry.export_jobs.get("ledger_raw")

    r1 = run.run(job)
    assert (r1.start, r1.upto, r1.rows, r1.status) == (0, max(first), 20, "exported")
    assert _checkpoint(export_db, "ledger_raw") == max(first)

    assert run.run(job).status == "up to date"

    second = _write_ledger(loop_thread, export_db, export_plugins, 7, start=20)
    r3 = run.run(job)
    assert (r3.start, r3.upto, r3.rows) == (max(first), max(second), 7)
    assert _exported_ids(spark, out_root, "ledger_raw") == sorted(first + second)
    names = sorted(p.name for p in (out_root / "ledger_raw").iterdir())
    assert names == [f"export_range={0:020d}-{max(first):020d}", f"export_range={max(first):020d}-{max(second):020d}"]


def test_transform_and_partition_columns_shape_the_output(spark, export_db, export_plugins, loop_thread, out_root):
    ids = _write_ledger(loop_thread, export_db, export_plugins, 6)  # amounts 0..5; the transform drops 0
    job = export_plugins.registry.export_jobs.get("ledger_signed")

    result = ExportRunner(spark, export_plugins, export_db, out_root.as_uri()).run(job)

    assert result.rows == 5
    (committed,) = (out_root / "ledger_signed").glob("export_range=*")
    assert sorted(p.name for p in committed.iterdir() if p.is_dir()) == ["sign=credit"]
    df = spark.read.parquet(str(out_root / "ledger_signed"))
    assert sorted(r.stream_id for r in df.collect()) == sorted(ids[1:])
    assert {r.sign for r in df.collect()} == {"credit"}


@pytest.mark.parametrize("kill_at", ["during_write", "before_commit", "before_marker", "before_checkpoint"])
def test_an_interrupted_export_rerun_writes_each_fact_exactly_once(
    spark, export_db, export_plugins, loop_thread, out_root, monkeypatch, kill_at
):
    ids = _write_ledger(loop_thread, export_db, export_plugins, 30)
    job = export_plugins.registry.export_jobs.get("ledger_raw")

    def die(*args, **kwargs):
        raise Killed(kill_at)

    with monkeypatch.context() as m:
        if kill_at == "during_write":
            # the first task's partition writes, then the process dies mid-job
            real_read = runner.ExportRunner._export_range

            def write_then_die(self, job, out, start, upto):
                staging = out.staging(start, upto)
                spark.range(3).write.parquet(staging)  # a partial staging directory is left behind
                raise Killed(kill_at)

            m.setattr(runner.ExportRunner, "_export_range", write_then_die)
            assert real_read is not None
        elif kill_at == "before_commit":
            m.setattr(JobOutput, "commit", die)
        elif kill_at == "before_marker":
            real_commit = JobOutput.commit

            def commit_without_marker(self, staging, lo, hi):
                final = real_commit(self, staging, lo, hi)
                Path(final.removeprefix("file:"), "_COMMITTED").unlink()
                raise Killed(kill_at)

            m.setattr(JobOutput, "commit", commit_without_marker)
        else:
            m.setattr(checkpoints, "advance", die)
        with pytest.raises(Killed):
            ExportRunner(spark, export_plugins, export_db, out_root.as_uri()).run(job)

    assert _checkpoint(export_db, "ledger_raw") == 0
    result = ExportRunner(spark, export_plugins, export_db, out_root.as_uri()).run(job)

    assert _exported_ids(spark, out_root, "ledger_raw") == sorted(ids)
    assert _checkpoint(export_db, "ledger_raw") == max(ids)
    if kill_at == "before_checkpoint":
        assert (result.status, result.adopted) == ("recovered", ((0, max(ids)),))
    else:
        assert result.status == "exported"
    assert not (out_root / "ledger_raw" / "_staging").exists()


def test_full_export_starts_over_without_duplicates(spark, export_db, export_plugins, loop_thread, out_root):
    a = _write_ledger(loop_thread, export_db, export_plugins, 5)
    run = ExportRunner(spark, export_plugins, export_db, out_root.as_uri())
    job = export_plugins.registry.export_jobs.get("ledger_raw")
    run.run(job)
    b = _write_ledger(loop_thread, export_db, export_plugins, 5, start=5)
    run.run(job)

    result = run.run(job, full=True)

    assert (result.start, result.upto, result.rows) == (0, max(b), 10)
    assert _exported_ids(spark, out_root, "ledger_raw") == sorted(a + b)
    assert len(list((out_root / "ledger_raw").glob("export_range=*"))) == 1


def test_output_that_disagrees_with_the_checkpoint_is_refused(spark, export_db, export_plugins, loop_thread, out_root):
    _write_ledger(loop_thread, export_db, export_plugins, 5)
    run = ExportRunner(spark, export_plugins, export_db, out_root.as_uri())
    job = export_plugins.registry.export_jobs.get("ledger_raw")
    run.run(job)
    with psycopg.connect(libpq_url(export_db), autocommit=True) as conn:
        conn.execute("UPDATE export_checkpoints SET upto = 2 WHERE job = 'ledger_raw'")

    with pytest.raises(ExportError, match="does not follow the checkpoint 2"):
        run.run(job)
    assert _checkpoint(export_db, "ledger_raw") == 2


def test_missing_output_location_is_an_error_and_leaves_no_checkpoint(spark, export_db, export_plugins, tmp_path):
    job = export_plugins.registry.export_jobs.get("ledger_raw")
    run = ExportRunner(spark, export_plugins, export_db, (tmp_path / "missing").as_uri())
    with pytest.raises(ExportError, match="does not exist"):
        run.run(job)
    assert _checkpoint(export_db, "ledger_raw") is None


def test_a_job_without_transform_is_written_by_the_workers_and_matches_spark_s_writer(
    spark, export_db, export_plugins, loop_thread, out_root, tmp_path, monkeypatch
):
    from factstream.export import direct

    ids = _write_ledger(loop_thread, export_db, export_plugins, 57)
    job = export_plugins.registry.export_jobs.get("ledger_raw")
    first = ExportRunner(spark, export_plugins, export_db, out_root.as_uri()).run(job)
    with monkeypatch.context() as m:  # the same job again, through Spark's writer, into another root
        m.setattr(direct, "can_write_directly", lambda _job, _staging: False)
        other = tmp_path / "other"
        other.mkdir()
        second = ExportRunner(spark, export_plugins, export_db, other.as_uri()).run(job, full=True)

    assert (first.rows, second.rows) == (57, 57)
    files = sorted(p.name for p in (out_root / "ledger_raw").rglob("*.parquet"))
    assert files and all(len(name) == len("part-00000.parquet") for name in files), files
    via_workers = spark.read.parquet(str(out_root / "ledger_raw"))
    via_spark = spark.read.parquet(str(other / "ledger_raw"))
    assert via_workers.schema == via_spark.schema
    assert sorted(map(tuple, via_workers.collect())) == sorted(map(tuple, via_spark.collect()))
    assert sorted(r.stream_id for r in via_workers.collect()) == sorted(ids)
