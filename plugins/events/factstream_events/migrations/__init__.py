"""The alembic branch ``events``: the events plugin's tables and sequences."""
