"""The account_data export job, run for real on local Spark over changes written by a real host."""

from __future__ import annotations

import asyncio

import pytest

from factstream.export.runner import ExportRunner
from factstream.plugin.manager import load_plugins

pytestmark = [pytest.mark.spark, pytest.mark.slow]


async def test_account_data_latest_gives_one_row_per_user_room_and_type_with_its_last_change(
    host_cluster, tmp_path, spark
):
    from factstream_account_data import AccountDataStore

    main = await host_cluster("main")
    store = main.api.state(AccountDataStore)
    ids = []
    for n in range(3):
        ids.append(await store.put("@a:hs", None, "m.t", f'{{"n": {n}}}'))
    ids.append(await store.put("@a:hs", "!r:hs", "m.t", "{}"))
    ids.append(await store.put("@b:hs", None, "m.t", "{}"))
    url = main.database().url
    await main.stop()

    plugins = load_plugins()
    out = tmp_path / "out"
    out.mkdir()
    job = plugins.registry.export_jobs.get("account_data_latest")
    result = await asyncio.to_thread(ExportRunner(spark, plugins, url, out.as_uri()).run, job)

    assert result.status != "failed"
    rows = spark.read.parquet(str(out / "account_data_latest")).collect()
    got = sorted((r.user_id, r.room_id or "", r.data_type, r.changes, r.last_stream_id, r.last_instance) for r in rows)
    assert got == [
        ("@a:hs", "", "m.t", 3, ids[2], "main"),
        ("@a:hs", "!r:hs", "m.t", 1, ids[3], "main"),
        ("@b:hs", "", "m.t", 1, ids[4], "main"),
    ]


async def test_to_device_daily_counts_messages_per_day_and_event_type(host_cluster, tmp_path, spark):
    from factstream_to_device.messages import Message
    from factstream_to_device.store import ToDeviceStore

    main = await host_cluster("main")
    store = main.api.state(ToDeviceStore)
    await store.send("@s:hs", "m.key", "t1", "h1", [Message("@a:hs", "PHONE", "{}"), Message("@b:hs", "PC", "{}")])
    await store.send("@s:hs", "m.key", "t2", "h2", [Message("@a:hs", "PHONE", "{}")])
    await store.send("@t:hs", "m.ping", "t1", "h3", [Message("@a:hs", "PHONE", '{"x": 1}')])
    url = main.database().url
    await main.stop()

    plugins = load_plugins()
    out = tmp_path / "out"
    out.mkdir()
    job = plugins.registry.export_jobs.get("to_device_daily")
    result = await asyncio.to_thread(ExportRunner(spark, plugins, url, out.as_uri()).run, job)

    assert result.status != "failed"
    rows = spark.read.parquet(str(out / "to_device_daily")).collect()
    got = sorted((r.message_type, r.messages, r.senders, r.recipients) for r in rows)
    assert got == [("m.key", 3, 1, 2), ("m.ping", 1, 1, 1)]
    assert len({r.day for r in rows}) == 1
