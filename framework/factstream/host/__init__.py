"""The host process: one factstream instance (database, streams, replication, plugins)."""
