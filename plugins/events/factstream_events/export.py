"""The events plugin's Spark export jobs: one row per event, and per room and UTC day counts.

The ``events`` stream's rows are not events: an ID carries an ``ev`` row and maybe ``state`` rows,
and an event lives in several tables (the ``events`` index, its bytes in ``event_json``, its room's
version in ``rooms``). So these jobs read their own SQL (:class:`factstream.ExportSource`): the rows
of the ``events`` table whose ``stream_ordering`` is in the exported range, each event once, joined
to its JSON. The stream's watermark, checkpoints and committed ranges stay the core's, so each event
is exported exactly once however many writers wrote the stream.

Backfilled events have negative stream orderings on their own stream, ``backfill`` (positions
``-stream_ordering`` on the wire), so each job has a twin on that stream: ``events_backfilled`` and so
on. A job has one stream and one checkpoint, and the two streams advance independently (backfill
reaches back in time while new events come in), so the core's exactly-once ranges hold per stream;
readers read both directories (docs/plugins/events.md, "Export jobs").

``json`` is the event as served: a redacted event's pruned form (its room version's redaction
algorithm, as reads serve it), so a data set never keeps what a redaction removed; the ``*_raw`` jobs
keep the stored bytes instead. An event redacted after its range was exported stays as exported; the
redaction is exported too (``type`` ``m.room.redaction``, ``redacts``), so readers can apply it.
"""

from __future__ import annotations

from typing import Any

from factstream import ExportColumnKind, ExportJobSpec, ExportSource
from factstream_events.shared.rows import BACKFILL_STREAM, STREAM
from factstream_events.shared.served import pruned_json

#: The columns of the ``events`` jobs, in order, with the SQL of each (``e``: events, ``j``:
#: event_json, ``r``: rooms).
EVENT_COLUMNS: tuple[tuple[str, ExportColumnKind, str], ...] = (
    ("room_id", "string", "e.room_id"),
    ("event_id", "string", "e.event_id"),
    ("type", "string", "e.type"),
    ("sender", "string", "e.sender"),
    ("state_key", "string", "e.state_key"),
    ("stream_ordering", "long", "e.stream_ordering"),
    ("topological_ordering", "long", "e.topological_ordering"),
    ("instance_name", "string", "e.instance_name"),
    ("origin_server_ts", "long", "e.origin_server_ts"),
    ("received_ts", "long", "e.received_ts"),
    ("outlier", "boolean", "e.outlier"),
    ("backfilled", "boolean", "e.backfilled"),
    ("redacted", "boolean", "e.redacted_by IS NOT NULL"),
    ("redacts", "string", "e.redacts"),
    ("room_version", "string", "r.room_version"),
    ("json", "string", "convert_from(j.json, 'UTF8')"),
)

#: What ``room_daily`` reads of each event (no JSON: it only counts).
DAILY_COLUMNS = ("room_id", "type", "sender", "state_key", "origin_server_ts")


def _range(backwards: bool) -> str:
    """The condition on ``events.stream_ordering`` for positions ``(lo, hi]`` of the stream."""
    if backwards:
        return "e.stream_ordering < -%(lo)s::bigint AND e.stream_ordering >= -%(hi)s::bigint"
    return "e.stream_ordering > %(lo)s AND e.stream_ordering <= %(hi)s"


def events_sql(names: tuple[str, ...], *, backwards: bool) -> str:
    """``SELECT`` of the named :data:`EVENT_COLUMNS` for one stream's range, one row per event.

    Every event has exactly one ``events`` row, at its ``stream_ordering`` (positive: ``events``;
    negative: ``backfill``); the ``ex_outlier_stream`` and ``current_state_delta_stream`` rows the
    ``events`` stream also carries are not events, so they are not read.
    """
    exprs = {name: sql for name, _, sql in EVENT_COLUMNS}
    joins = ""
    if "json" in names:
        joins += " JOIN event_json j ON j.event_id = e.event_id"
    if "room_version" in names:
        joins += " LEFT JOIN rooms r ON r.room_id = e.room_id"
    select = ", ".join(exprs[n] for n in names)
    return f"SELECT {select} FROM events e{joins} WHERE {_range(backwards)}"


def prune_redacted(table: Any) -> Any:
    """``table`` with the ``json`` of its redacted events replaced by their pruned form.

    Runs in the Spark workers on each slice read (``ExportSource.finish``). Redacted events are few,
    so only their rows become Python objects. A redacted event whose room version is unknown (no
    redaction rules) gets a null ``json``: nothing it held is exported.
    """
    import pyarrow as pa
    import pyarrow.compute as pc

    redacted = pc.fill_null(table.column("redacted"), False)
    if not pc.any(redacted).as_py():
        return table
    mask = redacted.combine_chunks()
    rows = pc.indices_nonzero(mask).to_pylist()
    raws = pc.take(table.column("json"), rows).to_pylist()
    versions = pc.take(table.column("room_version"), rows).to_pylist()
    pruned: list[str | None] = []
    for raw, version in zip(raws, versions, strict=True):
        try:
            pruned.append(pruned_json(raw.encode(), version).decode() if raw is not None else None)
        except Exception:  # no rules for its version, or bytes that do not parse: export nothing of it
            pruned.append(None)
    index = table.schema.get_field_index("json")
    column = pc.replace_with_mask(table.column("json").combine_chunks(), mask, pa.array(pruned, pa.string()))
    return table.set_column(index, table.schema.field("json"), column)


def room_daily(df: Any) -> Any:
    """Per room and UTC day of ``origin_server_ts``, over the events of the exported range:

    ``events``, ``messages`` (``m.room.message``), ``state_changes`` (state events), ``senders``
    (distinct senders) and ``sender_ids`` (those senders, sorted). Counts add up across ranges;
    distinct senders do not, so ``sender_ids`` lets a reader count them over several ranges
    (``size(array_distinct(flatten(collect_list(sender_ids))))``).
    """
    from pyspark.sql import functions as F

    day = F.date_from_unix_date(F.floor(F.col("origin_server_ts") / 86_400_000).cast("int"))
    return (
        df.withColumn("day", day)
        .groupBy("room_id", "day")
        .agg(
            F.count(F.lit(1)).alias("events"),
            F.count(F.when(F.col("type") == "m.room.message", 1)).alias("messages"),
            F.count(F.when(F.col("state_key").isNotNull(), 1)).alias("state_changes"),
            F.count_distinct("sender").alias("senders"),
            F.array_sort(F.collect_set("sender")).alias("sender_ids"),
        )
    )


def _events_job(name: str, stream: str, *, raw: bool, description: str) -> ExportJobSpec:
    backwards = stream == BACKFILL_STREAM
    names = tuple(n for n, _, _ in EVENT_COLUMNS)
    source = ExportSource(
        sql=events_sql(names, backwards=backwards),
        columns=tuple((n, k) for n, k, _ in EVENT_COLUMNS),
        finish=None if raw else prune_redacted,
    )
    return ExportJobSpec(name=name, stream=stream, source=source, description=description)


def _daily_job(name: str, stream: str, description: str) -> ExportJobSpec:
    kinds = {n: k for n, k, _ in EVENT_COLUMNS}
    source = ExportSource(
        sql=events_sql(DAILY_COLUMNS, backwards=stream == BACKFILL_STREAM),
        columns=tuple((n, kinds[n]) for n in DAILY_COLUMNS),
    )
    return ExportJobSpec(name=name, stream=stream, source=source, transform=room_daily, description=description)


EXPORT_JOBS = (
    _events_job("events", STREAM, raw=False, description="one row per event; redacted events pruned"),
    _events_job("events_raw", STREAM, raw=True, description="one row per event, with the stored JSON"),
    _events_job(
        "events_backfilled", BACKFILL_STREAM, raw=False, description="one row per backfilled event; redacted pruned"
    ),
    _events_job(
        "events_raw_backfilled", BACKFILL_STREAM, raw=True, description="one row per backfilled event, stored JSON"
    ),
    _daily_job("room_daily", STREAM, "per room and UTC day: events, messages, state changes, senders"),
    _daily_job("room_daily_backfilled", BACKFILL_STREAM, "room_daily over backfilled events"),
)
