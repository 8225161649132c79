"""How one stream is read for export: columns, types and the SQL for a range of stream IDs. No I/O.

A :class:`StreamPlan` is built on the driver from the plugin's :class:`~factstream.plugin.streams.StreamSpec`
and shipped (pickled) to the Spark executors, so an executor reading a table-backed stream needs only
factstream itself, not the plugin that declared the stream. It follows the stream's own definition,
as :func:`factstream.plugin.streams.table_update_function` does: every backing table contributes its rows,
each table has a column per field of the row type, and a backwards stream's stored IDs (-2, -3, ...)
are turned into positive wire tokens, which are also the positions ranges are given in.

Columns of an exported fact, in order:

* ``stream_id`` (long): the fact's position on the stream (the wire token: positive for every stream);
* ``instance_name`` (string): the writer;
* ``source_table`` (string): the backing table the row came from (the row's kind when a stream has
  several tables; null for streams read through the plugin's own update function);
* one column per field of the row type;
* ``content`` (string, only with the ``content`` option): the whole backing row as a JSON object,
  every column included, for plugins whose tables carry more than the replication row.
"""

from __future__ import annotations

import dataclasses
import decimal
import types
import typing
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import msgspec

from factstream.errors import FactstreamError
from factstream.plugin.specs import ExportJobSpec, ExportSource
from factstream.plugin.streams import StreamSpec, StreamTable, UpdateFunction

#: Columns every exported fact has before the row type's fields.
META_COLUMNS = ("stream_id", "instance_name", "source_table")
CONTENT_COLUMN = "content"

#: Field kinds: how a field is selected in SQL and typed in Arrow and Spark.
#: ``json`` is any other type, exported as its PostgreSQL JSON text (to_jsonb(column)::text).
FieldKind = typing.Literal["string", "long", "double", "boolean", "json"]

_SPARK_TYPES = {"string": "string", "long": "bigint", "double": "double", "boolean": "boolean", "json": "string"}


class ExportError(FactstreamError):
    """An export cannot run as asked (unknown job or stream, bad option, inconsistent output)."""


@dataclass(frozen=True)
class FieldPlan:
    """One field of the row type: its name and how it is exported."""

    name: str
    kind: FieldKind


def _kind_of(annotation: Any) -> FieldKind:
    """The export kind of a msgspec field type; optional types export as their inner type."""
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        inner = [a for a in typing.get_args(annotation) if a is not type(None)]
        return _kind_of(inner[0]) if len(inner) == 1 else "json"
    if annotation is bool:
        return "boolean"
    if annotation is int:
        return "long"
    if annotation in (float, decimal.Decimal):
        return "double"
    if annotation is str:
        return "string"
    # datetimes, bytes, containers, nested structs: their JSON text
    return "json"


@dataclass(frozen=True)
class StreamPlan:
    """Everything an executor needs to read facts of one stream (picklable, immutable)."""

    stream: str
    positive: bool
    tables: tuple[StreamTable, ...]
    fields: tuple[FieldPlan, ...]
    sequence: str
    positions_key: str
    #: The plugin's own update function, when it has one: facts are then read through it.
    update_function: UpdateFunction | None = None
    #: A job's own SQL (:class:`~factstream.plugin.specs.ExportSource`): when set, its columns and its
    #: ``SELECT`` replace the stream's (and its update function); the stream's tables still give the
    #: watermark.
    source: ExportSource | None = None

    @classmethod
    def from_spec(cls, spec: StreamSpec[Any]) -> StreamPlan:
        """The plan for a registered stream; raises :class:`ExportError` if a field name is reserved."""
        fields = []
        for info in msgspec.structs.fields(spec.row_type):
            if info.name in (*META_COLUMNS, CONTENT_COLUMN):
                raise ExportError(
                    f"stream {spec.name!r}: row field {info.name!r} clashes with an export column "
                    f"({', '.join((*META_COLUMNS, CONTENT_COLUMN))}); rename the field to export this stream"
                )
            fields.append(FieldPlan(info.name, _kind_of(info.type)))
        return cls(
            stream=spec.name,
            positive=spec.positive,
            tables=spec.tables,
            fields=tuple(fields),
            sequence=spec.sequence,
            positions_key=spec.positions_key,
            update_function=spec.update_function,
        )

    def for_job(self, job: ExportJobSpec) -> StreamPlan:
        """The plan a job reads: this stream's, or with the job's own source."""
        return self if job.source is None else dataclasses.replace(self, source=job.source)

    # -- schema --------------------------------------------------------------------------------------

    def column_names(self, content: bool) -> list[str]:
        if self.source is not None:
            return [name for name, _ in self.source.columns]
        names = [*META_COLUMNS, *(f.name for f in self.fields)]
        return [*names, CONTENT_COLUMN] if content else names

    def spark_ddl(self, content: bool) -> str:
        """The DataFrame schema as a Spark DDL string (``stream_id bigint, instance_name string, ...``)."""
        if self.source is not None:
            return ", ".join(f"`{name}` {_SPARK_TYPES[kind]}" for name, kind in self.source.columns)
        parts = ["stream_id bigint", "instance_name string", "source_table string"]
        parts += [f"`{f.name}` {_SPARK_TYPES[f.kind]}" for f in self.fields]
        if content:
            parts.append(f"{CONTENT_COLUMN} string")
        return ", ".join(parts)

    def arrow_schema(self, content: bool) -> Any:
        """The same schema in Arrow (``pyarrow.Schema``)."""
        import pyarrow as pa

        arrow = {"string": pa.string(), "long": pa.int64(), "double": pa.float64(), "boolean": pa.bool_()}
        if self.source is not None:
            return pa.schema([pa.field(name, arrow[kind]) for name, kind in self.source.columns])
        cols = [
            pa.field("stream_id", pa.int64()),
            pa.field("instance_name", pa.string()),
            pa.field("source_table", pa.string()),
        ]
        cols += [pa.field(f.name, arrow.get(f.kind, pa.string())) for f in self.fields]
        if content:
            cols.append(pa.field(CONTENT_COLUMN, pa.string()))
        return pa.schema(cols)

    # -- SQL -----------------------------------------------------------------------------------------

    def range_condition(self, table: StreamTable) -> str:
        """``WHERE`` condition selecting a table's facts with wire tokens in ``(%(lo)s, %(hi)s]``.

        Written on the stored column itself so that the stream-ID index serves it.
        """
        col = table.id_column
        if self.positive:
            return f"{col} > %(lo)s AND {col} <= %(hi)s"
        return f"{col} < -%(lo)s::bigint AND {col} >= -%(hi)s::bigint"

    def select_sql(self, content: bool) -> str:
        """One query over every backing table returning the export columns for ``(%(lo)s, %(hi)s]``.

        With one backing table the constant ``source_table`` column is left out (the reader adds it
        without sending it once per row): see :meth:`copied_columns`.
        """
        selects = []
        for t in self.tables:
            token = t.id_column if self.positive else f"-{t.id_column}"
            cols = [f"{token}::bigint", f"{t.instance_column}::text"]
            if len(self.tables) > 1:
                cols.append(f"'{t.table}'::text")
            for f in self.fields:
                cols.append(_field_sql(t.table, f))
            if content:
                cols.append(f"row_to_json({t.table}.*)::text")
            selects.append(f"SELECT {', '.join(cols)} FROM {t.table} WHERE {self.range_condition(t)}")
        return " UNION ALL ".join(selects)

    def copied_columns(self, content: bool) -> list[str]:
        """The columns :meth:`select_sql` returns, in order (the schema's, maybe without ``source_table``)."""
        names = list(self.arrow_schema(content).names)
        if self.source is None and len(self.tables) == 1:
            names.remove("source_table")
        return names

    def copy_sql(self, lo: int, hi: int, content: bool) -> str:
        """``COPY (...) TO STDOUT`` of the facts in ``(lo, hi]``, as CSV (values inlined: COPY takes no
        parameters; both are integers)."""
        sql = self.source.sql if self.source is not None else self.select_sql(content)
        query = sql % {"lo": int(lo), "hi": int(hi)}
        return f"COPY ({query}) TO STDOUT (FORMAT csv)"


def _field_sql(table: str, f: FieldPlan) -> str:
    col = f"{table}.{f.name}"
    if f.kind == "string":
        return f"{col}::text"
    if f.kind == "json":
        return f"to_jsonb({col})::text"
    return col


def split_range(lo: int, hi: int, parts: int) -> list[tuple[int, int]]:
    """Split ``(lo, hi]`` into at most ``parts`` contiguous, non-empty ranges covering it exactly."""
    if hi <= lo:
        return []
    parts = max(1, min(parts, hi - lo))
    size, extra = divmod(hi - lo, parts)
    out = []
    start = lo
    for i in range(parts):
        end = start + size + (1 if i < extra else 0)
        out.append((start, end))
        start = end
    return out


def plans_for(specs: Sequence[StreamSpec[Any]]) -> dict[str, StreamPlan | str]:
    """Plans for the given streams; a stream that cannot be exported maps to the reason why."""
    out: dict[str, StreamPlan | str] = {}
    for spec in specs:
        try:
            out[spec.name] = StreamPlan.from_spec(spec)
        except ExportError as exc:
            out[spec.name] = str(exc)
    return out


def job_plans(jobs: Iterable[ExportJobSpec], plans: Mapping[str, StreamPlan | str]) -> dict[str, StreamPlan]:
    """The plans of the jobs that read their own SQL (:class:`ExportSource`), by job name.

    A job whose stream has no plan is left out (the runner reports it when the job runs).
    """
    out: dict[str, StreamPlan] = {}
    for job in jobs:
        found = plans.get(job.stream)
        if job.source is not None and isinstance(found, StreamPlan):
            out[job.name] = found.for_job(job)
    return out
