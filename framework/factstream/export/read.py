"""Reading one range of a stream into Arrow record batches (what a Spark task does). Blocking I/O.

Table-backed streams are read with one ``COPY (SELECT ... UNION ALL ...) TO STDOUT (FORMAT csv)``
whose output is parsed by Arrow's multithreaded CSV reader as it arrives, so rows never become
Python objects. Streams whose plugin provides its own update function are read through it, writer by
writer, exactly as replication reads them.

Every read is of a closed range ``(lo, hi]`` at or below the watermark: the facts in it are complete
and never change (streams are append-only), so a task that is retried reads exactly the same facts.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import msgspec
import psycopg

from factstream.db.engine import libpq_url
from factstream.export.plan import StreamPlan, split_range

#: How export connections are named in PostgreSQL: not ``factstream/<instance>``, so an export is
#: never mistaken for a live writer (see :mod:`factstream.export.watermark`).
APPLICATION_NAME = "factstream-export"

#: Stream IDs per ``COPY`` statement: a task reads its range in slices of this size.
COPY_SLICE_IDS = 100_000

#: Rows per record batch from an update function.
FUNCTION_BATCH_ROWS = 10_000


def connect(url: str) -> psycopg.Connection[Any]:
    """A blocking connection for export work (autocommit, named ``factstream-export``)."""
    return psycopg.connect(libpq_url(url), autocommit=True, application_name=APPLICATION_NAME, connect_timeout=10)


def read_range(url: str, plan: StreamPlan, lo: int, hi: int, *, content: bool = False) -> Iterator[Any]:
    """Yield ``pyarrow.RecordBatch``es holding exactly the facts of ``plan``'s stream in ``(lo, hi]``."""
    for table in read_tables(url, plan, lo, hi, content=content):
        for batch in table.to_batches():
            if batch.num_rows:
                yield batch


def read_tables(url: str, plan: StreamPlan, lo: int, hi: int, *, content: bool = False) -> Iterator[Any]:
    """Like :func:`read_range`, but one ``pyarrow.Table`` per slice read (none empty)."""
    if hi <= lo:
        return
    if plan.update_function is not None and plan.source is None:
        import pyarrow as pa

        for batch in _read_with_function(url, plan, lo, hi, content):
            yield pa.Table.from_batches([batch])
    else:
        finish = plan.source.finish if plan.source is not None else None
        for table in _read_with_copy(url, plan, lo, hi, content):
            yield table if finish is None else finish(table)


def _read_with_copy(url: str, plan: StreamPlan, lo: int, hi: int, content: bool) -> Iterator[Any]:
    """One ``COPY`` per slice of at most :data:`COPY_SLICE_IDS` IDs, each parsed whole by Arrow.

    Whole slices (rather than a stream cut into blocks) let Arrow's CSV reader split the work across
    threads even though values may contain newlines, and bound the memory a task holds.
    """
    import pyarrow as pa
    from pyarrow import csv

    schema = plan.arrow_schema(content)
    copied = plan.copied_columns(content)
    # With one backing table, source_table is the same on every row: added here, not sent per row.
    constant = plan.tables[0].table if plan.source is None and "source_table" not in copied else None
    read_options = csv.ReadOptions(column_names=copied)
    parse_options = csv.ParseOptions(newlines_in_values=True)
    convert_options = csv.ConvertOptions(
        column_types={f.name: f.type for f in schema if f.name in copied},
        strings_can_be_null=True,  # COPY writes NULL unquoted and empty, ""
        quoted_strings_can_be_null=False,  # ... and an empty string quoted
        true_values=["t"],
        false_values=["f"],
    )
    slices = split_range(lo, hi, -(-(hi - lo) // COPY_SLICE_IDS))
    with connect(url) as conn, conn.cursor() as cur, ThreadPoolExecutor(1, "factstream-copy") as pool:

        def fetch(index: int) -> bytearray:
            a, b = slices[index]
            data = bytearray()
            with cur.copy(plan.copy_sql(a, b, content)) as copy:
                for chunk in copy:
                    data += chunk
            return data

        # The next slice's COPY runs (in a thread, on the same connection) while this one is parsed
        # and consumed: the server produces rows while the task works on the previous ones.
        pending = pool.submit(fetch, 0) if slices else None
        for index in range(len(slices)):
            assert pending is not None
            data = pending.result()
            pending = pool.submit(fetch, index + 1) if index + 1 < len(slices) else None
            if not data:
                continue
            table = csv.read_csv(
                pa.py_buffer(data),  # no copy: Arrow reads the bytearray in place
                read_options=read_options,
                parse_options=parse_options,
                convert_options=convert_options,
            )
            del data
            if not table.num_rows:
                continue
            if constant is not None:
                column = _repeat(constant, table.num_rows)
                table = table.add_column(schema.get_field_index("source_table"), schema.field("source_table"), column)
            yield table


def _repeat(value: str, n: int) -> Any:
    """A string array of ``n`` copies of ``value``, built in Arrow (dictionary indices all 0, decoded)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    indices = pc.fill_null(pa.nulls(n, pa.int32()), 0)
    return pa.DictionaryArray.from_arrays(indices, pa.array([value])).cast(pa.string())


def _read_with_function(url: str, plan: StreamPlan, lo: int, hi: int, content: bool) -> Iterator[Any]:
    """Read through the plugin's update function, one writer at a time, in pages."""

    from factstream.db.database import Database

    schema = plan.arrow_schema(content)
    with connect(url) as conn:
        instances: set[str] = set()
        for t in plan.tables:
            rows = conn.execute(
                f"SELECT DISTINCT {t.instance_column}::text FROM {t.table} WHERE {plan.range_condition(t)}",
                {"lo": lo, "hi": hi},
            ).fetchall()
            instances.update(str(r[0]) for r in rows)
    update = plan.update_function
    assert update is not None
    names = [f.name for f in plan.fields]
    json_fields = {f.name for f in plan.fields if f.kind == "json"}
    # Sessions named plain "factstream": never taken for a live writer.
    db = Database(url, instance_name=None, pool_size=1)
    loop = asyncio.new_event_loop()
    try:
        for instance in sorted(instances):
            low = lo
            while low < hi:
                updates, upto, limited = loop.run_until_complete(update(db, instance, low, hi, FUNCTION_BATCH_ROWS))
                if updates:
                    yield _batch(schema, names, json_fields, instance, updates, content)
                if not limited:
                    break
                low = upto
    finally:
        loop.run_until_complete(db.close())
        loop.close()


def _batch(
    schema: Any, names: list[str], json_fields: set[str], instance: str, updates: list[Any], content: bool
) -> Any:
    import pyarrow as pa

    n = len(updates)
    columns: dict[str, list[Any]] = {
        "stream_id": [token for token, _ in updates],
        "instance_name": [instance] * n,
        "source_table": [None] * n,
    }
    for name in names:
        values = [getattr(row, name) for _, row in updates]
        if name in json_fields:
            values = [None if v is None else msgspec.json.encode(v).decode() for v in values]
        columns[name] = values
    if content:
        columns["content"] = [None] * n
    return pa.RecordBatch.from_pydict(columns, schema=schema)
