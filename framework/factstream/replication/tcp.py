"""TCP transport: a server on the main instance, one client connection per other instance.

Line protocol as in the reference: on connect the server sends ``SERVER <name>`` and a ``PING``; the
client sends ``NAME <instance>``, a ``PING`` and ``REPLICATE``. Keepalive: each side pings every 5 s
when it has sent nothing else; once a peer has pinged, 25 s of silence from it closes the link
(``ERROR ping timeout``). A line longer than ``max_line`` bytes, a line that does not parse, or a
command the peer's side may not send gets ``ERROR <reason>`` and the connection is closed; nobody
else is affected. Outbound commands wait in a bounded queue per connection: a reader that cannot
keep up is sent ``ERROR Failed to keep up`` and disconnected rather than buffered without bound; it
reconnects and catches up from the database.

Beyond the reference, clients may also send RDATA and POSITION (for streams they write), and the
server relays those and REPLICATE to its other clients: the main instance is a hub, so several
writers work over TCP too. A Synapse peer never sends them, so wire compatibility is unaffected.

Trust (docs/security.md). A client speaks only for the instance it is: the one it proved with the
shared secret (``FS_AUTH``, see :mod:`factstream.replication.auth`) or, without a secret, the one it
``NAME``d; RDATA and POSITION under any other name, or before the peer has a name, are refused by the
handler, and the hub relays only what the handler accepted. A POSITION announcing more than this
process knows to have been allocated is checked against the stream's sequence before it is
processed or relayed (reading from that peer pauses meanwhile).

This module holds the two ends, :class:`TcpServer` (the hub) and :class:`TcpClient`, and the
:class:`Link` that configures both; each established link is a
:class:`~factstream.replication.tcp_connection.TcpConnection` (line reader, outbound queue,
keepalive, handshake).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
import time
from collections.abc import Callable
from dataclasses import dataclass

from factstream.replication import wire
from factstream.replication.links import RECENT_SECONDS, LinkStats, Reconnects, positions_text
from factstream.replication.tcp_connection import (
    CLOSE_TIMEOUT,
    Capacity,
    ConnectionSettings,
    Dispatch,
    DispatchRun,
    PositionVetter,
    Side,
    TcpConnection,
    ping,
    unstamped_line,
)
from factstream.sockets import set_nodelay

__all__ = ["Capacity", "ConnectionSettings", "Link", "PositionVetter", "TcpClient", "TcpConnection", "TcpServer"]

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Link:
    """What both ends of a TCP link need: its connections' settings (names, limits, secret) and the
    callbacks into the host."""

    settings: ConnectionSettings
    on_connect: Callable[[TcpConnection], None]
    on_disconnect: Callable[[TcpConnection], None]
    dispatch: Dispatch
    dispatch_run: DispatchRun | None = None
    capacity: Capacity | None = None
    vetter: PositionVetter | None = None
    #: This process's positions, per stream, for the log lines of links coming up.
    positions: Callable[[], dict[str, int]] | None = None

    def positions_text(self) -> str:
        return positions_text(self.positions()) if self.positions is not None else ""

    def connection(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, side: Side) -> TcpConnection:
        return TcpConnection(
            reader,
            writer,
            self.settings,
            side=side,
            dispatch=self.dispatch,
            dispatch_run=self.dispatch_run,
            capacity=self.capacity,
            vetter=self.vetter,
        )


class TcpServer:
    """The main instance's replication server."""

    def __init__(self, host: str, port: int, link: Link, *, tls: ssl.SSLContext | None = None) -> None:
        self.host = host
        self.port = port
        self.link = link
        self.tls = tls
        self.connections: set[TcpConnection] = set()
        self._server: asyncio.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        #: Inbound links closed recently, by peer (see :meth:`links`).
        self._closed: dict[str, LinkStats] = {}

    async def start(self) -> None:
        self._server = await asyncio.start_server(
            self._serve, self.host, self.port, limit=self.link.settings.max_line, ssl=self.tls
        )
        sock = self._server.sockets[0].getsockname()
        self.port = int(sock[1])
        log.info("replication server listening on %s:%d", self.host, self.port)

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        set_nodelay(writer.transport)  # explicit, not left to how the listener was made (factstream.sockets)
        conn = self.link.connection(reader, writer, "server")
        conn.stats = LinkStats(peer=conn.name, transport="tcp", direction="inbound")
        conn.stats.connected()
        conn.on_named = self._named
        self.connections.add(conn)
        task = asyncio.current_task()
        if task is not None:
            self._tasks.add(task)
        conn.greet()
        self.link.on_connect(conn)
        try:
            await conn.run()
        finally:
            self.connections.discard(conn)
            conn.stats.peer = conn.peer or conn.name
            conn.stats.disconnected()
            if conn.peer is not None:  # kept for a while under its name; nameless ones are forgotten
                self._closed[conn.peer] = conn.stats
                self._forget_closed(time.time())
            self.link.on_disconnect(conn)
            if conn.peer is not None:  # a connection that never said who it is was never "up"
                fields = {"peer": conn.peer, "direction": "inbound", "reason": conn.close_reason or "closed"}
                log.info("replication link down", extra={"fields": fields})
            if task is not None:
                self._tasks.discard(task)

    def _named(self, conn: TcpConnection) -> None:
        """A client said who it is: its link is up."""
        conn.stats.peer = conn.peer or conn.name
        fields = {"peer": conn.stats.peer, "direction": "inbound", "positions": self.link.positions_text()}
        log.info("replication link up", extra={"fields": fields})

    def links(self) -> list[LinkStats]:
        """One inbound link per connected peer, then those closed in the last :data:`RECENT_SECONDS`
        whose peer has not reconnected (a peer is named once it said who it is)."""
        now = time.time()
        live = []
        for conn in self.connections:
            conn.stats.peer = conn.peer or conn.name
            live.append(conn.stats)
        names = {stats.peer for stats in live}
        self._forget_closed(now)
        live.extend(stats for peer, stats in self._closed.items() if peer not in names)
        return sorted(live, key=lambda stats: stats.peer)

    def _forget_closed(self, now: float) -> None:
        for peer, stats in list(self._closed.items()):
            if now - stats.since > RECENT_SECONDS:
                del self._closed[peer]

    def send_all(self, command: wire.Command, *, exclude: TcpConnection | None = None) -> None:
        if not self.connections:
            return
        line = wire.encode_line(command)
        plain = unstamped_line(command, line)
        rdata = type(command) is wire.RdataCommand
        for conn in list(self.connections):
            if conn is not exclude and conn.may_send:  # nothing for a client that has not authenticated
                conn.send_line(line if conn.reads_stamps else plain)
                if rdata and conn.counting:
                    conn.stats.rows_sent += 1

    def send_lines_all(self, lines: list[bytes], *, exclude: TcpConnection | None = None) -> None:
        if not self.connections:
            return
        blob = b"".join(lines)  # joined once for every connection
        for conn in list(self.connections):
            if conn is not exclude and conn.may_send:
                conn.send_blob(blob, len(lines))
                if conn.counting:
                    conn.stats.rows_sent += len(lines)  # RDATA lines: the streamer's and the runs relayed

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        for conn in list(self.connections):
            conn.close()
        for task in list(self._tasks):
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        if self._server is not None:
            with contextlib.suppress(Exception):
                async with asyncio.timeout(CLOSE_TIMEOUT):  # it waits for every connection to be gone
                    await self._server.wait_closed()


class TcpClient:
    """A worker's connection to the main instance, reconnecting with backoff for ever."""

    def __init__(
        self, host: str, port: int, link: Link, *, max_backoff: float = 5.0, tls: ssl.SSLContext | None = None
    ) -> None:
        self.host = host
        self.port = port
        self.link = link
        self.tls = tls
        self.max_backoff = max_backoff
        self.connection: TcpConnection | None = None
        self.connected = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.connects = 0
        #: The one outbound link, across reconnects (its peer: the main instance's name once set).
        self.stats = LinkStats(peer=f"{host}:{port}", transport="tcp", direction="outbound")
        self._reconnects = Reconnects(log, f"{host}:{port}")

    def start(self) -> None:
        self._task = asyncio.get_running_loop().create_task(self._run(), name="repl-tcp-client")

    async def _run(self) -> None:
        delay = 0.1
        while True:
            try:
                reader, writer = await asyncio.open_connection(
                    self.host,
                    self.port,
                    limit=self.link.settings.max_line,
                    ssl=self.tls,
                    server_hostname=self.host if self.tls is not None else None,
                )
            except OSError as exc:  # ssl.SSLError (a certificate not trusted, a peer without TLS) is one
                self._reconnects.failed(exc, delay, warn=isinstance(exc, ssl.SSLError))
                await asyncio.sleep(delay)
                delay = min(delay * 2, self.max_backoff)
                continue
            delay = 0.1
            set_nodelay(writer.transport)
            conn = self.link.connection(reader, writer, "client")
            conn.name = f"{self.host}:{self.port}"
            conn.stats = self.stats
            self.stats.connected()
            self.connection = conn
            self.connects += 1
            fields: dict[str, object] = {
                "peer": self.stats.peer,
                "address": f"{self.host}:{self.port}",
                "positions": self.link.positions_text(),
            }
            failed = self._reconnects.succeeded()
            if failed:
                fields["failed_attempts"] = failed
            log.info("replication link up", extra={"fields": fields})
            conn.send(wire.NameCommand(self.link.settings.local_name))
            conn.send(ping())
            self.link.on_connect(conn)
            conn.send(wire.ReplicateCommand())
            self.connected.set()
            try:
                await conn.run()
            finally:
                self.connected.clear()
                self.connection = None
                self.stats.disconnected()
                self.link.on_disconnect(conn)
                fields = {"peer": self.stats.peer, "reason": conn.close_reason or "closed"}
                log.info("replication link down", extra={"fields": fields})
            await asyncio.sleep(delay)

    def links(self) -> list[LinkStats]:
        return [self.stats]

    def send_all(self, command: wire.Command, *, exclude: TcpConnection | None = None) -> None:
        conn = self.connection
        if conn is not None and conn is not exclude:
            conn.send(command)
            if conn.counting and type(command) is wire.RdataCommand:
                conn.stats.rows_sent += 1

    def send_lines_all(self, lines: list[bytes], *, exclude: TcpConnection | None = None) -> None:
        conn = self.connection
        if conn is not None and conn is not exclude:
            conn.send_lines(lines)
            if conn.counting:
                conn.stats.rows_sent += len(lines)  # RDATA lines (the streamer's)

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await self._task
        if self.connection is not None:
            self.connection.close()
