"""The bundled ``receipts`` stream plugin: read receipts per room, user, receipt type and thread.

* Stream ``receipts`` (row: the reference's ``ReceiptsStreamRow``, ``[room_id, receipt_type, user_id,
  event_id, thread_id, data]``), written by the configured writers (``stream_writers.receipts``;
  several are allowed), synced under the token key ``receipt_key`` into the ``rooms`` section of
  ``/sync`` (``rooms.join.<room>.ephemeral.events``, merged with the events plugin's rooms). A public
  receipt wakes the room's members, a private one (``m.read.private``) its owner only.
* Table ``receipts_linearized`` (one current row per room, receipt type, user and thread) in the
  migration branch ``receipts``; the cache ``receipts_room`` (a room's current receipts).
* Route ``POST /rooms/{room_id}/receipt/{receipt_type}/{event_id}``.
* Needs the ``events`` plugin: who is joined where (``factstream_events.Memberships``) and the events
  a receipt points at.

See docs/plugins/receipts.md.
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
    RequirementSpec,
    RouteSpec,
    StreamSpec,
    cached_specs,
)
from factstream_receipts.export import RECEIPTS_DAILY
from factstream_receipts.routes import ROUTES
from factstream_receipts.rows import (
    ROOM_RECEIPTS_INVALIDATION,
    SEQUENCE,
    STREAM,
    SYNC_KEY,
    TABLES,
    ReceiptsRow,
    wake,
)
from factstream_receipts.store import ReceiptsStore
from factstream_receipts.sync import sync_receipts

__all__ = ["RECEIPTS_STREAM", "ReceiptsRow", "ReceiptsStore"]

RECEIPTS_STREAM = StreamSpec(
    name=STREAM,
    row_type=ReceiptsRow,
    tables=TABLES,
    sequence=SEQUENCE,
    writers="configured",
    sync_key=SYNC_KEY,
    sync_section="rooms",
    sync_rows=sync_receipts,
    wake=wake,
    description="read receipts: one current fact per room, receipt type, user and thread",
)


@factstream.hookimpl
def register_requirements(register: Callable[[RequirementSpec], None]) -> None:
    register(RequirementSpec("events", "receipts go to a room's joined members and point at its events"))


@factstream.hookimpl
def register_streams(register: RegisterStream) -> None:
    register(RECEIPTS_STREAM)


@factstream.hookimpl
def register_migrations(register: Callable[[MigrationSpec], None]) -> None:
    register(MigrationSpec.from_package("factstream_receipts.migrations"))


@factstream.hookimpl
def register_caches(register: Callable[[CacheSpec], None]) -> None:
    for spec in cached_specs(ReceiptsStore):
        register(spec)


@factstream.hookimpl
def register_invalidations(register: Callable[[InvalidationSpec], None]) -> None:
    register(ROOM_RECEIPTS_INVALIDATION)


@factstream.hookimpl
def register_routes(register: Callable[[RouteSpec], None]) -> None:
    for route in ROUTES:
        register(route)


@factstream.hookimpl
def register_export_jobs(register: Callable[[ExportJobSpec], None]) -> None:
    register(RECEIPTS_DAILY)
