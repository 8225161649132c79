"""``Host``: one running factstream instance.

Start-up order: configuration and plugins are already loaded; the database is reached (the
embedded server is started when none is configured) and must be migrated; every registered stream
gets its ID generator (claiming this writer's lease) and its replication state; the transport starts
(Redis when ``redis.url`` is set, else TCP: a server on the main instance, a client elsewhere);
then the plugins' ``startup`` hooks run, and last the HTTP API starts (when this instance has an
``http_port``), so no request reaches a half-started host. The cache registry (``host.caches``) is
built before the transport starts, so no replicated invalidation can arrive before the caches exist.
The sync service (``factstream.sync.service``: token layout, notifier, wake-ups) is built before the transport
starts too, and checks that every sync key follows a replicated stream. Shutdown runs in reverse
(the HTTP API first) and persists final positions.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import signal
import time
from collections.abc import Iterator
from typing import Any

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from factstream import metrics
from factstream.caches import metrics as cache_metrics
from factstream.caches.invalidate import CACHES_STREAM
from factstream.caches.registry import CacheRegistry
from factstream.config import Settings
from factstream.db.database import Database
from factstream.db.engine import check_database, database_url
from factstream.errors import ConfigError, FactstreamError
from factstream.export import runs as export_run_metrics
from factstream.export.runs import ExportRunsMonitor
from factstream.host import health, request_metrics
from factstream.host.auth import TokenAuthenticator
from factstream.host.facade import HostFacade, load_plugin_settings
from factstream.host.pipeline import LocalRows, ReaderPipeline
from factstream.host.recent import RecentProblems
from factstream.host.server import HttpServer
from factstream.idgen import metrics as idgen_metrics
from factstream.idgen.generator import MultiWriterIdGenerator
from factstream.idgen.leases import WriterLeases
from factstream.logs import kv
from factstream.plugin.manager import PluginHost
from factstream.replication import links as replication_links
from factstream.replication.handler import ReplicationHandler
from factstream.replication.stream import ReplicatedStream
from factstream.replication.streamer import ReplicationStreamer
from factstream.replication.transport import Transport, make_transport
from factstream.sync.notifier import register_metrics as register_notifier_metrics
from factstream.sync.service import SyncService

log = logging.getLogger(__name__)

RETIRED_WRITER_CHECK_SECONDS = 10.0


class Host:
    """A running instance: ``await host.start()``, ``await host.stop()`` (or ``run_until_stopped``)."""

    def __init__(self, settings: Settings, plugins: PluginHost) -> None:
        self.settings = settings
        self.plugins = plugins
        self.instance_name = settings.instance_name
        self.db: Database | None = None
        self.leases: WriterLeases | None = None
        #: The export runs recorded in the database, for ``/metrics`` (built when the host starts).
        self.export_runs: ExportRunsMonitor | None = None
        self.streams: dict[str, ReplicatedStream] = {}
        self.handler: ReplicationHandler | None = None
        self.streamer: ReplicationStreamer | None = None
        self.transport: Transport | None = None
        #: This process's caches (filled from the plugins' registrations when the host starts).
        self.caches = CacheRegistry(instance_name=self.instance_name)
        #: ``/sync``: token layout, notifier and wake-ups (built when the host starts).
        self.sync: SyncService | None = None
        #: The HTTP API's ASGI application (built when the host starts, served if it has a port).
        self.app: Any = None
        self.http: HttpServer | None = None
        #: The host as plugins see it (``factstream.HostApi``), built when the host starts.
        self._api: HostFacade | None = None
        self.local_rows: LocalRows | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._stopped = asyncio.Event()
        #: ``time.monotonic()`` when :meth:`start` began (for the uptime of the ``stopped`` line).
        self._started_at: float | None = None
        #: Whether :meth:`start` completed (and :meth:`stop` has not run since).
        self._ready = False
        self._plugins_started = False
        #: The signal that stopped :meth:`run_until_stopped` (``None`` until one did).
        self.stop_signal: signal.Signals | None = None
        #: The last warnings and errors of this process (the dashboard shows them), kept while it runs.
        self.recent = RecentProblems()

    # -- access for the core (plugins get ``api``) ----------------------------------------------------

    @property
    def api(self) -> HostFacade:
        """The plugin API of this host (what hooks, routes and ``SyncRequest`` get)."""
        if self._api is None:
            raise FactstreamError("the host has not started")
        return self._api

    def database(self) -> Database:
        if self.db is None:
            raise FactstreamError("the host has not started")
        return self.db

    def id_generator(self, stream: str) -> MultiWriterIdGenerator:
        """The ID generator of a registered stream."""
        try:
            return self.streams[stream].id_gen
        except KeyError:
            raise FactstreamError(f"unknown stream {stream!r} (streams: {', '.join(self.streams)})") from None

    def sync_service(self) -> SyncService:
        """The ``/sync`` service (token layout, notifier)."""
        if self.sync is None:
            raise FactstreamError("the host has not started")
        return self.sync

    async def wait_for_stream_position(self, instance: str, stream: str, position: int, timeout: float = 5.0) -> bool:
        assert self.handler is not None
        return await self.handler.wait_for_stream_position(instance, stream, position, timeout)

    # -- lifecycle ---------------------------------------------------------------------------------

    async def start(self) -> None:
        register_metrics()
        self.recent.install()
        health.track(self)
        settings = self.settings
        self._started_at = time.monotonic()
        endpoint = settings.http_endpoint()
        log.info(
            "instance %s starting",
            self.instance_name,
            extra=kv(http=f"http://{endpoint[0]}:{endpoint[1]}" if endpoint else "none"),
        )
        registry = self.plugins.registry
        unknown = sorted(set(settings.stream_writers) - set(registry.streams.names()))
        if unknown:
            raise ConfigError(
                f"stream_writers names unknown stream(s) {', '.join(map(repr, unknown))} "
                f"(registered: {', '.join(registry.streams.names()) or 'none'})"
            )
        plugin_settings = load_plugin_settings(settings, registry, self.plugins.plugins)
        url = await asyncio.to_thread(database_url, settings)
        await asyncio.to_thread(check_database, url, settings.database.connect_timeout)
        await asyncio.to_thread(self._check_migrated, url)
        self.db = Database(
            url,
            instance_name=self.instance_name,
            pool_size=settings.database.pool_size,
            connect_timeout=settings.database.connect_timeout,
        )
        await self.db.open()
        self.export_runs = ExportRunsMonitor(self.db, self._persisted_position)
        self.leases = WriterLeases(self.db)
        for reg in registry.streams:
            gen = MultiWriterIdGenerator.from_spec(self.db, reg.spec, settings, leases=self.leases)
            await gen.start()
            self.streams[reg.spec.name] = ReplicatedStream(reg.spec, gen, self.db)

        self.caches = CacheRegistry.from_registry(registry, instance_name=self.instance_name)
        caches_stream = self.streams.get(CACHES_STREAM)
        if caches_stream is not None:
            self.caches.attach_stream(caches_stream.spec, caches_stream.id_gen)
        self._api = HostFacade(self, plugin_settings)
        self.sync = await SyncService.create(self, self.db, self.streams)
        # The reader pipeline (factstream.host.pipeline): invalidations, rows handlers, advance, wake.
        pipeline = ReaderPipeline(
            self.caches, self.plugins.rows_handlers(self._api), self.sync.router if self.sync.synced else None
        )
        self.local_rows = LocalRows(pipeline, self.streams.values())
        self._api.local_sink = self.local_rows
        self.handler = ReplicationHandler(
            self.instance_name, self.streams.values(), sink=pipeline, max_backlog=settings.replication.max_backlog
        )
        self.transport = make_transport(settings, self.handler)
        self.streamer = ReplicationStreamer(
            self.instance_name,
            self.streams.values(),
            self.transport,
            linger=settings.replication.linger_ms / 1000,
            linger_rows=settings.replication.linger_rows,
        )
        self.handler.on_replicate = lambda _conn: self.streamer.announce() if self.streamer else None
        self.transport.on_connected = self.streamer.announce
        self.transport.on_gap = self.streamer.mark_gap
        await self.transport.start()
        self.streamer.start()
        self.sync.start()
        self._tasks.append(asyncio.get_running_loop().create_task(self._check_retired(), name="retired-writers"))
        self._plugins_started = True  # a plugin whose startup hook ran gets its shutdown hook
        await self.plugins.startup(self._api)
        self.app = self.build_app()
        endpoint = settings.http_endpoint()
        if endpoint is not None:
            self.http = HttpServer(self.app, *endpoint, grace=settings.http.shutdown_grace_seconds)
            await self.http.start()
        self._ready = True
        log.info("instance %s started", self.instance_name, extra=kv(**self._started_fields()))

    def _started_fields(self) -> dict[str, str]:
        """What the ``started`` line says: the HTTP URL, the streams this instance writes, the transport."""
        writes = [name for name, stream in self.streams.items() if stream.id_gen.is_writer]
        transport = "none" if self.transport is None else "redis" if self.settings.redis.url else "tcp"
        return {
            "http": self.http.url if self.http is not None else "none",
            "writes": ",".join(writes) or "none",
            "streams": ",".join(self.streams) or "none",
            "transport": transport,
        }

    def build_app(self) -> Any:
        """The HTTP API (a Starlette app) of the core's and the plugins' routes."""
        from factstream.host.http import build_app
        from factstream.host.routes import core_routes, plugin_routes

        auth = TokenAuthenticator.from_config(self.settings.http, self.db)
        return build_app(self, core_routes() + plugin_routes(self), auth)

    def _persisted_position(self, stream: str) -> int | None:
        """``stream``'s persisted-up-to position as a positive wire token (``None``: not run here)."""
        found = self.streams.get(stream)
        if found is None:
            return None
        gen = found.id_gen
        return gen.get_current_token() * gen.factor

    async def refresh_metrics(self) -> None:
        """Read what ``/metrics`` shows from the database (export runs; cached a few seconds)."""
        if self.export_runs is not None:
            await self.export_runs.refresh()

    def _check_migrated(self, url: str) -> None:
        """Refuse a database this instance cannot work on: a branch behind its head, or revisions of a
        plugin that is not loaded (the message says which, and what to do: ``migrate.not_ready``)."""
        from factstream.migrate import require_migrated

        require_migrated(url, self.plugins)

    async def _check_retired(self) -> None:
        while True:
            await asyncio.sleep(RETIRED_WRITER_CHECK_SECONDS)
            for stream in self.streams.values():
                try:
                    gone = await stream.id_gen.check_retired_writers()
                    if gone:
                        log.info("stream %s: forgot writers that are gone: %s", stream.name, ", ".join(gone))
                except Exception:
                    log.warning("could not check retired writers of %s", stream.name, exc_info=True)

    async def disconnect_replication(self) -> None:
        """Drop this instance's replication links (fault injection, maintenance)."""
        if self.transport is not None:
            await self.transport.close()
            self.transport = None
        assert self.handler is not None
        for conn in list(self.handler.connections):
            self.handler.lost_connection(conn)

    async def connect_replication(self) -> None:
        """(Re)start the transport; on connecting, peers' POSITIONs make this instance catch up."""
        assert self.handler is not None and self.streamer is not None
        if self.transport is not None:
            await self.disconnect_replication()
        transport = make_transport(self.settings, self.handler)
        transport.on_connected = self.streamer.announce
        transport.on_gap = self.streamer.mark_gap
        self.streamer.attach(transport)
        self.transport = transport
        await transport.start()

    async def stop(self) -> None:
        """Close everything; an instance that had started logs ``stopping`` and ``stopped`` (a failed
        start's error is its last word)."""
        ready = self._ready
        self._ready = False
        if ready:
            log.info("instance %s stopping", self.instance_name)
        await self._close()
        if ready and self._started_at is not None:
            uptime = round(time.monotonic() - self._started_at, 3)
            log.info("instance %s stopped", self.instance_name, extra=kv(uptime_seconds=uptime))

    async def _close(self) -> None:
        """Close everything :meth:`start` opened, in reverse order (the HTTP API first)."""
        if self.sync is not None:
            self.sync.notifier.close()  # open long polls answer now, before the server stops
        if self.http is not None:
            await self.http.close()
            self.http = None
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks.clear()
        if self._api is not None:
            await self._api.cancel_tasks()
            if self._plugins_started:
                for error in await self.plugins.shutdown(self._api):
                    log.error("%s", error)
        if self.local_rows is not None:
            await self.local_rows.close()
        if self.sync is not None:
            await self.sync.close()
        if self.streamer is not None:
            await self.streamer.close()
        if self.transport is not None:
            await self.transport.close()
        if self.handler is not None:
            await self.handler.close()
        for stream in self.streams.values():
            await stream.id_gen.close()
        if self.leases is not None:
            await self.leases.close()
        if self.export_runs is not None:
            self.export_runs.close()
        if self.db is not None:
            await self.db.close()
        self.caches.close()
        self.recent.remove()
        self._stopped.set()

    async def run_until_stopped(self) -> None:
        """Start, serve until SIGINT/SIGTERM, stop (:attr:`stop_signal` says which signal it was).

        A signal during start-up stops the start where it is. A start that fails (or is stopped)
        closes what it had opened before the error propagates: the database pool's connection
        attempts, the ID generators' leases, the transport and the plugins' tasks would otherwise be
        left to ``asyncio.run``, which cancels them and then waits for them forever if one of them
        does not end on cancellation (the pool's reconnection attempt, which psycopg turns into an
        ``OperationalError`` and reschedules).
        """
        loop = asyncio.get_running_loop()
        stop = asyncio.Event()

        def on_signal(sig: signal.Signals) -> None:
            self.stop_signal = self.stop_signal or sig
            stop.set()

        for sig in (signal.SIGINT, signal.SIGTERM):
            with contextlib.suppress(NotImplementedError):
                loop.add_signal_handler(sig, on_signal, sig)
        starting = loop.create_task(self.start(), name="host-start")
        stopping = loop.create_task(stop.wait(), name="host-stop-signal")
        try:
            await asyncio.wait((starting, stopping), return_when=asyncio.FIRST_COMPLETED)
        except BaseException:
            starting.cancel()
            stopping.cancel()
            raise
        if not starting.done():
            log.info("stopped by %s while starting", self.stop_signal.name if self.stop_signal else "a signal")
            starting.cancel()
            try:
                await starting
            except asyncio.CancelledError:
                pass
            except Exception:  # a step may turn the cancellation into its own error (psycopg does)
                log.info("the interrupted start ended with an error", exc_info=True)
            await self._stop_quietly()
            return
        if starting.exception() is not None:
            stopping.cancel()
            await self._stop_quietly()
            starting.result()  # raises the start's error
        freeze_startup_heap()
        try:
            await stopping
        finally:
            await self.stop()

    async def _stop_quietly(self) -> None:
        """:meth:`stop` after a failed or interrupted start: its own errors are logged, not raised, so
        that the start's error is the one reported."""
        try:
            await self.stop()
        except Exception:
            log.warning("closing after a failed start failed", exc_info=True)


def freeze_startup_heap() -> None:
    """Move everything alive after start-up out of the garbage collector's sight (``gc.freeze``).

    A started host holds some 100,000 objects (modules, plugins, the web app, SQLAlchemy's and
    pydantic's structures) that live as long as the process. Without this, every full collection
    walks them all: a reader replicating 50,000 rows/s ran one every couple of seconds, taking
    about 65 ms each (1.4 s of 33 s), a stall for everything it was processing. Frozen, the same
    collections took 0.12 s in all. Synapse does the same after its start-up. ``factstream run``
    calls this once the host has started; embedders of :class:`Host` may call it themselves.
    """
    gc.collect()
    gc.freeze()


class _FrozenHeapCollector(Collector):
    def collect(self) -> Iterator[GaugeMetricFamily]:
        yield GaugeMetricFamily(
            "factstream_gc_frozen_objects",
            "Objects moved out of the garbage collector's sight after start-up (see freeze_startup_heap)",
            value=gc.get_freeze_count(),
        )


_FROZEN_HEAP = _FrozenHeapCollector()


def register_metrics() -> None:
    """Register every collector of the core in the default registry: a host's ``/metrics`` shows them
    all from its start. Importing the modules registers none (see :mod:`factstream.metrics`)."""
    idgen_metrics.register()
    request_metrics.register()
    export_run_metrics.register()
    cache_metrics.register()
    register_notifier_metrics()
    replication_links.register()
    health.register()
    metrics.register(_FROZEN_HEAP)
