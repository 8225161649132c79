"""Replication between factstream processes: Synapse's line protocol over TCP or Redis pub/sub.

:mod:`factstream.replication.wire` is the codec (the commands and their lines); the transports
(:mod:`.tcp`, :mod:`.redis`) and the reader (:mod:`.handler`) build on it.
"""
