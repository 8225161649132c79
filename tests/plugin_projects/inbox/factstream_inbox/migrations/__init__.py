"""Alembic revisions of the ``inbox`` branch."""
