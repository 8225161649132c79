"""inbox: the inbox table and its stream sequence

Revision ID: inbox_0001
Revises:
Create Date: 2026-11-23
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from factstream import create_stream_sequence, drop_stream_sequence

revision = "inbox_0001"
down_revision = None
branch_labels = ("inbox",)
depends_on = "fs_core_0001"


def upgrade() -> None:
    op.create_table(
        "inbox",
        sa.Column("stream_id", sa.BigInteger, nullable=False, unique=True),
        sa.Column("instance_name", sa.Text, nullable=False),
        sa.Column("user_id", sa.Text, nullable=False),
        sa.Column("body", sa.Text, nullable=False),
    )
    op.create_index("inbox_user_idx", "inbox", ["user_id", "stream_id"])
    create_stream_sequence("inbox_seq")


def downgrade() -> None:
    drop_stream_sequence("inbox_seq")
    op.drop_table("inbox")
