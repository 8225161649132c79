"""The one SQLAlchemy ``MetaData`` that the core and every plugin add their tables to.

Tables are declared here (and in plugins) for SQLAlchemy Core queries; they are *created* only by
alembic revisions, never by ``metadata.create_all``, so that a deployment's schema is always what its
migration history says.
"""

from __future__ import annotations

from sqlalchemy import (
    BigInteger,
    Boolean,
    Column,
    DateTime,
    Float,
    Identity,
    Index,
    Integer,
    MetaData,
    Table,
    Text,
    false,
    func,
    text,
)

metadata = MetaData()
"""The SQLAlchemy ``MetaData`` every table of the core and of the plugins is declared on (a plugin's
``Table(name, factstream.metadata, ...)``), which migrations and queries use."""

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

#: The order of the fields of a sync token: ``position`` is fixed once a key is recorded; new keys are
#: appended, so tokens stay valid across restarts and when a plugin is added.
sync_token_keys = Table(
    "sync_token_keys",
    metadata,
    Column("position", Integer, primary_key=True),
    Column("sync_key", Text, nullable=False, unique=True),
)

#: Per export job: the stream ID up to which (inclusive) facts are in committed output.
export_checkpoints = Table(
    "export_checkpoints",
    metadata,
    Column("job", Text, primary_key=True),
    Column("stream_name", Text, nullable=False),
    Column("upto", BigInteger, nullable=False),
    Column("output", Text, nullable=False),
    Column("updated_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
)

#: One row per export run (``factstream.export.runs``); ``runs`` and ``rows_total`` are the job's
#: counts up to and including the run (by outcome for ``runs``), so the newest rows give the counters.
export_runs = Table(
    "export_runs",
    metadata,
    Column("id", BigInteger, Identity(), primary_key=True),
    Column("job", Text, nullable=False),
    Column("stream_name", Text, nullable=False),
    Column("outcome", Text, nullable=False),
    Column("rows", BigInteger, nullable=False),
    Column("duration_seconds", Float, nullable=False),
    Column("upto", BigInteger, nullable=True),
    Column("error", Text, nullable=True),
    Column("runs", BigInteger, nullable=False),
    Column("rows_total", BigInteger, nullable=False),
    Column("finished_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    Index("export_runs_job_outcome_id", "job", "outcome", text("id DESC")),
)

#: Bearer tokens of the HTTP API (besides those configured under ``http.tokens``): a request whose
#: token's hex SHA-256 is ``token_hash`` acts as ``user_id`` and may call write routes when
#: ``can_write``. The token itself is never stored (see :mod:`factstream.tokens`).
access_tokens = Table(
    "access_tokens",
    metadata,
    Column("token_hash", Text, primary_key=True),
    Column("user_id", Text, nullable=False),
    Column("can_write", Boolean, nullable=False, server_default=false()),
    Column("created_at", DateTime(timezone=True), nullable=False, server_default=func.now()),
    Index("access_tokens_user_idx", "user_id"),
)
