"""account_data: the change log (the stream's table), the latest values, and the stream's sequence

Revision ID: account_data_0001
Revises:
Create Date: 2026-11-24
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from factstream import create_stream_sequence, drop_stream_sequence

revision = "account_data_0001"
down_revision = None
branch_labels = ("account_data",)
depends_on = "fs_core_0001"


def upgrade() -> None:
    # One row per change: the stream's facts. Append-only, so a reader that was away receives every
    # change (not only the last one per type), in order.
    op.create_table(
        "account_data_stream",
        sa.Column("stream_id", sa.BigInteger, nullable=False),
        sa.Column("instance_name", sa.Text, nullable=False),
        sa.Column("user_id", sa.Text, nullable=False),
        sa.Column("room_id", sa.Text, nullable=True),
        sa.Column("data_type", sa.Text, nullable=False),
    )
    op.create_index("account_data_stream_id", "account_data_stream", ["stream_id"], unique=True)
    op.create_index("account_data_stream_instance", "account_data_stream", ["instance_name", "stream_id"])
    op.create_index("account_data_stream_user", "account_data_stream", ["user_id", "stream_id"])
    # The latest value per (user, room, type); room_id '' is global account data. ``content`` is the
    # JSON object exactly as the client sent it (text, not jsonb: key order, duplicate keys and the
    # digits of numbers survive).
    op.create_table(
        "account_data_latest",
        sa.Column("user_id", sa.Text, nullable=False),
        sa.Column("room_id", sa.Text, nullable=False),
        sa.Column("data_type", sa.Text, nullable=False),
        sa.Column("stream_id", sa.BigInteger, nullable=False),
        sa.Column("instance_name", sa.Text, nullable=False),
        sa.Column("content", sa.Text, nullable=False),
        sa.PrimaryKeyConstraint("user_id", "room_id", "data_type"),
    )
    create_stream_sequence("account_data_sequence")


def downgrade() -> None:
    drop_stream_sequence("account_data_sequence")
    op.drop_table("account_data_latest")
    op.drop_table("account_data_stream")
