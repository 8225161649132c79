"""``factstream export`` on a real Spark standalone cluster: a master and a worker, each its own JVM
started with the installed pyspark's ``spark-class``, as an operator starts them.

The events jobs run with ``--master spark://...`` (executors on the worker, Python workers importing
factstream and the events plugin there) and again with ``local[*]`` into another output; the Parquet
both wrote holds the same rows. Both JVMs run in their own process groups and are gone at teardown.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from factstream.testing import HostCluster, SparkStandalone
from tests.bundled.events.remote_history import RemoteRoom, persist

pytestmark = pytest.mark.slow

#: A JVM's start, or a whole export with Spark's start, on a busy 2-core machine.
START_SECONDS = 120
EXPORT_SECONDS = 300
JOBS = ("events", "events_raw", "room_daily")


@pytest.fixture
def standalone(tmp_path: Path) -> Iterator[SparkStandalone]:
    cluster = SparkStandalone(tmp_path, cores=1, memory="1g", start_seconds=START_SECONDS)
    try:
        cluster.start()
        yield cluster
    finally:
        pids = cluster.pids()
        cluster.stop()
        assert not [pid for pid in pids if psutil.pid_exists(pid)], "a process of the Spark cluster was left"


async def write_events(host_cluster: HostCluster) -> str:
    """Two rooms of remote events (one with a redaction) on one writer; the database URL."""
    from factstream_events import EventsStore

    main = await host_cluster("main")
    store = main.api.state(EventsStore)
    for n in range(2):
        room = RemoteRoom(f"!cluster{n}:elsewhere")
        room.create("@zed:elsewhere")
        for i in range(40):
            room.add("m.room.message", "@zed:elsewhere", {"body": f"m{i}"})
        target = room.events[-1].event_id
        room.add("m.room.redaction", "@zed:elsewhere", {}, redacts=target)
        await persist(store, room.room_id, room.events)
    url = main.database().url
    await main.stop()
    return url


def export(url: str, out: Path, master: str, *extra: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "FACTSTREAM_DATABASE__URL": url, "NO_COLOR": "1", "COLUMNS": "200"}
    env["PYSPARK_PYTHON"] = sys.executable
    conf = ["--conf", "spark.driver.host=127.0.0.1", "--conf", "spark.driver.bindAddress=127.0.0.1"]
    return subprocess.run(
        [sys.executable, "-m", "factstream", "export", *JOBS, "--master", master, "--output", str(out), *conf, *extra],
        env=env,
        capture_output=True,
        text=True,
        timeout=EXPORT_SECONDS,
    )


def sorted_table(root: Path, job: str, keys: list[str]) -> pa.Table:
    table = pq.read_table(root / job)
    return table.select(sorted(table.column_names)).sort_by([(k, "ascending") for k in keys])


async def test_export_on_a_standalone_cluster_writes_what_local_spark_writes(
    host_cluster: HostCluster, standalone: SparkStandalone, tmp_path: Path
) -> None:
    url = await write_events(host_cluster)
    on_cluster, local = tmp_path / "cluster", tmp_path / "local"
    on_cluster.mkdir()
    local.mkdir()

    started = time.monotonic()
    first = export(url, on_cluster, standalone.url)
    assert first.returncode == 0, first.stdout + first.stderr + standalone.logs()
    assert standalone.state()["completedapps"], "no application ran on the standalone master"
    second = export(url, local, "local[*]", "--full")  # the checkpoints name the first output
    assert second.returncode == 0, second.stdout + second.stderr
    assert time.monotonic() - started < 2 * EXPORT_SECONDS

    events = sorted_table(on_cluster, "events", ["event_id"])
    assert events.num_rows == 2 * 46
    assert events.equals(sorted_table(local, "events", ["event_id"]))
    assert sorted_table(on_cluster, "events_raw", ["event_id"]).equals(sorted_table(local, "events_raw", ["event_id"]))
    daily = sorted_table(on_cluster, "room_daily", ["room_id", "day"])
    assert daily.num_rows == 2 and daily.equals(sorted_table(local, "room_daily", ["room_id", "day"]))
