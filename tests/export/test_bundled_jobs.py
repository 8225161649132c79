"""The bundled plugins' export jobs, run for real on local Spark against facts written through ID generators."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import pytest

from factstream.export.runner import ExportRunner
from factstream.plugin.manager import load_plugins
from tests.export.writers import Writer


@pytest.fixture
def out_root(tmp_path: Path) -> Path:
    root = tmp_path / "out"
    root.mkdir()
    return root


def _ms(year: int, month: int, day: int, hour: int, minute: int) -> int:
    return int(datetime(year, month, day, hour, minute, tzinfo=UTC).timestamp() * 1000)


def test_caches_hourly_counts_invalidations_per_cache_and_hour(spark, migrated_database, loop_thread, out_root):
    plugins = load_plugins()
    if "caches" not in plugins.registry.streams:
        pytest.skip("the bundled caches plugin is not installed (uv sync --all-packages)")
    spec = plugins.registry.streams.get("caches")
    rows = (
        [{"cache_func": "get_user", "keys": ["@a:hs"], "invalidation_ts": _ms(2026, 11, 1, 10, m)} for m in range(5)]
        + [{"cache_func": "get_user", "keys": None, "invalidation_ts": _ms(2026, 11, 1, 11, 3)}]
        + [{"cache_func": "cs_cache_fake", "keys": ["!r:hs", "@a:hs"], "invalidation_ts": _ms(2026, 11, 1, 10, 59)}]
    )

    async def write() -> None:
        w = await Writer(migrated_database, spec, "main").start()
        try:
            async with w.db.transaction() as txn:
                for row in rows:  # append_many_txn unnests arrays, which a text[] column cannot take
                    await w.gen.append_txn(txn, "cache_invalidation_stream_by_instance", row)
        finally:
            await w.close()

    loop_thread.run(write())
    result = ExportRunner(spark, plugins, migrated_database, out_root.as_uri()).run(
        plugins.registry.export_jobs.get("caches_hourly")
    )
    assert result.status != "failed"

    out = spark.read.parquet(str(out_root / "caches_hourly")).collect()
    got = sorted((r.cache_func, r.hour.strftime("%d %H"), r.invalidations, r.whole_cache) for r in out)
    # Spark renders the UTC hour in the session's time zone: compare hours relative to the first one.
    assert [(g[0], g[2], g[3]) for g in got] == [("cs_cache_fake", 1, 0), ("get_user", 5, 0), ("get_user", 1, 1)]
    assert got[0][1] == got[1][1] != got[2][1]
