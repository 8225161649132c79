"""Exporting streams with Spark: the ``factstream`` data source, export jobs and their checkpoints.

See docs/export.md. Importing this package does not start Spark; pyspark is imported by the modules
that need it (:mod:`factstream.export.datasource`, :mod:`factstream.export.session`).
"""

from factstream.export.plan import ExportError, StreamPlan
from factstream.export.runner import ExportResult, ExportRunner, select_jobs

__all__ = ["ExportError", "ExportResult", "ExportRunner", "StreamPlan", "select_jobs"]
