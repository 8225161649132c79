"""Alembic revisions of the ``account_data`` branch."""
