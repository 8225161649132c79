"""The bundled ``account_data`` stream plugin: global and per-room account data per user.

* Stream ``account_data`` (row ``[user_id, room_id, data_type]``, the reference's wire row), written
  by the configured writers (``stream_writers.account_data``; several are allowed), synced under the
  token key ``account_data_key``: a user's ``/sync`` returns the types that changed, with their latest
  content (``factstream_account_data.sync``).
* Tables ``account_data_stream`` (the change log) and ``account_data_latest`` (the latest value per
  user, room and type, JSON text kept byte for byte), in the migration branch ``account_data``.
* Cache ``account_data_latest``, invalidated on every instance by the stream's rows (replicated, and
  this process's own once their transaction ends).
* Routes ``PUT``/``GET /user/{user_id}/account_data/{type}`` and
  ``/user/{user_id}/rooms/{room_id}/account_data/{type}`` (``factstream_account_data.routes``).
* Export job ``account_data_latest``.
* Settings ``plugins.account_data`` (``max_body_bytes``; ``factstream_account_data.settings``).

See docs/plugins/account_data.md.
"""

from __future__ import annotations

from collections.abc import Callable

import factstream
from factstream import (
    CacheSpec,
    ExportJobSpec,
    InvalidationSpec,
    MigrationSpec,
    RegisterStream,
    RouteSpec,
    SettingsSpec,
    StreamSpec,
    cached_specs,
)
from factstream_account_data.export import ACCOUNT_DATA_LATEST
from factstream_account_data.routes import ROUTES
from factstream_account_data.rows import (
    CACHE,
    SEQUENCE,
    STREAM,
    SYNC_KEY,
    TABLES,
    AccountDataRow,
    cache_keys,
)
from factstream_account_data.settings import AccountDataSettings
from factstream_account_data.store import AccountDataStore
from factstream_account_data.sync import sync_account_data

__all__ = ["ACCOUNT_DATA_STREAM", "AccountDataRow", "AccountDataSettings", "AccountDataStore"]

ACCOUNT_DATA_STREAM = StreamSpec(
    name=STREAM,
    row_type=AccountDataRow,
    tables=TABLES,
    sequence=SEQUENCE,
    writers="configured",
    sync_key=SYNC_KEY,
    user_field="user_id",
    sync_rows=sync_account_data,
    description="global and per-room account data per user: one fact per change",
)


@factstream.hookimpl
def register_streams(register: RegisterStream) -> None:
    register(ACCOUNT_DATA_STREAM)


@factstream.hookimpl
def register_caches(register: Callable[[CacheSpec], None]) -> None:
    for spec in cached_specs(AccountDataStore):
        register(spec)


@factstream.hookimpl
def register_invalidations(register: Callable[[InvalidationSpec], None]) -> None:
    register(InvalidationSpec(stream=STREAM, cache=CACHE, keys=cache_keys))


@factstream.hookimpl
def register_migrations(register: Callable[[MigrationSpec], None]) -> None:
    register(MigrationSpec.from_package("factstream_account_data.migrations"))


@factstream.hookimpl
def register_routes(register: Callable[[RouteSpec], None]) -> None:
    for route in ROUTES:
        register(route)


@factstream.hookimpl
def register_export_jobs(register: Callable[[ExportJobSpec], None]) -> None:
    register(ACCOUNT_DATA_LATEST)


@factstream.hookimpl
def register_settings(register: Callable[[SettingsSpec], None]) -> None:
    register(SettingsSpec(model=AccountDataSettings))
