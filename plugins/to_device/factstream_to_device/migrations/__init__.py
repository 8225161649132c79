"""Alembic revisions of the ``to_device`` branch."""
