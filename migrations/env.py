"""The one alembic environment for factstream and all of its plugins.

``factstream.migrate`` builds the alembic ``Config`` programmatically: ``version_locations`` holds the
core's ``versions/`` and each plugin's migrations directory (one branch each, labelled with the plugin
name), and the open connection arrives in ``config.attributes["connection"]`` inside a transaction
holding the migration advisory lock, so a whole ``factstream migrate`` is one transaction.
"""

from __future__ import annotations

from alembic import context
from sqlalchemy import create_engine

from factstream.db.metadata import metadata

config = context.config


def run_migrations() -> None:
    connection = config.attributes.get("connection")
    if connection is None:  # plain `alembic` use with sqlalchemy.url set
        engine = create_engine(config.get_main_option("sqlalchemy.url") or "")
        with engine.begin() as conn:
            context.configure(connection=conn, target_metadata=metadata)
            with context.begin_transaction():
                context.run_migrations()
        return
    context.configure(connection=connection, target_metadata=metadata)
    with context.begin_transaction():
        context.run_migrations()


if context.is_offline_mode():
    raise SystemExit("factstream migrations run online only: use `factstream migrate`")
run_migrations()
