"""create the presence_stream table: each user's latest presence, one row each

Revision ID: presence_0001
Revises:
Create Date: 2026-12-03 19:59:01
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

from factstream import create_stream_sequence, drop_stream_sequence

revision: str = "presence_0001"
down_revision: str | Sequence[str] | None = None
branch_labels: str | Sequence[str] | None = ("presence",)
depends_on: str | Sequence[str] | None = "fs_core_0005"


def upgrade() -> None:
    op.create_table(
        "presence_stream",
        sa.Column("stream_id", sa.BigInteger, nullable=False, unique=True),
        sa.Column("instance_name", sa.Text, nullable=False),
        sa.Column("user_id", sa.Text, nullable=False, unique=True),  # the latest row of each user only
        sa.Column("state", sa.Text, nullable=False),
        sa.Column("last_active_ts", sa.BigInteger, nullable=False),
        sa.Column("last_federation_update_ts", sa.BigInteger, nullable=False),
        sa.Column("last_user_sync_ts", sa.BigInteger, nullable=False),
        sa.Column("status_msg", sa.Text, nullable=True),
        sa.Column("currently_active", sa.Boolean, nullable=False),
    )
    op.create_index("presence_stream_position", "presence_stream", ["instance_name", "stream_id"])
    create_stream_sequence("presence_stream_sequence")  # CREATE SEQUENCE, then one nextval: the first row gets ID 2


def downgrade() -> None:
    drop_stream_sequence("presence_stream_sequence")
    op.drop_table("presence_stream")
