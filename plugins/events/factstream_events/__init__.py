"""The bundled ``events`` stream plugin: room events (see docs/plugins/events.md).

Built on factstream's public API only, exactly as a third-party plugin would be:

* streams ``events`` (positive IDs; rows ``ev``, ``state``, ``state-all``, the reference's wire rows;
  several rows per ID) and ``backfill`` (a backwards stream: backfilled events, never "new");
* tables in the migration branch ``events`` (``factstream_events.migrations``);
* the Python API ``host.state(EventsStore)`` (``factstream_events.store``) and its reads
  (``factstream_events.read.reads``); for other plugins, who is joined where:
  ``host.state(Memberships)`` (``factstream_events.read.members``); HTTP routes (``factstream_events.routes``);
* caches: the change caches of ``Timeline`` and the caches of immutable facts
  (``factstream_events.shared.caches``), all registered, so all in ``host.caches`` and on ``/metrics``;
* hooks for other plugins, ``resolve_state`` and ``check_local_event`` (``factstream_events.hookspecs``),
  with this plugin's defaults registered last;
* settings ``plugins.events`` (``factstream_events.shared.settings``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import factstream
from factstream import (
    CacheSpec,
    ExportJobSpec,
    HostApi,
    InvalidationSpec,
    MigrationSpec,
    RegisterRowsHandler,
    RegisterStream,
    RouteSpec,
    RowsHandlerSpec,
    SettingsSpec,
    StreamSpec,
    SyncRequest,
    cached_specs,
)
from factstream_events import hookspecs, invalidations
from factstream_events.export import EXPORT_JOBS
from factstream_events.invalidations import RoomState
from factstream_events.members import Memberships
from factstream_events.read.timeline import Timeline
from factstream_events.read.wake import wake
from factstream_events.routes import ROUTES
from factstream_events.rules.policy import RoomFacts, check
from factstream_events.rules.statemath import State, default_resolve
from factstream_events.shared.caches import IMMUTABLE_CACHES
from factstream_events.shared.rows import (
    BACKFILL_SEQUENCE,
    BACKFILL_STREAM,
    BACKFILL_TABLES,
    EVENTS_SEQUENCE,
    EVENTS_TABLES,
    STREAM,
    BackfillRow,
    EventsRow,
)
from factstream_events.shared.settings import EventsSettings
from factstream_events.shared.sharding import check_backfill_writers
from factstream_events.store import EventsStore
from factstream_events.updates import events_updates
from factstream_events.write import censor

#: The field of the sync token that follows the events stream (a room token: ``s<pos>``).
SYNC_KEY = "room_key"


async def sync_rooms(request: SyncRequest) -> dict[str, Any]:
    """The ``rooms`` section of ``/sync`` (``factstream_events.read.sync``)."""
    return await request.host.state(EventsStore).sync(request)


__all__ = ["BACKFILL_STREAM_SPEC", "EVENTS_STREAM_SPEC", "EventsSettings", "EventsStore", "Memberships"]

EVENTS_STREAM_SPEC = StreamSpec(
    name=STREAM,
    row_type=EventsRow,
    tables=EVENTS_TABLES,
    sequence=EVENTS_SEQUENCE,
    writers="configured",
    update_function=events_updates,
    description="room events: one ev row per persisted event, state rows per current-state change",
    sync_key=SYNC_KEY,
    room_tokens=True,
    sync_section="rooms",
    wake=wake,
    sync_rows=sync_rooms,
)
BACKFILL_STREAM_SPEC = StreamSpec(
    name=BACKFILL_STREAM,
    row_type=BackfillRow,
    tables=BACKFILL_TABLES,
    sequence=BACKFILL_SEQUENCE,
    positive=False,
    writers="configured",
    description="backfilled room events (older history fetched later), at negative stream orderings",
)


@factstream.hookimpl
def register_streams(register: RegisterStream) -> None:
    register(EVENTS_STREAM_SPEC)
    register(BACKFILL_STREAM_SPEC)


@factstream.hookimpl
def register_caches(register: Callable[[CacheSpec], None]) -> None:
    for spec in (*cached_specs(Timeline, RoomState, Memberships), *IMMUTABLE_CACHES):
        register(spec)


@factstream.hookimpl
def register_invalidations(register: Callable[[InvalidationSpec], None]) -> None:
    for spec in invalidations.specs():
        register(spec)


@factstream.hookimpl
async def startup(host: HostApi) -> None:
    """Refuse a configuration whose ``backfill`` writers are not the ``events`` writers
    (``factstream_events.shared.sharding``); make this process's events store (its change caches start at
    the stream's position now), teach the change caches the latest changes from the database, and
    start the censor job where it runs (``factstream_events.write.censor``)."""
    check_backfill_writers(host)
    await host.state(EventsStore).timeline.prefill()
    censor.start(host)


@factstream.hookimpl
def register_rows_handlers(register: RegisterRowsHandler) -> None:
    """The events stream's rows invalidate and feed the change caches (``factstream_events.invalidations``;
    the backfill stream's never do)."""
    register(RowsHandlerSpec(stream=EVENTS_STREAM_SPEC, handler=invalidations.on_rows))


@factstream.hookimpl
def register_migrations(register: Callable[[MigrationSpec], None]) -> None:
    register(MigrationSpec.from_package("factstream_events.migrations"))


@factstream.hookimpl
def register_routes(register: Callable[[RouteSpec], None]) -> None:
    for route in ROUTES:
        register(route)


@factstream.hookimpl
def register_settings(register: Callable[[SettingsSpec], None]) -> None:
    register(SettingsSpec(model=EventsSettings))


@factstream.hookimpl
def register_hookspecs(register: Callable[[object], None]) -> None:
    register(hookspecs)


@factstream.hookimpl(trylast=True)
def resolve_state(room_id: str, room_version: str, states: Sequence[State]) -> State:
    """The default resolver (``factstream_events.rules.statemath.default_resolve``)."""
    return default_resolve(states)


@factstream.hookimpl(trylast=True)
def check_local_event(event: Mapping[str, object], facts: RoomFacts) -> bool | str:
    """The default local policy (``factstream_events.rules.policy``)."""
    return check(event, facts) or True


@factstream.hookimpl
def register_export_jobs(register: Callable[[ExportJobSpec], None]) -> None:
    """The Spark export jobs (``factstream_events.export``, docs/plugins/events.md "Export jobs")."""
    for job in EXPORT_JOBS:
        register(job)
