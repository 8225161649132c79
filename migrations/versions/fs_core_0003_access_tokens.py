"""core: bearer tokens for the HTTP API

Revision ID: fs_core_0003
Revises: fs_core_0002
Create Date: 2026-11-23
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "fs_core_0003"
down_revision: str | Sequence[str] | None = "fs_core_0002"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Bearer tokens of the HTTP API besides those in the configuration: a request carrying
    # ``token`` acts as ``user_id``; ``can_write`` lets it call write routes.
    op.create_table(
        "access_tokens",
        sa.Column("token", sa.Text, primary_key=True),
        sa.Column("user_id", sa.Text, nullable=False),
        sa.Column("can_write", sa.Boolean, nullable=False, server_default=sa.false()),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()),
    )
    op.create_index("access_tokens_user_idx", "access_tokens", ["user_id"])


def downgrade() -> None:
    op.drop_index("access_tokens_user_idx", table_name="access_tokens")
    op.drop_table("access_tokens")
