"""factstream: append-only streams of facts in PostgreSQL, replicated between processes.

This module is the public API: what plugins may import. Everything else in the package is private to
the core and may change between releases.
"""

from factstream.db.database import Database, Transaction
from factstream.db.metadata import metadata
from factstream.errors import ConfigError, DatabaseError, FactstreamError, MigrationError, PluginError
from factstream.idgen.generator import IdGeneratorError, MultiWriterIdGenerator
from factstream.idgen.leases import WriterLeases
from factstream.migration_ops import create_stream_sequence, drop_stream_sequence
from factstream.plugins import hookimpl
from factstream.specs import CacheSpec, CommandSpec, ExportJobSpec, InvalidationSpec, MigrationSpec, RouteSpec
from factstream.streams import StreamSpec, StreamTable

__all__ = [
    "CacheSpec",
    "CommandSpec",
    "ConfigError",
    "Database",
    "DatabaseError",
    "ExportJobSpec",
    "FactstreamError",
    "IdGeneratorError",
    "InvalidationSpec",
    "MigrationError",
    "MigrationSpec",
    "MultiWriterIdGenerator",
    "PluginError",
    "RouteSpec",
    "StreamSpec",
    "StreamTable",
    "Transaction",
    "WriterLeases",
    "create_stream_sequence",
    "drop_stream_sequence",
    "hookimpl",
    "metadata",
]
