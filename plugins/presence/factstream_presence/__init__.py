"""The bundled ``presence`` stream plugin: online, unavailable or offline per user, fed by every process.

* Stream ``presence`` (the reference's ``PresenceStreamRow``), written by its one writer
  (``stream_writers.presence``, ``main`` by default) from what every process serving ``/sync`` reports
  with ``USER_SYNC`` / ``CLEAR_USER_SYNC`` (``factstream_presence.reporter``), turned into states with
  the reference's timeouts (``factstream_presence.writer``). Table ``presence_stream`` (each user's
  latest row) in the migration branch ``presence``; export job ``presence_all``.
* ``/sync``: a top-level ``presence`` section with the users who share a room with the reader
  (``factstream_presence.sync``); a change wakes exactly them.
* Routes ``PUT`` and ``GET /presence/{user_id}/status``.
* Needs the ``events`` plugin: who shares a room with whom.
* Settings ``plugins.presence`` (the timeouts).

See docs/plugins/presence.md.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

import factstream
from factstream import (
    CacheSpec,
    ClearUserSyncCommand,
    CommandHandlerSpec,
    ConfigError,
    ExportJobSpec,
    HostApi,
    InvalidationSpec,
    MigrationSpec,
    RegisterCommandHandler,
    RegisterStream,
    RequirementSpec,
    RouteSpec,
    SettingsSpec,
    StreamSpec,
    UserSyncCommand,
    cached_specs,
)
from factstream_presence.reporter import PresenceReporter
from factstream_presence.routes import ROUTES
from factstream_presence.rows import SEQUENCE, STREAM, SYNC_KEY, TABLES, USER_CACHE, PresenceRow
from factstream_presence.settings import PresenceSettings
from factstream_presence.store import PresenceStore
from factstream_presence.sync import sync_presence, wake
from factstream_presence.writer import PresenceWriter

__all__ = ["PRESENCE_STREAM", "PresenceRow", "PresenceSettings", "PresenceStore", "PresenceWriter"]

PRESENCE_STREAM = StreamSpec(
    name=STREAM,
    row_type=PresenceRow,
    tables=TABLES,
    sequence=SEQUENCE,
    writers="configured",
    sync_key=SYNC_KEY,
    sync_section="presence",
    sync_rows=sync_presence,
    wake=wake,
    description="presence: online, unavailable or offline per user, fed by every process serving /sync",
)


async def on_user_sync(host: HostApi, sender: str, command: UserSyncCommand) -> None:
    await host.state(PresenceWriter).user_sync(command.instance_id, command.user_id, command.is_syncing)


async def on_clear(host: HostApi, sender: str, command: ClearUserSyncCommand) -> None:
    await host.state(PresenceWriter).clear(command.instance_id)


async def forget(host: HostApi, instance: str) -> None:
    await host.state(PresenceWriter).clear(instance)


def resend(host: HostApi) -> Iterable[UserSyncCommand]:
    return host.state(PresenceReporter).again()


@factstream.hookimpl
def register_streams(register: RegisterStream) -> None:
    register(PRESENCE_STREAM)


@factstream.hookimpl
def register_command_handlers(register: RegisterCommandHandler) -> None:
    register(CommandHandlerSpec(UserSyncCommand, STREAM, on_user_sync, forget=forget, resend=resend))
    register(CommandHandlerSpec(ClearUserSyncCommand, STREAM, on_clear))


@factstream.hookimpl
def register_requirements(register: Callable[[RequirementSpec], None]) -> None:
    register(RequirementSpec("events", "presence is shown to the users who share a room"))


@factstream.hookimpl
def register_migrations(register: Callable[[MigrationSpec], None]) -> None:
    register(MigrationSpec.from_package("factstream_presence.migrations"))


@factstream.hookimpl
def register_caches(register: Callable[[CacheSpec], None]) -> None:
    for spec in cached_specs(PresenceStore):
        register(spec)


@factstream.hookimpl
def register_invalidations(register: Callable[[InvalidationSpec], None]) -> None:
    register(InvalidationSpec(stream=STREAM, cache=USER_CACHE, keys=lambda row: [(row.user_id,)]))


@factstream.hookimpl
def register_settings(register: Callable[[SettingsSpec], None]) -> None:
    register(SettingsSpec(model=PresenceSettings))


@factstream.hookimpl
def register_routes(register: Callable[[RouteSpec], None]) -> None:
    for route in ROUTES:
        register(route)


@factstream.hookimpl
def register_export_jobs(register: Callable[[ExportJobSpec], None]) -> None:
    register(ExportJobSpec(name="presence_all", stream=STREAM, description="each user's presence rows, as written"))


@factstream.hookimpl
def startup(host: HostApi) -> None:
    """Everywhere: report who syncs here. On the writer: apply the timeouts."""
    writers = host.settings.writers_for(STREAM)
    if len(writers) != 1:
        raise ConfigError(
            f"stream_writers.presence: presence has one writer, not {len(writers)} ({', '.join(writers)})"
        )
    if not host.plugin_settings(PresenceSettings).enabled:
        return
    if host.writes(STREAM):
        host.spawn(host.state(PresenceWriter).run(), name="presence-timeouts")
    host.spawn(host.state(PresenceReporter).run(), name="presence-reporter")


@factstream.hookimpl
def shutdown(host: HostApi) -> None:
    """This process stops serving ``/sync``: tell the writer (``CLEAR_USER_SYNC``)."""
    if not host.plugin_settings(PresenceSettings).enabled:
        return
    try:
        host.state(PresenceReporter).stopping()
    except Exception:  # the link may be gone already: the writer learns it from the instance lease
        return
