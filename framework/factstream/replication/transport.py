"""The transport interface the host uses, and the choice between TCP and Redis.

Both transports deliver parsed commands to the :class:`ReplicationHandler` and broadcast what the
streamer sends. TCP: the main instance runs the server and relays RDATA, POSITION and REPLICATE
between its clients; every other instance connects to it. Redis: every instance publishes to and
subscribes to one channel named after the deployment.
"""

from __future__ import annotations

import logging
import ssl
from collections.abc import Callable
from typing import Protocol

from factstream.config import Settings
from factstream.errors import ConfigError
from factstream.replication import wire
from factstream.replication.auth import ReplicationSecret
from factstream.replication.handler import ReplicationHandler
from factstream.replication.links import LinkStats, metrics_enabled, track_lags, track_links, untrack
from factstream.replication.tcp import ConnectionSettings, Link, TcpClient, TcpConnection, TcpServer
from factstream.replication.wire import RdataRun

log = logging.getLogger(__name__)

DEFAULT_REPLICATION_PORT = 9092


class Transport(Protocol):
    on_connected: Callable[[], None] | None
    #: Called when commands sent earlier were lost (see RedisTransport); TCP never drops any.
    on_gap: Callable[[], None] | None

    async def start(self) -> None: ...

    def send(self, command: wire.Command) -> None: ...

    def send_lines(self, lines: list[bytes]) -> None:
        """Send encoded lines (each one command, ending in a newline), in order."""

    def has_peers(self) -> bool: ...

    def links(self) -> list[LinkStats]:
        """This process's replication links and their counters (see :mod:`factstream.replication.links`)."""
        ...

    async def close(self) -> None: ...


class TcpTransport:
    """TCP replication: server on the main instance (a hub relaying writers' commands), client elsewhere."""

    def __init__(self, settings: Settings, handler: ReplicationHandler) -> None:
        self.settings = settings
        self.handler = handler
        self.on_connected: Callable[[], None] | None = None
        self.on_gap: Callable[[], None] | None = None
        main = settings.main_instance
        endpoint = settings.instance_map.get(main)
        self.host = endpoint.host if endpoint else "127.0.0.1"
        self.port = (endpoint.replication_port if endpoint else None) or DEFAULT_REPLICATION_PORT
        self.is_server = settings.instance_name == main
        self.endpoint: TcpServer | TcpClient | None = None
        self.instance_name = settings.instance_name

    def _dispatch(self, conn: TcpConnection, cmd: wire.Command) -> None:
        self.handler.on_command(conn, cmd)  # raises ProtocolError for what must not be relayed
        if self.is_server and isinstance(cmd, wire.RdataCommand | wire.PositionCommand | wire.ReplicateCommand):
            assert isinstance(self.endpoint, TcpServer)
            self.endpoint.send_all(cmd, exclude=conn)  # the hub relays writers' commands

    def _dispatch_run(self, conn: TcpConnection, run: RdataRun) -> None:
        self.handler.on_rdata_run(conn, run)  # raises ProtocolError for what must not be relayed
        if self.is_server:
            assert isinstance(self.endpoint, TcpServer)
            self.endpoint.send_lines_all([line + b"\n" for line in run.lines], exclude=conn)

    def _connected(self, conn: TcpConnection) -> None:
        self.handler.new_connection(conn)
        if not self.is_server and self.on_connected is not None:
            self.on_connected()

    async def start(self) -> None:
        track_links(self)
        limits = self.settings.replication
        tcp_settings = ConnectionSettings(
            local_name=self.settings.instance_name,
            server_name=self.settings.deployment,
            max_line=limits.max_line,
            max_queue=limits.max_queue,
            secret=ReplicationSecret.from_settings(self.settings),
            counting=metrics_enabled(self.settings),
        )
        link = Link(
            tcp_settings,
            on_connect=self._connected,
            on_disconnect=self.handler.lost_connection,
            dispatch=self._dispatch,
            dispatch_run=self._dispatch_run,
            capacity=self.handler,
            vetter=self.handler,
            positions=self.handler.positions,
        )
        tls = tls_context(self.settings, server=self.is_server)
        if self.is_server:
            listen = "0.0.0.0" if self.host not in ("127.0.0.1", "localhost") else self.host
            server = TcpServer(listen, self.port, link, tls=tls)
            try:
                await server.start()
            except OSError as exc:
                raise ConfigError(f"cannot listen for replication on {self.host}:{self.port}: {exc}") from exc
            self.endpoint = server
        else:
            client = TcpClient(self.host, self.port, link, tls=tls)
            client.stats.peer = self.settings.main_instance
            client.start()
            self.endpoint = client

    def send(self, command: wire.Command) -> None:
        if self.endpoint is not None:
            self.endpoint.send_all(command)

    def send_lines(self, lines: list[bytes]) -> None:
        if self.endpoint is not None:
            self.endpoint.send_lines_all(lines)

    def has_peers(self) -> bool:
        if isinstance(self.endpoint, TcpServer):
            return bool(self.endpoint.connections)
        return isinstance(self.endpoint, TcpClient) and self.endpoint.connection is not None

    def links(self) -> list[LinkStats]:
        return self.endpoint.links() if self.endpoint is not None else []

    async def close(self) -> None:
        untrack(self)
        if self.endpoint is not None:
            await self.endpoint.close()


def tls_context(settings: Settings, *, server: bool) -> ssl.SSLContext | None:
    """The TLS context of the TCP link (``replication.tls``), or None; ConfigError for unusable files.

    The main instance serves ``tls_cert`` with ``tls_key``; a client verifies the main instance's
    certificate against ``tls_ca`` (or the system's CAs) and its host name in ``instance_map``.
    """
    config = settings.replication
    if not config.tls:
        return None
    try:
        if server:
            if config.tls_cert is None or config.tls_key is None:
                raise ConfigError("replication.tls is on: the main instance needs replication.tls_cert and tls_key")
            context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
            context.load_cert_chain(config.tls_cert, config.tls_key)
        else:
            context = ssl.create_default_context(
                ssl.Purpose.SERVER_AUTH, cafile=str(config.tls_ca) if config.tls_ca is not None else None
            )
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(f"replication.tls: cannot load the certificate, key or CA file: {exc}") from exc
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    return context


def make_transport(settings: Settings, handler: ReplicationHandler) -> Transport:
    handler.tracking = metrics_enabled(settings)
    track_lags(handler)
    if settings.redis.url:
        from factstream.replication.redis import RedisTransport

        return RedisTransport(settings, handler)
    if len(settings.instance_map) > 1 and settings.main_instance not in settings.instance_map:
        raise ConfigError("instance_map must list the main instance first")
    return TcpTransport(settings, handler)
