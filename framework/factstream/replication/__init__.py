"""Replication between factstream processes: Synapse's line protocol over TCP or Redis pub/sub.

:mod:`factstream.replication.commands` holds the commands and their wire codec; transports and the
command handler build on it.
"""

from factstream.replication import commands
from factstream.replication.commands import *  # noqa: F403 - the codec is the package's public face

__all__ = list(commands.__all__)
