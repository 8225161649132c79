"""factstream: append-only streams of facts in PostgreSQL, replicated between processes.

This module is the public API: what plugins may import. Everything else in the package is private to
the core and may change between releases. The replication commands a plugin may handle
(``UserSyncCommand``, ``ClearUserSyncCommand``, ``FederationAckCommand``: the wire codec's) are imported
at first use, so that ``import factstream`` does not load the codec.
"""

from typing import TYPE_CHECKING, Any

from factstream.caches.cached import cached, cached_specs
from factstream.caches.keys import BadKey
from factstream.caches.lru import LruCache
from factstream.config import HostSettings
from factstream.db.database import Database, Transaction
from factstream.db.metadata import metadata
from factstream.errors import ConfigError, DatabaseError, FactstreamError, MigrationError, PluginError
from factstream.idgen.errors import IdGeneratorError
from factstream.migration_ops import create_stream_sequence, drop_stream_sequence
from factstream.plugin.api import Caches, HostApi, Keeper, KeptStreamWriter, StreamWriter
from factstream.plugin.commands import CommandHandlerSpec, RegisterCommandHandler
from factstream.plugin.hookspecs import hookimpl, hookspec
from factstream.plugin.specs import (
    CURRENT_STATE_CACHE_NAME,
    CacheSpec,
    CommandSpec,
    ExportColumnKind,
    ExportJobSpec,
    ExportSource,
    InvalidationSpec,
    MigrationSpec,
    RequirementSpec,
    RouteSpec,
    SettingsSpec,
)
from factstream.plugin.streams import (
    RegisterRowsHandler,
    RegisterStream,
    RowsHandler,
    RowsHandlerSpec,
    StreamSpec,
    StreamTable,
    SyncRequest,
    Wake,
)
from factstream.plugin.web import (
    HttpError,
    caller_can_write,
    calling_user,
    json_object_text,
    raw_json_response,
    read_body,
    require_writer,
)
from factstream.room_token import MAX_ROOM_TOKEN_LENGTH, MAX_WRITERS, RoomToken, TokenError

if TYPE_CHECKING:
    from factstream.replication.wire import ClearUserSyncCommand, FederationAckCommand, UserSyncCommand

#: The codec's commands the public API offers, imported at first use (``__getattr__``).
_COMMANDS = frozenset({"ClearUserSyncCommand", "FederationAckCommand", "UserSyncCommand"})


def __getattr__(name: str) -> Any:
    if name in _COMMANDS:
        from factstream.replication import wire

        return getattr(wire, name)
    raise AttributeError(f"module 'factstream' has no attribute {name!r}")


__all__ = [
    "CURRENT_STATE_CACHE_NAME",
    "MAX_ROOM_TOKEN_LENGTH",
    "MAX_WRITERS",
    "BadKey",
    "CacheSpec",
    "Caches",
    "ClearUserSyncCommand",
    "CommandHandlerSpec",
    "CommandSpec",
    "ConfigError",
    "Database",
    "DatabaseError",
    "ExportColumnKind",
    "ExportJobSpec",
    "ExportSource",
    "FactstreamError",
    "FederationAckCommand",
    "HostApi",
    "HostSettings",
    "HttpError",
    "IdGeneratorError",
    "InvalidationSpec",
    "Keeper",
    "KeptStreamWriter",
    "LruCache",
    "MigrationError",
    "MigrationSpec",
    "PluginError",
    "RegisterCommandHandler",
    "RegisterRowsHandler",
    "RegisterStream",
    "RequirementSpec",
    "RoomToken",
    "RouteSpec",
    "RowsHandler",
    "RowsHandlerSpec",
    "SettingsSpec",
    "StreamSpec",
    "StreamTable",
    "StreamWriter",
    "SyncRequest",
    "TokenError",
    "Transaction",
    "UserSyncCommand",
    "Wake",
    "cached",
    "cached_specs",
    "caller_can_write",
    "calling_user",
    "create_stream_sequence",
    "drop_stream_sequence",
    "hookimpl",
    "hookspec",
    "json_object_text",
    "metadata",
    "raw_json_response",
    "read_body",
    "require_writer",
]
