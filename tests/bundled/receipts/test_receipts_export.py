"""The receipts export job, run for real on local Spark over receipts a real host stored."""

from __future__ import annotations

import asyncio
import datetime

import pytest
from factstream_receipts import ReceiptsRow, ReceiptsStore

from factstream.export.runner import ExportRunner
from factstream.plugin.manager import load_plugins
from factstream.testing import HostCluster
from tests.bundled.events.conftest import store_of

pytestmark = [pytest.mark.spark, pytest.mark.slow]

ALICE, BOB = "@alice:hs", "@bob:hs"


async def test_receipts_daily_counts_current_receipts_per_day_room_and_type(
    host_cluster: HostCluster, tmp_path, spark
) -> None:
    main = await host_cluster("main")
    store, receipts = store_of(main), main.api.state(ReceiptsStore)
    room = await store.create_room(ALICE, preset="public_chat")
    await store.change_membership(room, BOB, BOB, "join")
    day = datetime.datetime(2026, 5, 1, 12, tzinfo=datetime.UTC)
    ts = int(day.timestamp() * 1000)
    ids = [
        await receipts.receive(ReceiptsRow(room, "m.read", ALICE, "$a", None, {"ts": ts}), 10),
        await receipts.receive(ReceiptsRow(room, "m.read", BOB, "$a", None, {"ts": ts + 1}), 10),
        await receipts.receive(ReceiptsRow(room, "m.read.private", BOB, "$a", "main", {"ts": ts + 2}), 10),
        # a later day's receipt replaces bob's m.read: only the current one is exported
        await receipts.receive(ReceiptsRow(room, "m.read", BOB, "$b", None, {"ts": ts + 86_400_000}), 11),
    ]
    assert None not in ids
    url = main.database().url
    await main.stop()

    plugins = load_plugins()
    out = tmp_path / "out"
    out.mkdir()
    job = plugins.registry.export_jobs.get("receipts_daily")
    result = await asyncio.to_thread(ExportRunner(spark, plugins, url, out.as_uri()).run, job)

    assert result.status != "failed"
    rows = spark.read.parquet(str(out / "receipts_daily")).collect()
    got = sorted((str(r.day), r.room_id, r.receipt_type, r.receipts, r.users, r.last_stream_id) for r in rows)
    assert got == [
        ("2026-05-01", room, "m.read", 1, 1, ids[0]),
        ("2026-05-01", room, "m.read.private", 1, 1, ids[2]),
        ("2026-05-02", room, "m.read", 1, 1, ids[3]),
    ]
