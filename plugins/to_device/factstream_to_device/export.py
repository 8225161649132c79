"""The to_device stream's Spark export job: messages per day per event type.

The row type carries only the recipient (``entity``); the event type and the time a message was
received live in the inbox table, so the job asks for each fact's whole table row (``content=True``)
and reads ``message_type`` and ``received_ts`` from it. One row of the stream is one message for one
device. Counts cover one exported range: sum over the ``export_range=*`` directories for totals.
"""

from __future__ import annotations

from typing import Any

from factstream import ExportJobSpec


def messages_per_day_per_type(df: Any) -> Any:
    """``(day, message_type, messages, senders, recipients, first_stream_id, last_stream_id)``.

    ``day`` is the UTC date of ``received_ts``; ``messages`` counts device deliveries,
    ``senders``/``recipients`` distinct users.
    """
    from pyspark.sql import functions as F

    inbox = F.from_json("content", "message_type STRING, received_ts BIGINT, sender STRING")
    rows = df.select("stream_id", "entity", inbox.alias("m"))
    day = F.to_date(F.timestamp_millis(F.col("m.received_ts")))
    return rows.groupBy(day.alias("day"), F.col("m.message_type").alias("message_type")).agg(
        F.count(F.lit(1)).alias("messages"),
        F.countDistinct("m.sender").alias("senders"),
        F.countDistinct("entity").alias("recipients"),
        F.min("stream_id").alias("first_stream_id"),
        F.max("stream_id").alias("last_stream_id"),
    )


TO_DEVICE_DAILY = ExportJobSpec(
    name="to_device_daily",
    stream="to_device",
    transform=messages_per_day_per_type,
    content=True,
    description="to-device messages per day per event type (per exported range)",
)
