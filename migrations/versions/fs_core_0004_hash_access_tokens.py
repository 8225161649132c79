"""core: access tokens stored as SHA-256 hashes

Revision ID: fs_core_0004
Revises: fs_core_0003
Create Date: 2026-11-27
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "fs_core_0004"
down_revision: str | Sequence[str] | None = "fs_core_0003"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # The table keeps only the hex SHA-256 of each token (factstream.tokens.token_hash): a copy of the
    # database no longer hands out working tokens. Existing rows are hashed in place.
    op.add_column("access_tokens", sa.Column("token_hash", sa.Text, nullable=True))
    op.execute("UPDATE access_tokens SET token_hash = encode(sha256(convert_to(token, 'UTF8')), 'hex')")
    op.drop_constraint("access_tokens_pkey", "access_tokens", type_="primary")
    op.drop_column("access_tokens", "token")
    op.alter_column("access_tokens", "token_hash", nullable=False)
    op.create_primary_key("access_tokens_pkey", "access_tokens", ["token_hash"])


def downgrade() -> None:
    # A hash cannot be turned back into its token: the rows keep their hashes under the old column
    # name, so after a downgrade no table token matches any more (each must be issued again).
    op.drop_constraint("access_tokens_pkey", "access_tokens", type_="primary")
    op.alter_column("access_tokens", "token_hash", new_column_name="token")
    op.create_primary_key("access_tokens_pkey", "access_tokens", ["token"])
