"""Alembic revisions of the ``receipts`` branch."""
