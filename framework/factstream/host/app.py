"""``Host``: one running factstream instance.

Start-up: configuration and plugins are already loaded; :func:`factstream.host.parts.compose` reaches
the database (the embedded server is started when none is configured), refuses one that is not
migrated, and builds every part in dependency order (ID generators claiming this writer's lease, caches,
the sync service, the reader pipeline, the plugin API, the replication handler and transport), so that
no replicated row or invalidation can arrive before what handles it exists. Then the transport starts
(Redis when ``redis.url`` is set, else TCP: a server on the main instance, a client elsewhere), then
the plugins' ``startup`` hooks run, and last the HTTP API starts (when this instance has an
``http_port``), so no request reaches a half-started host. Shutdown runs in reverse (the HTTP API
first) and persists final positions.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import signal
import time
from collections.abc import Iterator

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector
from starlette.applications import Starlette

from factstream import metrics
from factstream.caches import metrics as cache_metrics
from factstream.caches.registry import CacheRegistry
from factstream.config import Settings
from factstream.db.database import Database
from factstream.errors import FactstreamError
from factstream.export import runs as export_run_metrics
from factstream.export.runs import ExportRunsMonitor
from factstream.host import health, request_metrics
from factstream.host.auth import TokenAuthenticator
from factstream.host.facade import HostFacade
from factstream.host.parts import HostParts, compose, link_transport
from factstream.host.pipeline import LocalRows
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
    """A running instance: ``await host.start()``, ``await host.stop()`` (or ``run_until_stopped``).

    :meth:`start` builds the host's parts in one step (:func:`factstream.host.parts.compose`) and then
    starts them; :attr:`parts` holds them from then on (the properties below read them, and say that the
    host has not started when it has not).
    """

    def __init__(self, settings: Settings, plugins: PluginHost) -> None:
        self.settings = settings
        self.plugins = plugins
        self.instance_name = settings.instance_name
        #: The last warnings and errors of this process (the dashboard shows them), kept while it runs.
        self.recent = RecentProblems()
        self._parts: HostParts | None = None
        self._app: Starlette | None = None
        #: The HTTP API's server, when this instance has an ``http_port`` (started last).
        self.http: HttpServer | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._stopped = asyncio.Event()
        #: ``time.monotonic()`` when :meth:`start` began (for the uptime of the ``stopped`` line).
        self._started_at: float | None = None
        #: Whether :meth:`start` completed (and :meth:`stop` has not run since).
        self._ready = False
        self._plugins_started = False
        #: The signal that stopped :meth:`run_until_stopped` (``None`` until one did).
        self.stop_signal: signal.Signals | None = None

    # -- the parts (built by start) -------------------------------------------------------------------

    @property
    def parts(self) -> HostParts:
        """Everything the started host is made of (``factstream.host.parts``)."""
        if self._parts is None:
            raise FactstreamError("the host has not started")
        return self._parts

    @property
    def app(self) -> Starlette:
        """The HTTP API's ASGI application (served if this instance has an ``http_port``)."""
        if self._app is None:
            raise FactstreamError("the host has not started")
        return self._app

    @property
    def api(self) -> HostFacade:
        """The plugin API of this host (what hooks, routes and ``SyncRequest`` get)."""
        return self.parts.api

    @property
    def db(self) -> Database:
        return self.parts.db

    def database(self) -> Database:
        """The pool, as ``HostApi.database()`` names it: code that takes a host or the plugin API reads
        the database the same way from either."""
        return self.parts.db

    @property
    def streams(self) -> dict[str, ReplicatedStream]:
        return self.parts.streams

    @property
    def caches(self) -> CacheRegistry:
        """This process's caches (from the plugins' registrations)."""
        return self.parts.caches

    @property
    def sync(self) -> SyncService:
        """``/sync``: token layout, notifier and wake-ups."""
        return self.parts.sync

    @property
    def handler(self) -> ReplicationHandler:
        return self.parts.handler

    @property
    def streamer(self) -> ReplicationStreamer:
        return self.parts.streamer

    @property
    def transport(self) -> Transport | None:
        return self.parts.transport

    @property
    def local_rows(self) -> LocalRows:
        return self.parts.local_rows

    @property
    def leases(self) -> WriterLeases:
        return self.parts.leases

    @property
    def export_runs(self) -> ExportRunsMonitor:
        """The export runs recorded in the database, for ``/metrics``."""
        return self.parts.export_runs

    def id_generator(self, stream: str) -> MultiWriterIdGenerator:
        """The ID generator of a registered stream (one backed by a table: a kept stream has none)."""
        streams = self.parts.streams
        try:
            gen = streams[stream].id_gen
        except KeyError:
            raise FactstreamError(f"unknown stream {stream!r} (streams: {', '.join(streams)})") from None
        if not isinstance(gen, MultiWriterIdGenerator):
            raise FactstreamError(f"stream {stream!r} is kept by its writer: it has no ID generator")
        return gen

    async def wait_for_stream_position(self, instance: str, stream: str, position: int, timeout: float = 5.0) -> bool:
        return await self.parts.wait_for_stream_position(instance, stream, position, timeout)

    # -- lifecycle ---------------------------------------------------------------------------------

    async def start(self) -> None:
        register_metrics()
        self.recent.install()
        self._started_at = time.monotonic()
        endpoint = self.settings.http_endpoint()
        log.info(
            "instance %s starting",
            self.instance_name,
            extra=kv(http=f"http://{endpoint[0]}:{endpoint[1]}" if endpoint else "none"),
        )
        parts = self._parts = await compose(self.settings, self.plugins, self.recent, self._check_migrated)
        health.track(parts)
        if parts.transport is not None:  # always, on a host just composed
            await parts.transport.start()
        parts.streamer.start()
        parts.sync.start()
        self._tasks.append(asyncio.get_running_loop().create_task(self._check_retired(), name="retired-writers"))
        self._plugins_started = True  # a plugin whose startup hook ran gets its shutdown hook
        await self.plugins.startup(parts.api)
        app = self._app = build_app(parts)
        if endpoint is not None:
            self.http = HttpServer(app, *endpoint, grace=self.settings.http.shutdown_grace_seconds)
            await self.http.start()
        self._ready = True
        log.info("instance %s started", self.instance_name, extra=kv(**self._started_fields()))

    def _started_fields(self) -> dict[str, str]:
        """What the ``started`` line says: the HTTP URL, the streams this instance writes, the transport."""
        streams = self.parts.streams
        writes = [name for name, stream in streams.items() if stream.id_gen.is_writer]
        return {
            "http": self.http.url if self.http is not None else "none",
            "writes": ",".join(writes) or "none",
            "streams": ",".join(streams) or "none",
            "transport": "redis" if self.settings.redis.url else "tcp",
        }

    async def refresh_metrics(self) -> None:
        """Read what ``/metrics`` shows from the database (export runs; cached a few seconds)."""
        await self.parts.export_runs.refresh()

    def _check_migrated(self, url: str) -> None:
        """Refuse a database this instance cannot work on: a branch behind its head, or revisions of a
        plugin that is not loaded (the message says which, and what to do: ``migrate.not_ready``)."""
        from factstream.migrate import require_migrated

        require_migrated(url, self.plugins)

    async def _check_retired(self) -> None:
        while True:
            await asyncio.sleep(RETIRED_WRITER_CHECK_SECONDS)
            for stream in self.parts.streams.values():
                try:
                    gone = await stream.id_gen.check_retired_writers()
                    if gone:
                        log.info("stream %s: forgot writers that are gone: %s", stream.name, ", ".join(gone))
                except Exception:
                    log.warning("could not check retired writers of %s", stream.name, exc_info=True)

    async def disconnect_replication(self) -> None:
        """Drop this instance's replication links (fault injection, maintenance)."""
        parts = self.parts
        if parts.transport is not None:
            await parts.transport.close()
            parts.transport = None
        for conn in list(parts.handler.connections):
            parts.handler.lost_connection(conn)

    async def connect_replication(self) -> None:
        """(Re)start the transport; on connecting, peers' POSITIONs make this instance catch up."""
        parts = self.parts
        if parts.transport is not None:
            await self.disconnect_replication()
        transport = make_transport(self.settings, parts.handler)
        assert parts.handler.commands is not None  # compose sets it
        link_transport(transport, parts.streamer, parts.handler.commands)
        parts.streamer.attach(transport)
        parts.transport = transport
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
        parts = self._parts
        if parts is not None:
            parts.sync.notifier.close()  # open long polls answer now, before the server stops
        if self.http is not None:
            await self.http.close()
            self.http = None
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._tasks.clear()
        if parts is not None:
            health.forget(parts)
            await parts.api.cancel_tasks()
            if self._plugins_started:
                for error in await self.plugins.shutdown(parts.api):
                    log.error("%s", error)
            await parts.close()
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


def build_app(parts: HostParts) -> Starlette:
    """The HTTP API (a Starlette app) of the core's and the plugins' routes."""
    from factstream.host.http import build_app as build
    from factstream.host.routes import core_routes, plugin_routes

    auth = TokenAuthenticator.from_config(parts.settings.http, parts.db)
    return build(parts, core_routes() + plugin_routes(parts.plugins), auth)


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
