"""core: export runs, recorded by the runner for every host's /metrics

Revision ID: fs_core_0005
Revises: fs_core_0004
Create Date: 2026-11-27
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "fs_core_0005"
down_revision: str | Sequence[str] | None = "fs_core_0004"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    # One row per export run (factstream.export.runs). ``runs`` counts the job's runs of this outcome
    # and ``rows_total`` the job's rows, both up to and including this run, so that the newest rows
    # alone give every counter and older rows may be pruned.
    op.create_table(
        "export_runs",
        sa.Column("id", sa.BigInteger, sa.Identity(), primary_key=True),
        sa.Column("job", sa.Text, nullable=False),
        sa.Column("stream_name", sa.Text, nullable=False),
        sa.Column("outcome", sa.Text, nullable=False),
        sa.Column("rows", sa.BigInteger, nullable=False),
        sa.Column("duration_seconds", sa.Float, nullable=False),
        sa.Column("upto", sa.BigInteger, nullable=True),
        sa.Column("error", sa.Text, nullable=True),
        sa.Column("runs", sa.BigInteger, nullable=False),
        sa.Column("rows_total", sa.BigInteger, nullable=False),
        sa.Column("finished_at", sa.DateTime(timezone=True), nullable=False, server_default=sa.func.now()),
    )
    op.create_index("export_runs_job_outcome_id", "export_runs", ["job", "outcome", sa.text("id DESC")])


def downgrade() -> None:
    op.drop_table("export_runs")
