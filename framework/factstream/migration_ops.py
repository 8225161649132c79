"""Helpers for plugins' alembic revisions (re-exported by ``factstream``)."""

from __future__ import annotations

from factstream.idgen.sequence import create_sequence_sql
from factstream.names import check_name


def create_stream_sequence(name: str) -> None:
    """Inside a revision's ``upgrade()``: create a stream's sequence so that its first ID is 2.

    The sequence is created and then advanced once with ``SELECT nextval`` (never ``START WITH 2``,
    which makes ``last_value`` read 2 before 2 has been handed out).
    """
    from alembic import op

    for statement in create_sequence_sql(name):
        op.execute(statement)


def drop_stream_sequence(name: str) -> None:
    """Inside a revision's ``downgrade()``: drop a stream's sequence."""
    from alembic import op

    op.execute(f"DROP SEQUENCE {check_name('sequence', name)}")
