"""core: the recorded order of sync-token keys, and export checkpoints

Revision ID: fs_core_0002
Revises: fs_core_0001
Create Date: 2026-11-22
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "fs_core_0002"
down_revision: str | Sequence[str] | None = "fs_core_0001"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # Field order of the sync token: a key keeps its position forever, new keys are appended, so a
    # token minted before a plugin was added (or before a restart) stays valid.
    op.create_table(
        "sync_token_keys",
        sa.Column("position", sa.Integer, primary_key=True),
        sa.Column("sync_key", sa.Text, nullable=False, unique=True),
    )
    # Per export job: facts with stream IDs at or below ``upto`` are in committed output.
    op.create_table(
        "export_checkpoints",
        sa.Column("job", sa.Text, primary_key=True),
        sa.Column("stream_name", sa.Text, nullable=False),
        sa.Column("upto", sa.BigInteger, nullable=False),
        sa.Column("output", sa.Text, nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()),
    )


def downgrade() -> None:
    op.drop_table("export_checkpoints")
    op.drop_table("sync_token_keys")
