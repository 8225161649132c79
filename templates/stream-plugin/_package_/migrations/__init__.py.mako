"""Alembic revisions of the ``${name}`` branch: ``factstream migrate new --plugin ${name} -m MSG`` adds one."""
