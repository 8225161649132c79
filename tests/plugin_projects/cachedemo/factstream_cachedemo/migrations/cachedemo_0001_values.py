"""cachedemo: the values table the demo store reads through its caches

Revision ID: cachedemo_0001
Revises:
Create Date: 2026-11-23
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "cachedemo_0001"
down_revision = None
branch_labels = ("cachedemo",)
depends_on = "fs_core_0001"


def upgrade() -> None:
    op.create_table(
        "cachedemo_values",
        sa.Column("key", sa.Text, primary_key=True),
        sa.Column("value", sa.Text, nullable=False),
    )


def downgrade() -> None:
    op.drop_table("cachedemo_values")
