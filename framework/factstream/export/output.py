"""An export job's output directory and its atomic commit, through Hadoop's FileSystem API.

Layout under the job's directory (``<output>/<job>/``)::

    export_range=00000000000000000000-00000000000000001000/   committed range (0, 1000]
        _COMMITTED                                           written last: the range is complete
        part-....parquet  or  <partition column>=<value>/part-....parquet
    _staging/<from>-<upto>-<attempt>/                        Spark writes here first
    _trash/...                                               ranges being removed

Spark's readers skip names starting with ``_``, and ``export_range=`` is a partition directory, so
``spark.read.parquet("<output>/<job>")`` reads every committed fact (with an ``export_range`` column).

A range is written to a fresh staging directory, renamed to its deterministic final name, and marked
``_COMMITTED``; only then does the runner advance the checkpoint. A rerun after a crash finds a marked
range that starts at the checkpoint and adopts it instead of writing it again; a final directory
without the marker (a crash during the rename or before the marker) is moved to ``_trash`` and
written again. Removal is a rename to ``_trash`` followed by a delete, so no half-deleted range is ever
taken for a committed one.

The rename is atomic on local filesystems and HDFS: readers see a whole range or nothing. On object
stores (S3A, GCS, ABFS without hierarchical namespace) a directory rename is a copy then a delete:
readers may briefly see part of a range, but the marker still makes reruns exactly-once.
"""

from __future__ import annotations

import re
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from factstream.export.plan import ExportError

RANGE_PREFIX = "export_range="
MARKER = "_COMMITTED"
_RANGE_RE = re.compile(r"^export_range=(\d{20})-(\d{20})$")


def range_name(lo: int, hi: int) -> str:
    """The deterministic directory name of range ``(lo, hi]``."""
    return f"{RANGE_PREFIX}{lo:020d}-{hi:020d}"


def local_uri(path: Path) -> str:
    """The output URI of a local directory: ``file://`` and its absolute path, unescaped. Hadoop's
    ``Path`` (which Spark's writers and the output checks use) does not decode ``%20`` and the like, so
    ``Path.as_uri()`` of a directory with a space or a bracket in its name names one that does not exist."""
    return "file://" + path.resolve().as_posix()


def local_path(uri: str) -> Path | None:
    """The local path of a ``file:`` URI as Hadoop's ``Path`` reads it, ``None`` for any other filesystem.

    The path is the rest of the URI after ``file:`` and any ``//authority``, taken literally (not
    percent-decoded, and ``#`` or ``?`` are part of it), as Hadoop takes it: the inverse of
    :func:`local_uri`, so the driver's checks, pyarrow's writes and Hadoop's commit name one directory."""
    if not uri.startswith("file:"):
        return None
    rest = uri[len("file:") :]
    if rest.startswith("//"):
        slash = rest.find("/", 2)
        rest = rest[slash:] if slash >= 0 else "/"
    return Path(rest)


@dataclass(frozen=True)
class RangeDir:
    lo: int
    hi: int
    path: str
    committed: bool


class JobOutput:
    """The output directory of one job, on any filesystem Hadoop knows (``file:``, ``hdfs:``, ``s3a:`` ...)."""

    def __init__(self, spark: Any, root: str, job: str) -> None:
        self.spark = spark
        self.root = root.rstrip("/")
        self.job = job
        self.path = f"{self.root}/{job}"
        jvm = spark.sparkContext._jvm
        self._Path = jvm.org.apache.hadoop.fs.Path
        conf = spark.sparkContext._jsc.hadoopConfiguration()
        try:
            self.fs = self._Path(self.root).getFileSystem(conf)
            exists = self.fs.exists(self._Path(self.root))
        except Exception as exc:
            raise ExportError(
                f"output location {root!r} cannot be used: {_java_message(exc)}. Give --output a directory URI "
                "Spark can write to (file:///..., hdfs://..., s3a://... with the connector on the classpath)"
            ) from None
        if not exists:
            raise ExportError(
                f"output location {root!r} does not exist; create it (or give another --output). "
                "Nothing was exported and no checkpoint moved."
            )

    def _p(self, path: str) -> Any:
        return self._Path(path)

    def ranges(self) -> list[RangeDir]:
        """Range directories in the job's output, by position."""
        if not self.fs.exists(self._p(self.path)):
            return []
        out = []
        for status in self.fs.listStatus(self._p(self.path)):
            name = status.getPath().getName()
            m = _RANGE_RE.match(name)
            if m and status.isDirectory():
                full = f"{self.path}/{name}"
                out.append(RangeDir(int(m[1]), int(m[2]), full, self.fs.exists(self._p(f"{full}/{MARKER}"))))
        return sorted(out, key=lambda r: (r.lo, r.hi))

    def staging(self, lo: int, hi: int) -> str:
        """A fresh staging directory for range ``(lo, hi]`` (Spark creates it)."""
        return f"{self.path}/_staging/{lo:020d}-{hi:020d}-{uuid.uuid4().hex[:12]}"

    def commit(self, staging: str, lo: int, hi: int) -> str:
        """Move a finished staging directory to the range's final name and mark it committed."""
        final = f"{self.path}/{range_name(lo, hi)}"
        if self.fs.exists(self._p(final)):
            raise ExportError(f"cannot commit range ({lo}, {hi}]: {final} already exists")
        self.fs.mkdirs(self._p(self.path))
        if not self.fs.rename(self._p(staging), self._p(final)):
            raise ExportError(f"cannot commit range ({lo}, {hi}]: renaming {staging} to {final} failed")
        self.fs.create(self._p(f"{final}/{MARKER}"), True).close()
        return final

    def remove(self, path: str) -> None:
        """Remove a directory so that it never looks half-deleted: rename it away, then delete it."""
        trash = f"{self.path}/_trash/{uuid.uuid4().hex[:12]}"
        self.fs.mkdirs(self._p(f"{self.path}/_trash"))
        if self.fs.rename(self._p(path), self._p(trash)):
            self.fs.delete(self._p(trash), True)

    def clean(self) -> None:
        """Delete leftovers of interrupted runs (staging and trash)."""
        for sub in ("_staging", "_trash"):
            p = self._p(f"{self.path}/{sub}")
            if self.fs.exists(p):
                self.fs.delete(p, True)


def _java_message(exc: Exception) -> str:
    java = getattr(exc, "java_exception", None)
    text = str(java.toString()) if java is not None else str(exc)
    return " ".join(text.split())[:300]
