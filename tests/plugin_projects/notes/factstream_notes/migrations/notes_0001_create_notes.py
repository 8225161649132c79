"""notes: the notes table and its stream sequence

Revision ID: notes_0001
Revises:
Create Date: 2026-11-22
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from factstream import create_stream_sequence, drop_stream_sequence

revision = "notes_0001"
down_revision = None
branch_labels = ("notes",)
depends_on = "fs_core_0001"


def upgrade() -> None:
    op.create_table(
        "notes",
        sa.Column("stream_id", sa.BigInteger, nullable=False, unique=True),
        sa.Column("instance_name", sa.Text, nullable=False),
        sa.Column("author", sa.Text, nullable=False),
        sa.Column("body", sa.Text, nullable=False),
    )
    create_stream_sequence("notes_seq")


def downgrade() -> None:
    drop_stream_sequence("notes_seq")
    op.drop_table("notes")
