"""The caches stream's Spark export job: how many invalidations each cache received per hour.

Each export run covers the facts after the job's checkpoint up to the stream's watermark, so one
run's output holds the counts of that range only; the total for an hour is the sum over the ranges
(``export_range=*`` directories) that contain it. ``first_stream_id``/``last_stream_id`` tell which
facts a count covers.
"""

from __future__ import annotations

from typing import Any

from factstream import ExportJobSpec


def invalidations_per_cache_per_hour(df: Any) -> Any:
    """``(cache_func, hour, invalidations, whole_cache, first_stream_id, last_stream_id)`` per cache and hour.

    ``hour`` is the UTC hour of ``invalidation_ts`` (milliseconds since the epoch); ``whole_cache``
    counts the rows that cleared the whole cache (no keys).
    """
    from pyspark.sql import functions as F

    hour = F.date_trunc("hour", F.timestamp_millis(F.col("invalidation_ts")))
    return df.groupBy(F.col("cache_func"), hour.alias("hour")).agg(
        F.count(F.lit(1)).alias("invalidations"),
        F.sum(F.when(F.col("keys").isNull(), 1).otherwise(0)).alias("whole_cache"),
        F.min("stream_id").alias("first_stream_id"),
        F.max("stream_id").alias("last_stream_id"),
    )


CACHES_HOURLY = ExportJobSpec(
    name="caches_hourly",
    stream="caches",
    transform=invalidations_per_cache_per_hour,
    description="invalidations per cache per hour (counts per exported range)",
)
