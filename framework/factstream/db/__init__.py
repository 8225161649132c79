"""Database access: the async engine, the embedded PostgreSQL default and the shared MetaData."""

from factstream.db.engine import create_engine, database_url, sync_url, wait_for_database
from factstream.db.metadata import metadata

__all__ = ["create_engine", "database_url", "metadata", "sync_url", "wait_for_database"]
