"""A host's parts, built once in dependency order: :class:`HostParts` and :func:`compose`.

:func:`compose` reaches and checks the database, then builds every part from the ones below it::

    database -> writer leases, export runs -> streams (ID generators, replication state) -> caches
      -> sync service (token layout, notifier, wake router) -> reader pipeline -> local rows
      -> replication handler -> plugin API -> the plugins' rows handlers join the pipeline
      -> transport -> streamer

so that every field of the :class:`HostParts` it returns is set: the route, health and dashboard code
take that one type. One step closes a loop and is done last, before anything runs: the plugins' rows
handlers are called with the plugin API, which writes through the pipeline that calls them
(:meth:`~factstream.host.pipeline.ReaderPipeline.add_handlers`). Nothing is started here: the host
starts the transport, the streamer, the sync service and the plugins (``factstream.host.app``). A
failure part-way closes what was opened, in reverse order; a built host's parts close in that same
order too (:meth:`HostParts.close`, by the same stack).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from factstream.caches.invalidate import CACHES_STREAM
from factstream.caches.registry import CacheRegistry
from factstream.config import Settings
from factstream.db.database import Database
from factstream.db.engine import check_database, database_url
from factstream.errors import ConfigError
from factstream.export.runs import ExportRunsMonitor
from factstream.host.facade import HostFacade, load_plugin_settings
from factstream.host.pipeline import LocalRows, ReaderPipeline
from factstream.host.recent import RecentProblems
from factstream.idgen.generator import MultiWriterIdGenerator
from factstream.idgen.kept import KeptPositions
from factstream.idgen.leases import LeaseHeldError, WriterLeases
from factstream.plugin.manager import PluginHost
from factstream.plugin.registry import Registry
from factstream.plugin.streams import StreamSpec
from factstream.replication.auth import ReplicationSecret
from factstream.replication.commands import INSTANCE_LEASE, CommandRouter
from factstream.replication.handler import ReplicationHandler
from factstream.replication.kept import KeptSource
from factstream.replication.stream import ReplicatedStream
from factstream.replication.streamer import ReplicationStreamer
from factstream.replication.transport import Transport, make_transport
from factstream.sync.service import SyncService

log = logging.getLogger(__name__)


@dataclass(eq=False)
class HostParts:
    """Everything a started host is made of (module docstring); what routes, health and the dashboard read."""

    settings: Settings
    plugins: PluginHost
    db: Database
    leases: WriterLeases
    #: The export runs recorded in the database, for ``/metrics``.
    export_runs: ExportRunsMonitor
    streams: dict[str, ReplicatedStream]
    caches: CacheRegistry
    #: ``/sync``: token layout, notifier and wake-ups.
    sync: SyncService
    pipeline: ReaderPipeline
    local_rows: LocalRows
    handler: ReplicationHandler
    #: The host as plugins see it (``factstream.HostApi``).
    api: HostFacade
    streamer: ReplicationStreamer
    #: The replication transport; ``None`` only while replication is cut on purpose
    #: (``Host.disconnect_replication``, for fault injection and maintenance).
    transport: Transport | None
    #: The last warnings and errors of this process (the dashboard shows them).
    recent: RecentProblems
    #: What :func:`compose` opened, closed in reverse by :meth:`close`.
    closing: contextlib.AsyncExitStack = field(repr=False)

    @property
    def instance_name(self) -> str:
        return self.settings.instance_name

    async def close(self) -> None:
        """Close the parts in the reverse of the order :func:`compose` built them: the streamer and the
        transport in use, then the rest as pushed on :attr:`closing` (the handler, local rows, the sync
        service, the caches, the ID generators, the leases, the export runs, the pool last). A build that
        fails part-way closes what it built by the same stack, in the same order."""
        await self.streamer.close()
        if self.transport is not None:
            await self.transport.close()
            self.transport = None
        await self.closing.aclose()

    async def wait_for_stream_position(self, instance: str, stream: str, position: int, timeout: float = 5.0) -> bool:
        return await self.handler.wait_for_stream_position(instance, stream, position, timeout)


# Long on purpose: the dependency order of the parts, top to bottom, in one place (module docstring).
async def compose(
    settings: Settings,
    plugins: PluginHost,
    recent: RecentProblems,
    check_migrated: Callable[[str], None],
) -> HostParts:
    """Build a host's parts (module docstring); ``check_migrated(url)`` refuses a database that is not
    ready for these plugins."""
    instance = settings.instance_name
    registry = plugins.registry
    unknown = sorted(set(settings.stream_writers) - set(registry.streams.names()))
    if unknown:
        raise ConfigError(
            f"stream_writers names unknown stream(s) {', '.join(map(repr, unknown))} "
            f"(registered: {', '.join(registry.streams.names()) or 'none'})"
        )
    plugin_settings = load_plugin_settings(settings, registry, plugins.plugins)
    url = await asyncio.to_thread(database_url, settings)
    await asyncio.to_thread(check_database, url, settings.database.connect_timeout)
    await asyncio.to_thread(check_migrated, url)
    opened = contextlib.AsyncExitStack()
    async with opened:
        db = Database(
            url,
            instance_name=instance,
            pool_size=settings.database.pool_size,
            connect_timeout=settings.database.connect_timeout,
        )
        opened.push_async_callback(db.close)
        await db.open()
        streams: dict[str, ReplicatedStream] = {}
        export_runs = ExportRunsMonitor(db, lambda name: _persisted(streams, name))
        opened.callback(export_runs.close)
        leases = WriterLeases(db)
        opened.push_async_callback(leases.close)
        for reg in registry.streams:
            if reg.spec.kept:
                streams[reg.spec.name] = _kept_stream(reg.spec, settings, db)
                continue
            gen = MultiWriterIdGenerator.from_spec(db, reg.spec, settings, leases=leases)
            opened.push_async_callback(gen.close)
            await gen.start()
            streams[reg.spec.name] = ReplicatedStream(reg.spec, gen, db)
        caches = CacheRegistry.from_registry(registry, instance_name=instance)
        opened.callback(caches.close)
        caches_stream = streams.get(CACHES_STREAM)
        if caches_stream is not None and isinstance(caches_stream.id_gen, MultiWriterIdGenerator):
            caches.attach_stream(caches_stream.spec, caches_stream.id_gen)
        sync = await SyncService.create(settings, plugins, db, streams)
        opened.push_async_callback(sync.close)
        pipeline = ReaderPipeline(caches, sync.router if sync.synced else None)
        local_rows = LocalRows(pipeline, streams.values())
        opened.push_async_callback(local_rows.close)
        handler = ReplicationHandler(
            instance, streams.values(), sink=pipeline, max_backlog=settings.replication.max_backlog
        )
        opened.push_async_callback(handler.close)
        commands = await _command_router(settings, registry, leases)
        opened.push_async_callback(commands.close)
        handler.commands = commands
        api = HostFacade(
            settings, plugins, db, streams, caches, local_rows, handler, plugin_settings, commands, sync.syncing
        )
        commands.host = api
        pipeline.add_handlers(plugins.rows_handlers(api))
        pipeline.attach_resets(streams.values(), plugins.reset_handlers(api))
        # the transport last: nothing after it can fail, and HostParts.close closes the one in use then
        # (Host.reconnect_replication replaces it)
        transport = make_transport(settings, handler)
        streamer = ReplicationStreamer(
            instance,
            streams.values(),
            transport,
            linger=settings.replication.linger_ms / 1000,
            linger_rows=settings.replication.linger_rows,
        )
        handler.on_replicate = lambda _conn: streamer.announce()
        link_transport(transport, streamer, commands)
        closing = opened.pop_all()  # built: HostParts.close closes them from now on
    return HostParts(
        settings=settings,
        plugins=plugins,
        db=db,
        leases=leases,
        export_runs=export_runs,
        streams=streams,
        caches=caches,
        sync=sync,
        pipeline=pipeline,
        local_rows=local_rows,
        handler=handler,
        api=api,
        streamer=streamer,
        transport=transport,
        recent=recent,
        closing=closing,
    )


def link_transport(transport: Transport, streamer: ReplicationStreamer, commands: CommandRouter) -> None:
    """What a (new) transport calls: on connecting, the streamer announces and the plugins' commands are
    sent again; after a gap, the streamer's positions."""

    def connected() -> None:
        streamer.announce()
        commands.connected()

    transport.on_connected = connected
    transport.on_gap = streamer.mark_gap
    commands.outlet = transport


async def _command_router(settings: Settings, registry: Registry, leases: WriterLeases) -> CommandRouter:
    """The plugins' command handlers; with any, this host holds its instance lease (whose end tells the
    handlers' instances that it is gone: ``factstream.plugin.commands``)."""

    def writers_of(stream: str) -> list[str]:
        return settings.writers_for(stream) if registry.streams.get(stream).writers == "configured" else []

    router = CommandRouter(
        settings.instance_name,
        registry.command_handlers,
        writers_of=writers_of,
        leases=leases,
        tcp_main=None if settings.redis.url else settings.main_instance,
    )
    if router:
        try:
            await leases.claim(INSTANCE_LEASE, settings.instance_name)
        except LeaseHeldError as exc:
            log.warning("another process runs as %s: %s", settings.instance_name, exc)
    return router


def _kept_stream(spec: StreamSpec[Any], settings: Settings, db: Database) -> ReplicatedStream:
    """A kept stream's replication state: positions in memory, updates from its keeper or its writer."""
    writers = settings.writers_for(spec.name) if spec.writers == "configured" else []
    positions = KeptPositions(stream_name=spec.name, writers=writers, instance_name=settings.instance_name)

    def url_of(instance: str) -> tuple[str, int] | None:
        endpoint = settings.instance_map.get(instance)
        if endpoint is None or not endpoint.http_port:
            return None
        return endpoint.host, endpoint.http_port

    source = KeptSource(
        spec.name,
        settings.instance_name,
        epoch=positions.epoch,
        url_of=url_of,
        secret=ReplicationSecret.from_settings(settings),
    )
    return ReplicatedStream(spec, positions, db, kept=source)


def _persisted(streams: dict[str, ReplicatedStream], stream: str) -> int | None:
    """``stream``'s persisted-up-to position as a positive wire token (``None``: not run here)."""
    found = streams.get(stream)
    if found is None:
        return None
    return found.id_gen.get_current_token() * found.id_gen.factor
