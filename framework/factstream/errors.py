"""The exceptions factstream raises on purpose.

Every error a user or plugin author can cause derives from :class:`FactstreamError`, carries a message
that says what was wrong and where, and is shown by the CLI as a short paragraph (never a traceback)
with exit code 2. Anything else escaping to the CLI is a bug in factstream.
"""

from __future__ import annotations


class FactstreamError(Exception):
    """Base class: a problem the user can fix, described in one paragraph."""

    #: Exit code the CLI uses for this error.
    exit_code: int = 2


class ConfigError(FactstreamError):
    """The configuration file or environment holds a bad value; the message names the key."""


class PluginError(FactstreamError):
    """A plugin registered something invalid, a duplicate, or raised; the message names the plugin(s)."""


class DatabaseError(FactstreamError):
    """The database cannot be reached or is in a state factstream cannot work with."""


class MigrationError(FactstreamError):
    """A migration command cannot proceed (unknown branch, uninstalled plugin revisions, ...)."""
