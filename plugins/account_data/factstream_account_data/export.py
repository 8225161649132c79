"""The account_data stream's Spark export job: the latest change of each user's types."""

from __future__ import annotations

from typing import Any

from factstream import ExportJobSpec


def latest_change_per_user_and_type(df: Any) -> Any:
    """``(user_id, room_id, data_type, changes, first_stream_id, last_stream_id, last_instance)``.

    One row per (user, room, type) that changed in the exported range; ``room_id`` is null for
    global account data. ``last_stream_id`` / ``last_instance`` name the latest change in the range.
    """
    from pyspark.sql import functions as F

    latest = F.max_by(F.col("instance_name"), F.col("stream_id"))
    return df.groupBy("user_id", "room_id", "data_type").agg(
        F.count(F.lit(1)).alias("changes"),
        F.min("stream_id").alias("first_stream_id"),
        F.max("stream_id").alias("last_stream_id"),
        latest.alias("last_instance"),
    )


ACCOUNT_DATA_LATEST = ExportJobSpec(
    name="account_data_latest",
    stream="account_data",
    transform=latest_change_per_user_and_type,
    description="the latest change per user, room and account data type (per exported range)",
)
