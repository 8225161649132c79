"""caches: the cache invalidation stream's table and sequence

Revision ID: caches_0001
Revises:
Create Date: 2026-11-23
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

from factstream import create_stream_sequence, drop_stream_sequence

revision = "caches_0001"
down_revision = None
branch_labels = ("caches",)
depends_on = "fs_core_0001"

TABLE = "cache_invalidation_stream_by_instance"


def upgrade() -> None:
    op.create_table(
        TABLE,
        sa.Column("stream_id", sa.BigInteger, nullable=False),
        sa.Column("instance_name", sa.Text, nullable=False),
        sa.Column("cache_func", sa.Text, nullable=False),
        sa.Column("keys", postgresql.ARRAY(sa.Text), nullable=True),
        sa.Column("invalidation_ts", sa.BigInteger, nullable=False),
    )
    op.create_index("cache_invalidation_stream_by_instance_id", TABLE, ["stream_id"], unique=True)
    # Catch-up reads one writer's rows in stream order.
    op.create_index("cache_invalidation_stream_by_instance_instance", TABLE, ["instance_name", "stream_id"])
    create_stream_sequence("cache_invalidation_stream_seq")


def downgrade() -> None:
    drop_stream_sequence("cache_invalidation_stream_seq")
    op.drop_table(TABLE)
