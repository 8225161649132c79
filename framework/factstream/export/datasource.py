"""The ``factstream`` Spark data source (PySpark's Python Data Source API), batch and streaming.

Register it once per Spark session with :func:`register_data_source`, then::

    df = (spark.read.format("factstream")
          .option("stream", "notes").option("from", 0).option("upto", 1000).load())

reads exactly the facts of stream ``notes`` with positions in ``(from, upto]`` (see
:mod:`factstream.export.plan` for the columns). ``upto`` defaults to the stream's watermark
(:mod:`factstream.export.watermark`), so a read never passes a fact that is still in flight. The range
is split by stream position into partitions; each Spark task reads its range with PostgreSQL ``COPY``
into Arrow record batches.

``spark.readStream.format("factstream")`` is a streaming source whose offsets are stream positions
(``{"position": N}``): each micro-batch reads ``(previous offset, watermark]``. Ranges below the
watermark never change, so a query with a checkpoint location replays a failed batch with exactly the
same facts, and Spark's file sink writes each fact exactly once.

Options: ``stream`` (required), ``from`` (default 0, exclusive), ``upto`` (default the watermark,
inclusive; batch only), ``partitions`` (default: one per ``idsPerPartition`` IDs),
``idsPerPartition`` (default 250000), ``content`` (``true`` adds the ``content`` column), ``url``
(database URL; default the one given at registration).

Spark pickles the data source class to run it in Python workers: :func:`register_data_source` builds a
subclass carrying the plans of the driver's registered streams and the database URL, so executors need
factstream and its dependencies installed, but not the plugins, unless a stream is read through its
plugin's own update function (then that plugin must be importable on the executors too).
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from typing import Any, ClassVar

from pyspark.sql.datasource import DataSource, DataSourceReader, DataSourceStreamReader, InputPartition

from factstream.export.plan import ExportError, StreamPlan, job_plans, plans_for, split_range
from factstream.export.read import connect, read_range
from factstream.export.watermark import persisted_upto

FORMAT = "factstream"
DEFAULT_IDS_PER_PARTITION = 250_000


class RangePartition(InputPartition):
    """One Spark task's share: the facts with positions in ``(lo, hi]``."""

    def __init__(self, lo: int, hi: int) -> None:
        super().__init__((lo, hi))


class _Options:
    """The reader options, validated once (errors name the option)."""

    def __init__(
        self,
        options: Mapping[str, str],
        catalog: Mapping[str, StreamPlan | str],
        url: str | None,
        jobs: Mapping[str, StreamPlan] | None = None,
    ) -> None:
        job = options.get("job")
        stream = options.get("stream")
        if job:
            # a job with its own SQL: its columns and rows, its stream's watermark
            plan = (jobs or {}).get(job)
            if plan is None:
                known = ", ".join(sorted(jobs or {})) or "none"
                raise ExportError(
                    f"factstream data source: no export job {job!r} with its own source (registered: {known})"
                )
            if stream and stream != plan.stream:
                raise ExportError(f"factstream data source: job {job!r} reads stream {plan.stream!r}, not {stream!r}")
            stream = plan.stream
        if not stream:
            raise ExportError('the factstream data source needs .option("stream", NAME) or .option("job", NAME)')
        found = plan if job else catalog.get(stream)
        if found is None:
            known = ", ".join(sorted(catalog)) or "none"
            raise ExportError(f"unknown stream {stream!r} for the factstream data source (registered: {known})")
        if isinstance(found, str):
            raise ExportError(found)
        self.plan = found
        if self.plan.source is not None and str(options.get("content", "false")).lower() in ("1", "true", "yes"):
            raise ExportError(
                f"factstream data source: job {job!r} has its own columns; the content option is not for it"
            )
        self.url = options.get("url") or url
        if not self.url:
            raise ExportError('the factstream data source needs a database: .option("url", "postgresql://...")')
        self.start = _int_option(options, "from", 0)
        upto = options.get("upto")
        self.upto = None if upto in (None, "") else _int_option(options, "upto", 0)
        self.partitions = _int_option(options, "partitions", 0) or None
        self.ids_per_partition = _int_option(options, "idsPerPartition", DEFAULT_IDS_PER_PARTITION)
        self.content = str(options.get("content", "false")).lower() in ("1", "true", "yes")
        if self.start < 0 or (self.upto is not None and self.upto < 0) or self.ids_per_partition < 1:
            raise ExportError("factstream data source: from, upto and idsPerPartition must be positive")

    def watermark(self) -> int:
        with connect(self.url or "") as conn:
            return persisted_upto(conn, self.plan)

    def split(self, lo: int, hi: int) -> list[RangePartition]:
        parts = self.partitions or -(-(hi - lo) // self.ids_per_partition)
        return [RangePartition(a, b) for a, b in split_range(lo, hi, parts)]


def _int_option(options: Mapping[str, str], name: str, default: int) -> int:
    value = options.get(name)
    if value is None or value == "":
        return default
    try:
        return int(value)
    except (TypeError, ValueError):
        raise ExportError(f"factstream data source: option {name!r} must be an integer, not {value!r}") from None


class FactstreamDataSource(DataSource):
    """The data source; use :func:`register_data_source`, which fills in ``catalog`` and ``url``."""

    #: Stream name -> plan (or why the stream cannot be exported); set by :func:`register_data_source`.
    catalog: ClassVar[Mapping[str, StreamPlan | str]] = {}
    #: The default database URL.
    url: ClassVar[str | None] = None
    #: Job name -> plan, for jobs with their own SQL (``.option("job", NAME)``).
    jobs: ClassVar[Mapping[str, StreamPlan]] = {}

    @classmethod
    def name(cls) -> str:
        return FORMAT

    def __init__(self, options: Any) -> None:
        super().__init__(options)
        self.parsed = _Options(dict(options), self.catalog, self.url, self.jobs)

    def schema(self) -> str:
        return self.parsed.plan.spark_ddl(self.parsed.content)

    def reader(self, schema: Any) -> DataSourceReader:
        return FactstreamReader(self.parsed)

    def streamReader(self, schema: Any) -> DataSourceStreamReader:
        return FactstreamStreamReader(self.parsed)


class FactstreamReader(DataSourceReader):
    """Batch reads of ``(from, upto]``; ``upto`` is fixed when the read is planned."""

    def __init__(self, options: _Options) -> None:
        self.options = options
        self.upto = options.upto if options.upto is not None else options.watermark()

    def partitions(self) -> Sequence[InputPartition]:
        return self.options.split(self.options.start, self.upto)

    def read(self, partition: InputPartition) -> Iterator[Any]:
        if partition.value is None:  # Spark's stand-in when partitions() found nothing to read
            return
        lo, hi = partition.value
        o = self.options
        yield from read_range(o.url or "", o.plan, int(lo), int(hi), content=o.content)


class FactstreamStreamReader(DataSourceStreamReader):
    """Micro-batches over stream positions: each one reads ``(start, watermark]``."""

    def __init__(self, options: _Options) -> None:
        self.options = options

    def initialOffset(self) -> dict[str, int]:
        return {"position": self.options.start}

    def latestOffset(self, start: dict[str, int] | None = None, limit: Any = None) -> dict[str, int]:
        # Never behind the start: a watermark computed lower than before (a writer came back) is
        # still above every fact already read.
        low = int(start["position"]) if start else self.options.start
        return {"position": max(low, self.options.watermark())}

    def partitions(self, start: dict[str, int], end: dict[str, int]) -> Sequence[InputPartition]:
        return self.options.split(int(start["position"]), int(end["position"]))

    def read(self, partition: InputPartition) -> Iterator[Any]:
        if partition.value is None:  # Spark's stand-in when partitions() found nothing to read
            return
        lo, hi = partition.value
        o = self.options
        yield from read_range(o.url or "", o.plan, int(lo), int(hi), content=o.content)


def data_source_class(
    plans: Mapping[str, StreamPlan | str], url: str | None, jobs: Mapping[str, StreamPlan] | None = None
) -> type[FactstreamDataSource]:
    """A :class:`FactstreamDataSource` subclass carrying ``plans``, ``url`` and the plans of jobs with
    their own SQL, ``jobs`` (pickled by value)."""
    return type(
        "FactstreamDataSource",
        (FactstreamDataSource,),
        {
            "catalog": dict(plans),
            "url": url,
            "jobs": dict(jobs or {}),
            "__module__": __name__,
            "__qualname__": "_registered",
        },
    )


def register_data_source(spark: Any, *, plugins: Any = None, url: str | None = None) -> None:
    """Register the ``factstream`` format in ``spark`` for the streams of ``plugins``.

    ``plugins`` is a :class:`~factstream.plugin.manager.PluginHost` (default: the installed plugins, as the
    CLI loads them); ``url`` the database URL readers use unless given ``.option("url", ...)``
    (default: the configured database, as ``factstream`` commands find it).
    """
    if plugins is None:
        from factstream.plugin.manager import load_plugins

        plugins = load_plugins()
    if url is None:
        from factstream.config import load_config
        from factstream.db.engine import database_url

        url = database_url(load_config())
    plans = plans_for([r.spec for r in plugins.registry.streams])
    jobs = job_plans([r.spec for r in plugins.registry.export_jobs], plans)
    spark.dataSource.register(data_source_class(plans, url, jobs))
