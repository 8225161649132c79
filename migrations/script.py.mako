<%!
def q(value):
    """Python literal with double quotes, as ruff format writes it."""
    if value is None:
        return "None"
    if isinstance(value, str):
        return '"%s"' % value
    return "(" + ", ".join('"%s"' % v for v in value) + ("," if len(value) == 1 else "") + ")"


def revises(value):
    """The docstring's Revises line after the colon: nothing for a branch's first revision."""
    if not value:
        return ""
    return " " + (value if isinstance(value, str) else ", ".join(value))
%>"""${message}

Revision ID: ${up_revision}
Revises:${revises(down_revision)}
Create Date: ${create_date}
"""

from __future__ import annotations

from collections.abc import Sequence

import sqlalchemy as sa  # noqa: F401
from alembic import op  # noqa: F401
${imports if imports else ""}
revision: str = ${q(up_revision)}
down_revision: str | Sequence[str] | None = ${q(down_revision)}
branch_labels: str | Sequence[str] | None = ${q(branch_labels)}
depends_on: str | Sequence[str] | None = ${q(depends_on)}


def upgrade() -> None:
    ${upgrades if upgrades else "pass"}


def downgrade() -> None:
    ${downgrades if downgrades else "pass"}
