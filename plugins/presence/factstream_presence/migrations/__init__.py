"""Alembic revisions of the ``presence`` branch: ``factstream migrate new --plugin presence -m MSG`` adds one."""
