"""Export metrics on a host's ``/metrics``: read from the runs the export runner recorded in the database
(``factstream.export.runs.record``, called here directly), cached a few seconds, and how far each job's
checkpoint is behind the stream's persisted position as this host sees it."""

from __future__ import annotations

import psycopg
from prometheus_client.parser import text_string_to_metric_families

from factstream.db.database import Database
from factstream.db.engine import libpq_url
from factstream.export import checkpoints, runs
from factstream.export.runs import ExportRun, ExportRunsMonitor
from tests.host.conftest import post_messages


def record(url: str, *recorded: ExportRun) -> None:
    with psycopg.connect(libpq_url(url), autocommit=True) as conn:
        for run in recorded:
            runs.record(conn, run)


def exported(job: str, rows: int, upto: int, seconds: float = 1.5) -> ExportRun:
    return ExportRun(job, "inbox", "exported", rows, seconds, upto)


def samples(text: str) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    return {
        (sample.name, frozenset(sample.labels.items())): sample.value
        for family in text_string_to_metric_families(text)
        if family.name.startswith("factstream_export_")
        for sample in family.samples
    }


def value(found: dict, name: str, **labels: str) -> float | None:
    return found.get((name, frozenset(labels.items())))


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


async def test_a_host_shows_each_jobs_runs_rows_duration_last_success_and_lag(inbox_cluster, inbox_db, client):
    host = await inbox_cluster()
    ids = await post_messages(host, client, *[("@alice:hs", f"m{i}") for i in range(5)])
    with psycopg.connect(libpq_url(inbox_db), autocommit=True) as conn:
        checkpoints.create(conn, "inbox_all", "inbox", "file:///out")
        checkpoints.advance(conn, "inbox_all", 0, ids[1], "file:///out")
    record(
        inbox_db,
        exported("inbox_all", 2, ids[1], seconds=3.0),
        ExportRun("inbox_all", "inbox", "up_to_date", 0, 0.25, ids[1]),
        ExportRun("inbox_all", "inbox", "failed", 0, 7.5, ids[1], "boom"),
    )
    await host.wait_for_stream_position("main", "inbox", ids[-1])

    found = samples((await client(host).get("/metrics")).text)

    assert value(found, "factstream_export_runs_total", job="inbox_all", outcome="exported") == 1
    assert value(found, "factstream_export_runs_total", job="inbox_all", outcome="up_to_date") == 1
    assert value(found, "factstream_export_runs_total", job="inbox_all", outcome="failed") == 1
    assert value(found, "factstream_export_runs_total", job="inbox_all", outcome="recovered") == 0
    assert value(found, "factstream_export_rows_total", job="inbox_all") == 2
    assert value(found, "factstream_export_last_duration_seconds", job="inbox_all") == 7.5  # the failed run, newest
    with psycopg.connect(libpq_url(inbox_db)) as conn:
        [(success,)] = conn.execute(
            "SELECT extract(epoch FROM finished_at) FROM export_runs WHERE outcome = 'up_to_date'"
        ).fetchall()
    assert value(found, "factstream_export_last_success_timestamp_seconds", job="inbox_all") == float(success)
    persisted = host.id_generator("inbox").get_current_token()
    assert value(found, "factstream_export_behind_positions", job="inbox_all") == persisted - ids[1] > 0


async def test_the_runs_are_read_at_most_every_few_seconds(inbox_db):
    db = Database(inbox_db, instance_name="metrics-test", pool_size=1)
    await db.open()
    clock = Clock()
    monitor = ExportRunsMonitor(db, lambda stream: 100, clock=clock)
    try:
        record(inbox_db, exported("job_a", 10, 40))
        await monitor.refresh()
        assert [(j.job, j.runs["exported"], j.rows_total) for j in monitor.jobs] == [("job_a", 1, 10)]

        record(inbox_db, exported("job_a", 5, 45))
        clock.now += runs.CACHE_SECONDS / 2
        await monitor.refresh()
        assert monitor.jobs[0].rows_total == 10  # cached

        clock.now += runs.CACHE_SECONDS
        await monitor.refresh()
        assert (monitor.jobs[0].runs["exported"], monitor.jobs[0].rows_total) == (2, 15)
        assert monitor.jobs[0].checkpoint is None  # a job without a checkpoint shows no lag
        behind = [f for f in monitor.families() if f.name == "factstream_export_behind_positions"]
        assert behind[0].samples[0].value == 100
    finally:
        monitor.close()
        await db.close()


def test_old_runs_are_pruned_but_the_counts_go_on(inbox_db):
    record(inbox_db, ExportRun("job_b", "inbox", "failed", 0, 1.0, None, "once"))
    record(inbox_db, *[exported("job_b", 1, i) for i in range(runs.KEEP_RUNS + 20)])

    with psycopg.connect(libpq_url(inbox_db)) as conn:
        kept = conn.execute("SELECT outcome, count(*), max(runs), max(rows_total) FROM export_runs GROUP BY outcome")
        by_outcome = {row[0]: row[1:] for row in kept.fetchall()}
    # The newest KEEP_RUNS runs, plus the newest of each outcome (the one failure, long ago).
    assert by_outcome == {"exported": (runs.KEEP_RUNS, runs.KEEP_RUNS + 20, runs.KEEP_RUNS + 20), "failed": (1, 1, 0)}
