"""receipts: the receipts_linearized table (the stream's facts) and its sequence

Revision ID: receipts_0001
Revises:
Create Date: 2026-12-03
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

from factstream import create_stream_sequence, drop_stream_sequence

revision = "receipts_0001"
down_revision = None
branch_labels = ("receipts",)
depends_on = "fs_core_0005"


def upgrade() -> None:
    # One current row per (room, receipt type, user, thread): a newer receipt deletes the older row
    # and appends its own, so the table holds each receipt's latest fact only. ``event_stream_ordering``
    # is the events stream ID of the receipt's event (a receipt never moves back to an older one).
    op.create_table(
        "receipts_linearized",
        sa.Column("stream_id", sa.BigInteger, nullable=False),
        sa.Column("instance_name", sa.Text, nullable=False),
        sa.Column("room_id", sa.Text, nullable=False),
        sa.Column("receipt_type", sa.Text, nullable=False),
        sa.Column("user_id", sa.Text, nullable=False),
        sa.Column("event_id", sa.Text, nullable=False),
        sa.Column("thread_id", sa.Text),
        sa.Column("data", postgresql.JSONB, nullable=False),
        sa.Column("event_stream_ordering", sa.BigInteger, nullable=False),
    )
    op.create_index("receipts_linearized_stream_id", "receipts_linearized", ["stream_id"], unique=True)
    op.create_index("receipts_linearized_instance", "receipts_linearized", ["instance_name", "stream_id"])
    op.create_index("receipts_linearized_room", "receipts_linearized", ["room_id", "stream_id"])
    # the one current receipt of a key; '' stands for "no thread", which no thread ID can be
    op.create_index(
        "receipts_linearized_key",
        "receipts_linearized",
        ["room_id", "receipt_type", "user_id", sa.text("COALESCE(thread_id, '')")],
        unique=True,
    )
    create_stream_sequence("receipts_sequence")


def downgrade() -> None:
    drop_stream_sequence("receipts_sequence")
    op.drop_table("receipts_linearized")
