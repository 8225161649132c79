"""create the likes table

Revision ID: 6df8afc1f6e5
Revises:
Create Date: 2026-11-24 11:49:34.059716
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from factstream import create_stream_sequence, drop_stream_sequence

revision: str = "6df8afc1f6e5"
down_revision: str | Sequence[str] | None = None
branch_labels: str | Sequence[str] | None = ("likes",)
depends_on: str | Sequence[str] | None = "fs_core_0003"


def upgrade() -> None:
    op.create_table(
        "likes",
        sa.Column("stream_id", sa.BigInteger, nullable=False, unique=True),
        sa.Column("instance_name", sa.Text, nullable=False),
        sa.Column("user_id", sa.Text, nullable=False),
        sa.Column("target", sa.Text, nullable=False),
    )
    op.create_index("likes_target", "likes", ["target"])  # counting a target's likes
    op.create_index("likes_user", "likes", ["user_id", "stream_id"])  # /sync: a user's likes in a range
    create_stream_sequence("likes_seq")  # CREATE SEQUENCE, then one nextval: the first like gets ID 2


def downgrade() -> None:
    drop_stream_sequence("likes_seq")
    op.drop_table("likes")
