"""Writing a job's range straight to Parquet from the Python workers, for jobs that change nothing.

A job with no ``transform``, no ``partition_by`` and the ``parquet`` format writes the stream's facts
as they are. For those the runner skips the DataFrame: each Spark task reads its slice of the range
with ``COPY`` into Arrow (as the data source does) and writes its own Parquet file with pyarrow into
the range's staging directory, so the rows never cross into the JVM and back. The staging directory,
the commit and the checkpoint are the same as on the DataFrame path, so the exactly-once guarantees
do not change. The output reads back with ``spark.read.parquet`` like any other.

Workers need the output location through pyarrow's filesystems: local paths and ``file:`` URIs,
and ``s3://``, ``gs://``, ``hdfs://`` where pyarrow supports them. For any other scheme (or when the
driver cannot resolve it) the runner uses Spark's writer instead.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any
from urllib.parse import urlparse

from factstream.export.output import local_path
from factstream.export.plan import StreamPlan, split_range
from factstream.plugin.specs import ExportJobSpec


def can_write_directly(job: ExportJobSpec, staging: str) -> bool:
    """Whether ``job`` writes facts unchanged as Parquet to a location pyarrow can reach."""
    if job.transform is not None or job.partition_by or job.format != "parquet" or job.content:
        return False
    try:
        _filesystem(staging)
    except Exception:
        return False
    return True


def _filesystem(uri: str) -> tuple[Any, str]:
    """``(pyarrow FileSystem, path)`` for a local path, a ``file:`` URI (one or three slashes) or another URI."""
    from pyarrow import fs

    local = local_path(uri)
    if local is not None:
        return fs.LocalFileSystem(), local.as_posix()
    if not urlparse(uri).scheme:
        return fs.LocalFileSystem(), uri
    resolved: tuple[Any, str] = fs.FileSystem.from_uri(uri)
    return resolved


def write_range(spark: Any, url: str, plan: StreamPlan, staging: str, start: int, upto: int, tasks: int) -> int:
    """Write the facts of ``(start, upto]`` as Parquet files into ``staging``; returns the row count."""
    filesystem, path = _filesystem(staging)
    filesystem.create_dir(path, recursive=True)
    ranges = split_range(start, upto, tasks)
    if not ranges:
        return 0

    def write_task(index: int, items: Iterator[tuple[int, int]]) -> Iterator[int]:
        import pyarrow.parquet as pq

        from factstream.export.read import read_tables

        task_fs, task_path = _filesystem(staging)
        rows = 0
        writer = None
        try:
            for lo, hi in items:
                for table in read_tables(url, plan, lo, hi):
                    if writer is None:
                        target = f"{task_path}/part-{index:05d}.parquet"
                        writer = pq.ParquetWriter(target, table.schema, filesystem=task_fs, compression="snappy")
                    writer.write_table(table)  # one row group per slice, not one per small batch
                    rows += table.num_rows
        finally:
            if writer is not None:
                writer.close()
        yield rows

    counts = spark.sparkContext.parallelize(ranges, len(ranges)).mapPartitionsWithIndex(write_task).collect()
    return int(sum(counts))
