"""create the ${name} table

Revision ID: ${revision}
Revises:
Create Date: ${create_date}
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from factstream import create_stream_sequence, drop_stream_sequence

revision: str = "${revision}"
down_revision: str | Sequence[str] | None = None
branch_labels: str | Sequence[str] | None = ("${name}",)
depends_on: str | Sequence[str] | None = "${core_head}"


def upgrade() -> None:
    op.create_table(
        "${name}",
        sa.Column("stream_id", sa.BigInteger, nullable=False, unique=True),
        sa.Column("instance_name", sa.Text, nullable=False),
        sa.Column("user_id", sa.Text, nullable=False),
        sa.Column("key", sa.Text, nullable=False),
        sa.Column("value", sa.Text, nullable=False),
    )
    op.create_index("${name}_key", "${name}", ["key"])  # counting a key's facts
% if sync:
    op.create_index("${name}_user", "${name}", ["user_id", "stream_id"])  # /sync: a user's facts in a range
% endif
    create_stream_sequence("${name}_seq")  # CREATE SEQUENCE, then one nextval: the first fact gets ID 2


def downgrade() -> None:
    drop_stream_sequence("${name}_seq")
    op.drop_table("${name}")
