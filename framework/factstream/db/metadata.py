"""The one SQLAlchemy ``MetaData`` that the core and every plugin add their tables to.

Tables are declared here (and in plugins) for SQLAlchemy Core queries; they are *created* only by
alembic revisions, never by ``metadata.create_all``, so that a deployment's schema is always what its
migration history says.
"""

from __future__ import annotations

from sqlalchemy import BigInteger, Column, Index, Integer, MetaData, Table, Text

metadata = MetaData()

#: Per stream, per writer: the last position the writer persisted (read at start-up only).
stream_positions = Table(
    "stream_positions",
    metadata,
    Column("stream_name", Text, nullable=False),
    Column("instance_name", Text, nullable=False),
    Column("stream_id", BigInteger, nullable=False),
    Index("stream_positions_idx", "stream_name", "instance_name", unique=True),
)

#: Small integer IDs for instance names, used in multi-writer sync tokens (``m5~1.6``).
instance_map = Table(
    "instance_map",
    metadata,
    Column("instance_id", Integer, primary_key=True, autoincrement=True),
    Column("instance_name", Text, nullable=False, unique=True),
)

#: Which revision each migration branch (the core and every plugin) is at, by plugin name. Alembic's
#: own version table may drop a branch's head when another branch depends on it, and it cannot tell
#: which plugin an unknown revision belonged to; this table can.
migration_branches = Table(
    "factstream_migration_branches",
    metadata,
    Column("branch", Text, primary_key=True),
    Column("revision", Text, nullable=False),
)
