"""core: stream_positions, instance_map and the migration branch table

Revision ID: fs_core_0001
Revises:
Create Date: 2026-11-22
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "fs_core_0001"
down_revision: str | Sequence[str] | None = None
branch_labels: str | Sequence[str] | None = ("factstream",)
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "stream_positions",
        sa.Column("stream_name", sa.Text, nullable=False),
        sa.Column("instance_name", sa.Text, nullable=False),
        sa.Column("stream_id", sa.BigInteger, nullable=False),
    )
    op.create_index("stream_positions_idx", "stream_positions", ["stream_name", "instance_name"], unique=True)
    op.create_table(
        "instance_map",
        sa.Column("instance_id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("instance_name", sa.Text, nullable=False, unique=True),
    )
    op.create_table(
        "factstream_migration_branches",
        sa.Column("branch", sa.Text, primary_key=True),
        sa.Column("revision", sa.Text, nullable=False),
    )


def downgrade() -> None:
    op.drop_table("factstream_migration_branches")
    op.drop_table("instance_map")
    op.drop_index("stream_positions_idx", table_name="stream_positions")
    op.drop_table("stream_positions")
