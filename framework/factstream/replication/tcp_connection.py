"""One TCP replication link, from either side: :class:`TcpConnection`.

It holds what both ends of the TCP transport share (see :mod:`factstream.replication.tcp` for the
protocol): the line reader, which splits large reads into lines and hands runs of RDATA to the
handler in one call; the bounded outbound queue, whose overflow disconnects a peer that cannot keep
up; keepalive pings; the shared-secret handshake; and the checks on what the peer may send
(commands its side may not send, lines too long, RDATA and POSITION under another instance's name,
a POSITION beyond what is known to be allocated). The server and client that open these links, and
the :class:`~factstream.replication.tcp.Link` that configures them, are in
:mod:`factstream.replication.tcp`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal, Protocol, cast

from factstream.replication import wire
from factstream.replication.auth import AUTH, AUTH_OK, CHALLENGE, AuthError, ReplicationSecret, new_nonce
from factstream.replication.links import LinkStats
from factstream.replication.wire import ProtocolError, RdataRun, split_runs

# Logs under the transport's name, as before this module was split from it (docs/cli.md shows it).
log = logging.getLogger("factstream.replication.tcp")

PING_INTERVAL = 5.0
PING_TIMEOUT = 25.0
DEFAULT_MAX_LINE = 64 * 1024
DEFAULT_MAX_QUEUE = 10_000

Side = Literal["server", "client"]
Dispatch = Callable[["TcpConnection", wire.Command], None]
DispatchRun = Callable[["TcpConnection", RdataRun], None]
READ_CHUNK = 256 * 1024
#: Bytes handed to the socket between two waits for it to drain.
WRITE_CHUNK = 256 * 1024
#: Seconds a server waits for a client to authenticate (with a secret) before closing the link.
AUTH_TIMEOUT = 10.0
#: How long closing a connection waits for its buffered output to leave before dropping it.
CLOSE_TIMEOUT = 5.0
#: Ends the text of every PING a factstream process sends: "I read the writer's clock stamp on
#: POSITION" (see :meth:`TcpConnection.position_line`). A reference peer's PING is a bare timestamp,
#: and it ignores what a PING says.
STAMPS = " stamps"


def ping() -> wire.PingCommand:
    """A keep-alive: this process's clock in milliseconds, as the reference sends, and :data:`STAMPS`."""
    return wire.PingCommand(f"{int(time.time() * 1000)}{STAMPS}")


def unstamped_line(command: wire.Command, line: bytes) -> bytes:
    """``line`` (``command`` encoded) for a peer that does not read POSITION stamps."""
    if type(command) is wire.PositionCommand and command.stamp is not None:
        return wire.encode_line(command.unstamped())
    return line


class Capacity(Protocol):
    """The reader's backpressure: stop reading while it is behind (the handler implements this)."""

    def has_capacity(self) -> bool: ...

    async def wait_for_capacity(self) -> None: ...


class PositionVetter(Protocol):
    """Checks a POSITION against the stream's sequence before it is processed (the handler implements this)."""

    def position_known(self, conn: TcpConnection, cmd: wire.PositionCommand) -> bool:
        """True if the POSITION needs no check (its token is at most what is known to be allocated)."""

    async def check_position(self, conn: TcpConnection, cmd: wire.PositionCommand) -> str | None:
        """Why the POSITION must be refused, or None to accept it."""


@dataclass(frozen=True)
class ConnectionSettings:
    """How a link's connections are configured: the same for every connection a server or client opens,
    fixed for its life. What a connection works with (its streams, the handler's callbacks, which end
    it is) is given to :class:`TcpConnection` beside it."""

    #: This instance's name: the one its handshake proofs name, and one no peer may claim.
    local_name: str
    #: The deployment's name: the server sends it as ``SERVER``; a client closes a link that names another.
    server_name: str
    #: Longest accepted line, in bytes.
    max_line: int = DEFAULT_MAX_LINE
    #: Commands queued for a peer before it is disconnected for not keeping up.
    max_queue: int = DEFAULT_MAX_QUEUE
    #: Seconds of silence after which this side sends a PING.
    ping_interval: float = PING_INTERVAL
    #: Seconds of silence from a peer that has pinged before the link is closed.
    ping_timeout: float = PING_TIMEOUT
    #: The shared secret both ends prove they know before anything else (None: no handshake).
    secret: ReplicationSecret | None = None
    #: Whether each connection's counters are kept (``metrics.enabled``).
    counting: bool = True


class TcpConnection:
    """One established TCP link, from either side."""

    def __init__(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        settings: ConnectionSettings,
        *,
        side: Side,
        dispatch: Dispatch,
        dispatch_run: DispatchRun | None = None,
        capacity: Capacity | None = None,
        vetter: PositionVetter | None = None,
    ) -> None:
        secret = settings.secret
        self.dispatch_run = dispatch_run
        self.secret = secret
        self.vetter = vetter
        #: The instance this peer speaks for (server side: proved with the secret, or its NAME).
        self.peer: str | None = None
        #: Whether the peer passes on other instances' commands (the hub, seen from a client).
        self.relays = side == "client"
        #: Inbound commands beyond the handshake are accepted (with a secret: once the peer proved it).
        self.trusted = secret is None
        #: Queued commands may go out (with a secret: a server's once the client proved it, a
        #: client's once it answered the challenge).
        self.may_send = secret is None
        self._nonce = new_nonce() if secret is not None else b""
        self._server_nonce: bytes | None = None
        self.reader = reader
        self.max_line = settings.max_line
        self.writer = writer
        self.side = side
        self.local_name = settings.local_name
        self.server_name = settings.server_name
        self.dispatch = dispatch
        self.capacity = capacity
        self.max_queue = settings.max_queue
        self.ping_interval = settings.ping_interval
        self.ping_timeout = settings.ping_timeout
        peer = writer.get_extra_info("peername")
        self.name = f"{peer[0]}:{peer[1]}" if isinstance(peer, tuple) else str(peer)
        # Beyond the reference: writers' RDATA/POSITION go to the hub, which relays them and
        # REPLICATE to the other clients (see :mod:`factstream.replication.tcp`).
        self.inbound = (
            wire.CLIENT_SENDS | {"RDATA", "POSITION"} if side == "server" else wire.SERVER_SENDS | {"REPLICATE"}
        )
        # Encoded lines waiting to be written, as blobs of one or more whole lines; ``_queued``
        # counts the lines (the bound is in commands, as in the reference).
        self._queue: deque[tuple[bytes, int]] = deque()
        self._queued = 0
        self._ready = asyncio.Event()
        self._closed = asyncio.Event()
        self._last_sent = time.monotonic()
        self._last_received = time.monotonic()
        self._received_ping = False
        self._paused = False
        self._opened = time.monotonic()
        self.close_reason: str | None = None
        #: The peer's PINGs said it reads POSITION stamps (a factstream process; see :data:`STAMPS`).
        self.reads_stamps = False
        #: Whether the counters of :attr:`stats` are kept (``metrics.enabled``).
        self.counting = settings.counting
        #: Called once the server knows which instance the peer is (its NAME, or its proof).
        self.on_named: Callable[[TcpConnection], None] | None = None
        #: This link's counters (the server or client that opened it replaces them with its own).
        self.stats = LinkStats(peer=self.name, transport="tcp", direction="inbound" if side == "server" else "outbound")

    @property
    def closed(self) -> bool:
        return self._closed.is_set()

    def send(self, command: wire.Command) -> None:
        """Queue a command; a full queue means the peer cannot keep up: disconnect it."""
        if not self.closed:
            line = wire.encode_line(command)
            self.send_line(line if self.reads_stamps else unstamped_line(command, line))

    def send_line(self, line: bytes) -> None:
        """Queue an encoded line (``send`` for many connections encodes once, then calls this)."""
        self.send_blob(line, 1)

    def send_lines(self, lines: list[bytes]) -> None:
        """Queue several encoded lines; each counts against the queue bound."""
        self.send_blob(b"".join(lines), len(lines))

    def send_blob(self, blob: bytes, lines: int) -> None:
        """Queue ``lines`` whole encoded lines joined into one blob (shared by every connection)."""
        if self.closed:
            return
        if self.counting:
            stats = self.stats
            stats.commands_sent += lines
            stats.bytes_sent += len(blob)
        if not self._queue and self.may_send and self.writer.transport.get_write_buffer_size() < WRITE_CHUNK:
            # Nothing waits and the socket keeps up: write now (one syscall, no task switch).
            self.writer.write(blob)
            self._last_sent = time.monotonic()
            return
        if self._queued + lines > self.max_queue:
            self._overflow()
            return
        self._queue.append((blob, lines))
        self._queued += lines
        self._ready.set()

    def _write_now(self, blob: bytes) -> None:
        """Write ahead of the queue: the greeting and the handshake, which precede everything else."""
        if not self.closed:
            self.writer.write(blob)
            self._last_sent = time.monotonic()

    def greet(self) -> None:
        """The server's greeting: ``SERVER``, the challenge when a secret is set, and a ``PING``."""
        lines = [wire.encode_line(wire.ServerCommand(self.server_name))]
        if self.secret is not None:
            lines.append(self.secret.challenge_line(self._nonce))
        lines.append(wire.encode_line(ping()))
        self._write_now(b"".join(lines))

    def _overflow(self) -> None:
        log.warning("replication peer %s cannot keep up (%d commands queued): disconnecting", self.name, self._queued)
        self._queue.clear()
        self._queued = 0
        self.close("Failed to keep up")

    def close(self, error: str | None = None) -> None:
        """Close, sending ``ERROR <error>`` first (unqueued) if given."""
        if self.closed:
            return
        self.close_reason = error
        if error is not None:
            with contextlib.suppress(Exception):
                self.writer.write(wire.encode_line(wire.ErrorCommand(error)))
                if self.writer.can_write_eof():
                    self.writer.write_eof()
        self._closed.set()
        self._ready.set()

    async def run(self) -> None:
        """Serve the connection until it closes."""
        tasks = [
            asyncio.create_task(self._read_loop()),
            asyncio.create_task(self._write_loop()),
            asyncio.create_task(self._ping_loop()),
        ]
        try:
            await self._closed.wait()
        finally:
            for task in tasks:
                task.cancel()
            for task in tasks:
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
            if self.close_reason is not None:
                # Lingering close: closing with unread input makes the kernel send a reset, which
                # destroys the ERROR line before the peer reads it. Discard input briefly first.
                with contextlib.suppress(Exception):
                    async with asyncio.timeout(1.0):
                        while await self.reader.read(65536):
                            pass
            with contextlib.suppress(Exception):
                self.writer.close()
                # bounded: a transport closes once its buffer is flushed, which a peer that stopped
                # reading never lets happen; after that the connection is dropped
                async with asyncio.timeout(CLOSE_TIMEOUT):
                    await self.writer.wait_closed()
            if not self.writer.transport.is_closing() or self.writer.transport.get_write_buffer_size():
                self.writer.transport.abort()

    async def _read_loop(self) -> None:
        # Lines are split out of large reads here rather than read one ``readuntil`` at a time: a
        # reader receiving tens of thousands of RDATA lines a second spends its time on the lines,
        # not on the stream machinery.
        partial = b""
        try:
            while not self.closed:
                data = await self.reader.read(READ_CHUNK)
                if not data:
                    self.close()
                    return
                self._last_received = time.monotonic()
                lines = (partial + data).split(b"\n") if partial else data.split(b"\n")
                partial = lines.pop()
                if self.counting:
                    stats = self.stats
                    stats.bytes_received += len(data)
                    stats.commands_received += len(lines)
                if len(partial) > self.max_line:
                    self.close("Line length exceeded")
                    return
                if not await self._receive_lines(lines):
                    return
                if self.capacity is not None and not self.capacity.has_capacity():
                    self._paused = True
                    try:
                        await self.capacity.wait_for_capacity()  # stop reading while this process is behind
                    finally:
                        self._paused = False
                        # Time spent not reading is not silence from the peer.
                        self._last_received = time.monotonic()
        except (ConnectionError, OSError):
            self.close()

    async def _receive_lines(self, lines: list[bytes]) -> bool:
        """Receive a chunk's lines in order; False once the connection has been closed.

        Runs of RDATA lines for one stream and writer skip the per-line parse (see
        :func:`~factstream.replication.wire.runs.split_runs`): their rows are validated as JSON in one
        call and handed over as one :class:`RdataRun`. Before the peer is trusted every line is
        handled alone (the handshake comes first). A POSITION that needs checking against the
        database holds up the lines after it until the check is done.
        """
        items = split_runs(lines, self.max_line) if self.dispatch_run is not None and self.trusted else lines
        for item in items:
            if isinstance(item, bytes):
                result = self._receive_line(item)
                if result is True:
                    continue
                if result is False or not await self._vet_position(result):
                    return False
                continue
            assert self.dispatch_run is not None
            if self.counting:
                self.stats.rows_received += len(item.tokens)
            try:
                self.dispatch_run(self, item)
            except ProtocolError as exc:
                self.close(str(exc))
                return False
        return True

    def _receive_line(self, line: bytes) -> bool | wire.PositionCommand:
        """Parse and dispatch one line; False once the connection has been closed because of it, or
        the POSITION it holds if that must be checked first (see :meth:`_vet_position`)."""
        if len(line) > self.max_line:
            self.close("Line length exceeded")
            return False
        if not line.strip():
            return True
        if not self.trusted:
            return self._receive_untrusted(line)
        try:
            cmd = wire.parse_command(line)
        except wire.CommandParseError as exc:
            if line.startswith(CHALLENGE + b" "):
                log.error(
                    "replication server %s asks for replication.secret, which is not set here: set the same "
                    "secret on every instance",
                    self.name,
                )
                self.close("replication.secret is not set on this instance")
            else:
                self.close(f"failed to parse line: {exc}")
            return False
        if cmd.NAME not in self.inbound:
            self.close(f"invalid command: {cmd.NAME}")
            return False
        kind = type(cmd)
        if kind is wire.PositionCommand:
            position = cast(wire.PositionCommand, cmd)
            if self.vetter is not None and not self.vetter.position_known(self, position):
                return position
        elif kind is wire.RdataCommand:
            if self.counting:
                self.stats.rows_received += 1
        elif not self._protocol_command(cmd):
            return False
        return self._dispatch(cmd)

    def _dispatch(self, cmd: wire.Command) -> bool:
        try:
            self.dispatch(self, cmd)
        except ProtocolError as exc:
            self.close(str(exc))
            return False
        return True

    async def _vet_position(self, cmd: wire.PositionCommand) -> bool:
        """Check a POSITION beyond what this process knows to be allocated before dispatching it."""
        assert self.vetter is not None
        reason = await self.vetter.check_position(self, cmd)
        if self.closed:
            return False
        if reason is None:
            return self._dispatch(cmd)
        if self.relays:
            # The hub checked it too: a configuration that differs between instances, not a reason
            # to drop the link that carries every other writer's rows.
            log.warning("dropping a POSITION relayed by %s: %s", self.name, reason)
            return True
        log.warning("refusing replication peer %s: %s", self.name, reason)
        self.close(reason)
        return False

    def _receive_untrusted(self, line: bytes) -> bool:
        """A line before the peer proved that it knows the secret: the handshake, or the end of the link."""
        secret = self.secret
        assert secret is not None
        try:
            if self.side == "server":
                if not line.startswith(AUTH + b" "):
                    raise AuthError("authentication required: replication.secret is set, send FS_AUTH first")
                instance, client_nonce = secret.check_client(line, self._nonce)
                if instance == self.local_name:
                    raise AuthError(f"{instance!r} is this process's own instance name")
                self.peer = self.name = instance
                if self.on_named is not None:
                    self.on_named(self)
                self.trusted = self.may_send = True
                self._write_now(secret.accept_line(self._nonce, client_nonce, self.local_name))
                self._ready.set()
                return True
            if line.startswith(CHALLENGE + b" ") and self._server_nonce is None:
                self._server_nonce, auth = secret.answer_challenge(line, self._nonce, self.local_name)
                self._write_now(auth)
                self.may_send = True
                self._ready.set()  # what was queued meanwhile (NAME, REPLICATE ...) goes out after the proof
                return True
            if line.startswith(AUTH_OK + b" ") and self._server_nonce is not None:
                secret.check_server(line, self._server_nonce, self._nonce)
                self.trusted = True
                return True
        except AuthError as exc:
            log.warning("replication peer %s: %s", self.name, exc)
            self.close(str(exc))
            return False
        # A client waiting for the server's proof accepts only the greeting, pings and errors.
        try:
            cmd = wire.parse_command(line)
        except wire.CommandParseError as exc:
            self.close(f"failed to parse line: {exc}")
            return False
        kind = type(cmd)
        if kind is wire.ServerCommand or kind is wire.ErrorCommand or (kind is wire.PingCommand and self._server_nonce):
            return self._protocol_command(cmd)
        if self._server_nonce is None:
            log.error(
                "replication server %s does not ask for replication.secret, which is set here: refusing it "
                "(set the same secret on every instance)",
                self.name,
            )
            self.close("replication.secret is set on this instance but the server did not ask for it")
        else:
            self.close(f"{cmd.NAME} before the server proved that it knows replication.secret")
        return False

    def _protocol_command(self, cmd: wire.Command) -> bool:
        """Handle the commands that belong to the link itself; False if the link was closed."""
        if isinstance(cmd, wire.PingCommand):
            self._received_ping = True
            if cmd.data.endswith(STAMPS):
                self.reads_stamps = True
        elif isinstance(cmd, wire.NameCommand):
            if self.side == "server":
                if cmd.name == self.local_name:
                    self.close(f"NAME {cmd.name}: that is this process's own instance name")
                    return False
                if self.peer is not None and cmd.name != self.peer:
                    self.close(f"NAME {cmd.name}: this connection speaks for {self.peer}")
                    return False
                if self.peer is None:  # with a secret, it was named by its proof
                    self.peer = self.name = cmd.name
                    if self.on_named is not None:
                        self.on_named(self)
            self.name = cmd.name
        elif isinstance(cmd, wire.ErrorCommand):
            log.warning("replication peer %s reported an error: %s", self.name, cmd.message)
        elif isinstance(cmd, wire.ServerCommand) and cmd.server_name != self.server_name:
            self.close("Wrong remote")
            return False
        return True

    async def _write_loop(self) -> None:
        try:
            while not self.closed:
                await self._ready.wait()
                self._ready.clear()
                while self._queue and self.may_send and not self.closed:
                    size = 0
                    while self._queue and size < WRITE_CHUNK:
                        blob, lines = self._queue.popleft()
                        self._queued -= lines
                        self.writer.write(blob)
                        size += len(blob)
                    self._last_sent = time.monotonic()
                    await self.writer.drain()
        except (ConnectionError, OSError):
            self.close()

    async def _ping_loop(self) -> None:
        while not self.closed:
            await asyncio.sleep(self.ping_interval)
            now = time.monotonic()
            if not self.trusted and now - self._opened > AUTH_TIMEOUT:
                self.close("authentication timeout")
                return
            if self._received_ping and not self._paused and now - self._last_received > self.ping_timeout:
                self.close("ping timeout")
                return
            if now - self._last_sent >= self.ping_interval:
                self.send(ping())
