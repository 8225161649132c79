"""The receipts stream's Spark export job: receipts per day, room and receipt type.

Each row of the stream is one receipt as it was sent (the table keeps only the newest of each key,
so an export of a range holds the receipts still current when it ran). The day is read from the
receipt's ``data.ts``, which the job gets from the fact's whole table row (``content=True``). Counts
cover one exported range: sum over the ``export_range=*`` directories for totals.
"""

from __future__ import annotations

from typing import Any

from factstream import ExportJobSpec


def receipts_per_day(df: Any) -> Any:
    """``(day, room_id, receipt_type, receipts, users, first_stream_id, last_stream_id)``.

    ``day`` is the UTC date of the receipt's ``data.ts``; ``users`` counts distinct users.
    """
    from pyspark.sql import functions as F

    fact = F.from_json("content", "room_id STRING, receipt_type STRING, user_id STRING, data STRUCT<ts: BIGINT>")
    rows = df.select("stream_id", fact.alias("r"))
    day = F.to_date(F.timestamp_millis(F.col("r.data.ts")))
    return rows.groupBy(
        day.alias("day"), F.col("r.room_id").alias("room_id"), F.col("r.receipt_type").alias("receipt_type")
    ).agg(
        F.count(F.lit(1)).alias("receipts"),
        F.countDistinct("r.user_id").alias("users"),
        F.min("stream_id").alias("first_stream_id"),
        F.max("stream_id").alias("last_stream_id"),
    )


RECEIPTS_DAILY = ExportJobSpec(
    name="receipts_daily",
    stream="receipts",
    transform=receipts_per_day,
    content=True,
    description="receipts per day, room and receipt type (per exported range)",
)
