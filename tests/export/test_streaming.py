"""spark.readStream.format("factstream"): offsets are stream positions; a checkpointed query exports
each fact exactly once, continuing where it stopped."""

from __future__ import annotations

from pathlib import Path

from factstream.export.datasource import data_source_class
from factstream.export.plan import plans_for
from tests.export.writers import Writer


def test_a_checkpointed_streaming_query_writes_each_fact_exactly_once(
    spark, export_db, export_plugins, loop_thread, tmp_path: Path
):
    spec = export_plugins.registry.streams.get("ledger")
    spark.dataSource.register(
        data_source_class(plans_for([r.spec for r in export_plugins.registry.streams]), export_db)
    )
    out, checkpoint = tmp_path / "out", tmp_path / "checkpoint"

    def write(n: int, start: int) -> list[int]:
        async def go() -> list[int]:
            w = await Writer(export_db, spec, "w").start()
            try:
                rows = [{"account": "a", "amount": i, "memo": None} for i in range(start, start + n)]
                return await w.append("ledger_credits", rows)
            finally:
                await w.close()

        return loop_thread.run(go())

    def run_query() -> None:
        query = (
            spark.readStream.format("factstream")
            .option("stream", "ledger")
            .load()
            .writeStream.format("parquet")
            .option("path", str(out))
            .option("checkpointLocation", str(checkpoint))
            .start()
        )
        try:
            query.processAllAvailable()
        finally:
            query.stop()

    first = write(12, 0)
    run_query()
    second = write(5, 12)
    run_query()
    run_query()  # nothing new: no duplicates

    ids = sorted(r.stream_id for r in spark.read.parquet(str(out)).select("stream_id").collect())
    assert ids == sorted(first + second)
