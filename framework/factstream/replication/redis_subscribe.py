"""The subscribing side of the Redis transport: :class:`RedisSubscriber`, and :class:`RedisLink`.

It keeps the subscribed connection up (``SUBSCRIBE`` first on every connection, then ``REPLICATE``;
a ``PING`` after a quiet while), pauses reading while the handler is behind, and turns each socket
read into lines for the handler: its own echoes dropped by prefix, runs of one writer's RDATA handed
over as one run, ``FS_MULTILINE`` announcements recorded. With ``replication.secret`` it also checks
what it receives: messages without a valid signature, and RDATA or POSITION lines not under their
signer's name, are dropped, counted and logged.

:class:`~factstream.replication.redis.RedisTransport` builds on this class and adds the publishing
side; :mod:`factstream.replication.redis` describes the transport as a whole. What the subscribing
side needs of the publishing side is declared on :class:`RedisSubscriber`.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections.abc import Callable, Mapping
from itertools import compress
from operator import itemgetter, methodcaller, not_
from typing import TYPE_CHECKING, Any, Protocol

from factstream.config import Settings
from factstream.replication import wire
from factstream.replication.auth import ReplicationSecret
from factstream.replication.links import LinkStats, Reconnects, metrics_enabled, positions_text
from factstream.replication.resp import RedisAddress, RespClient, RespError
from factstream.replication.wire import ProtocolError, RdataRun, split_runs, uniform_run

# Logs under the transport's name, as before this module was split from it.
log = logging.getLogger("factstream.replication.redis")

HEALTH_CHECK_SECONDS = 5
MAX_BACKOFF = 5.0

_data = itemgetter(2)

#: Beyond the reference: the line by which a factstream process says "I read Redis messages that hold
#: several lines". A writer packs its RDATA lines into few messages only while every other
#: subscriber of the channel has said so (see ``RedisTransport`` and docs/decisions.md); reference
#: peers never send it, and only log it if they receive it.
MULTILINE = b"FS_MULTILINE "


class Reader(Protocol):
    """What this transport needs of the reader it delivers to.

    :class:`~factstream.replication.handler.ReplicationHandler` implements it; the transport depends on
    the codec (:mod:`factstream.replication.wire`), not on the reader.
    """

    @property
    def streams(self) -> Mapping[str, object]:
        """The streams this process knows, by name."""

    def new_connection(self, conn: RedisLink) -> None: ...

    def lost_connection(self, conn: RedisLink) -> None: ...

    def has_capacity(self) -> bool: ...

    async def wait_for_capacity(self) -> None: ...

    def on_command(self, conn: RedisLink, cmd: wire.Command) -> None: ...

    def on_rdata_run(self, conn: RedisLink, run: RdataRun) -> None: ...


class RedisLink:
    """The handler's view of one subscription (a new object after each reconnection).

    A channel carries every instance's commands: the handler checks each against its sender's name.
    """

    peer: str | None = None
    relays = True

    def __init__(self, transport: RedisSubscriber, generation: int) -> None:
        self.transport = transport
        self.name = f"redis#{generation}"

    def send(self, command: wire.Command) -> None:
        self.transport.send(command)


class RedisSubscriber:
    """The subscription to the channel, and what arrives on it (see the module docstring)."""

    #: Whether anyone else is subscribed (kept by the publishing side; a ``REPLICATE`` sets it).
    _peers: bool

    if TYPE_CHECKING:
        # The publishing side's, which :class:`~factstream.replication.redis.RedisTransport` adds.

        def send(self, command: wire.Command) -> None: ...

        def _forget_multiline(self) -> None: ...

        def _stop_packing(self) -> None: ...

    def __init__(self, settings: Settings, handler: Reader) -> None:
        assert settings.redis.url
        self.url = settings.redis.url
        self.address = RedisAddress.from_url(settings.redis.url)
        self.channel = settings.deployment
        self._channel = self.channel.encode("utf-8")
        self.handler = handler
        self.max_line = settings.replication.max_line
        self.on_connected: Callable[[], None] | None = None
        self.link: RedisLink | None = None
        self._generation = 0
        self._resuming: asyncio.Task[None] | None = None
        self.connected = asyncio.Event()
        #: Who announced that they read packed messages (``MULTILINE``) since the last ``REPLICATE``.
        self._multiline: set[bytes] = set()
        self._me = settings.instance_name.encode("utf-8")
        self._announcement = MULTILINE + self._me
        self._secret = ReplicationSecret.from_settings(settings)
        address = self.address
        where = (
            f"unix://{address.path}"
            if address.path
            else f"{'rediss' if address.tls else 'redis'}://{address.host}:{address.port}"
        )
        #: The one link (the connection pair), up while subscribed; its peer names the server, no password.
        self.stats = LinkStats(peer=f"{where}/{address.db}", transport="redis", direction="outbound")
        #: Whether the counters of :attr:`stats` are kept (``metrics.enabled``).
        self.counting = metrics_enabled(settings)
        self.instance_name = settings.instance_name
        self._reconnects = Reconnects(log, self.stats.peer)
        #: Whether POSITIONs go out with the writer's clock stamp: only while every other subscriber
        #: announced that it is a factstream process (``FS_MULTILINE``), as for packing.
        self.stamping = False
        #: Messages (or lines of signed messages) dropped: unsigned, wrongly signed, or not the signer's.
        self.unsigned = 0
        self._unsigned_logged = -60.0
        #: Per signer, the line prefixes under its own name (``RDATA <stream> <signer> ``, ...).
        self._signer_prefixes: dict[bytes, tuple[bytes, ...]] = {}
        # Our own RDATA and POSITION come back to us: recognised by prefix, before any parsing.
        self._own = self._prefixes_of(self._me)

    async def _subscribe_loop(self) -> None:
        delay = 0.1
        loop = asyncio.get_running_loop()
        while True:
            client: RespClient | None = None
            link: RedisLink | None = None
            try:
                client = await RespClient.open(self.address)
                lost = asyncio.Event()
                client.on_lost = lambda _exc, lost=lost: lost.set()
                self._generation += 1
                link = RedisLink(self, self._generation)
                # Known to the handler before the first message can arrive; nothing on it is accepted
                # before a POSITION, whose catch-up reads any gap from the database.
                self.handler.new_connection(link)
                await client.subscribe(self._channel, functools.partial(self._receive, client, link))
                self.link = link
                self.stats.connected()
                fields: dict[str, object] = {"peer": self.stats.peer, "positions": self._positions_text()}
                failed = self._reconnects.succeeded()
                if failed:
                    fields["failed_attempts"] = failed
                log.info("replication link up", extra={"fields": fields})
                self._forget_multiline()  # and announce ourselves, before REPLICATE: peers re-announce on it
                self.send(wire.ReplicateCommand())
                if self.on_connected is not None:
                    self.on_connected()
                self.connected.set()
                delay = 0.1
                pinged: float | None = None  # when we sent a PING that is not answered yet
                while not lost.is_set():
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(HEALTH_CHECK_SECONDS):
                            await lost.wait()
                    if pinged is not None and client.last_received < pinged and self._resuming is None:
                        raise RespError(f"Redis at {self.address} did not answer a PING")
                    pinged = None
                    if loop.time() - client.last_received >= HEALTH_CHECK_SECONDS and self._resuming is None:
                        client.ping()  # detects a dead link while the channel is quiet
                        pinged = loop.time()
                if client.lost is not None:
                    raise client.lost
            except asyncio.CancelledError:
                raise
            except (RespError, OSError) as exc:
                if self.link is link and link is not None:
                    fields = {"peer": self.stats.peer, "reason": str(exc), "retry_in": round(delay, 1)}
                    log.info("replication link down", extra={"fields": fields})
                else:
                    self._reconnects.failed(exc, delay)
            finally:
                self.connected.clear()
                self.stats.disconnected()
                self.stamping = False
                self._stop_packing()  # whoever subscribes meanwhile has not been counted
                if link is not None:
                    self.handler.lost_connection(link)
                    if self.link is link:
                        self.link = None
                if client is not None:
                    client.close()
            await asyncio.sleep(delay)
            delay = min(delay * 2, MAX_BACKOFF)

    def links(self) -> list[LinkStats]:
        return [self.stats]

    def _positions_text(self) -> str:
        positions = getattr(self.handler, "positions", None)
        return positions_text(positions()) if positions is not None else ""

    def _receive(self, client: RespClient, link: RedisLink, replies: list[Any]) -> None:
        """Handle one read's messages, in order: own echoes dropped, RDATA in runs."""
        try:
            self._dispatch(link, replies)
        except Exception:
            log.exception("failed to handle replication messages from Redis")
        if not self.handler.has_capacity() and self._resuming is None:
            client.pause_reading()  # Redis disconnects us if we lag too far: then we catch up
            self._resuming = asyncio.get_running_loop().create_task(self._resume(client))

    async def _resume(self, client: RespClient) -> None:
        try:
            await self.handler.wait_for_capacity()
        finally:
            self._resuming = None
            client.resume_reading()

    def _dispatch(self, link: RedisLink, replies: list[Any]) -> None:
        own = self._own
        datas: list[bytes] = list(map(_data, replies))
        counting = self.counting
        if counting:
            self.stats.bytes_received += sum(map(len, datas))
        if datas[0].startswith(own) and all(map(methodcaller("startswith", own), datas)):
            return  # a writer mostly receives its own echoes (a packed one holds only its own RDATA)
        #: With a secret: the one instance that signed every message of this read, whose lines are
        #: not yet checked to be under its name (a read of several signers' is checked line by line).
        signer: bytes | None = None
        if self._secret is not None:
            datas, signer = self._opened(datas)  # and split into lines
            if not datas:
                return
        else:
            joined = b"\n".join(datas)
            if joined.count(b"\n") != len(datas) - 1:
                datas = joined.split(b"\n")  # packed messages: a line each
        if len(datas) > 1 and not datas[0].startswith(own):
            # A reader mostly receives runs of another writer's RDATA: one run, recognised at once
            # (a run is one writer's, and its first line is not ours). Signed by that writer, it
            # needs no other check.
            run = uniform_run(datas, self.max_line)
            if run is not None and (signer is None or run.instance_name.encode("utf-8") == signer):
                if counting:
                    self.stats.commands_received += len(datas)
                self._dispatch_run(link, run)
                return
        if signer is not None:
            datas = self._signers_lines(datas, signer)
        echoes = list(map(methodcaller("startswith", own), datas))
        lines = list(compress(datas, map(not_, echoes))) if any(echoes) else datas
        if counting:
            self.stats.commands_received += len(lines)
        for item in split_runs(lines, self.max_line):
            if isinstance(item, bytes):
                self._handle(link, item)
                continue
            self._dispatch_run(link, item)

    def _opened(self, messages: list[bytes]) -> tuple[list[bytes], bytes | None]:
        """The lines of the messages signed with the secret (the others are dropped, counted and
        logged), and the signer if one signed them all: its lines are left for the caller to check
        (a run of its RDATA needs no other check); a read of several signers' is checked here."""
        assert self._secret is not None
        open_message = self._secret.open
        groups: list[tuple[bytes, list[bytes]]] = []
        for message in messages:
            opened = open_message(message)
            if opened is None:
                self._drop_unsigned(message, "without a valid signature")
                continue
            groups.append((opened[0], opened[1].split(b"\n")))
        if not groups:
            return [], None
        first = groups[0][0]
        if all(signer == first for signer, _ in groups):
            return [line for _, parts in groups for line in parts], first
        return [line for signer, parts in groups for line in self._signers_lines(parts, signer)], None

    def _signers_lines(self, lines: list[bytes], signer: bytes) -> list[bytes]:
        """``lines`` without the RDATA and POSITION lines that are not under ``signer``'s name (dropped)."""
        prefixes = self._signer_prefixes.get(signer) or self._prefixes_of(signer)
        if all(map(methodcaller("startswith", prefixes), lines)):
            return lines  # every line is the signer's RDATA or POSITION
        kept = []
        for line in lines:
            if line.startswith(prefixes) or not line.startswith((b"RDATA ", b"POSITION ")):
                kept.append(line)
            elif line.split(b" ", 3)[2:3] == [signer]:
                kept.append(line)  # a stream this process does not know: the handler says so
            else:
                self._drop_unsigned(line, f"signed by {signer!r} under another instance's name")
        return kept

    def _prefixes_of(self, signer: bytes) -> tuple[bytes, ...]:
        """The line prefixes of ``signer``'s RDATA and POSITION on this process's streams (kept for the
        next read of that signer)."""
        prefixes = tuple(
            b"%s %s %s " % (kind, name.encode("utf-8"), signer)
            for name in self.handler.streams
            for kind in (b"RDATA", b"POSITION")
        )
        if len(self._signer_prefixes) < 1_000:  # instances are few; forged names must not grow it without bound
            self._signer_prefixes[signer] = prefixes
        return prefixes

    def _drop_unsigned(self, data: bytes, why: str) -> None:
        self.unsigned += 1
        now = asyncio.get_running_loop().time()
        if now - self._unsigned_logged >= 60.0:  # a flood stays one line a minute
            self._unsigned_logged = now
            log.warning(
                "ignoring a Redis message %s (replication.secret is set; %d dropped so far): %r",
                why,
                self.unsigned,
                data[:120],
            )

    def _dispatch_run(self, link: RedisLink, run: RdataRun) -> None:
        if self.counting:
            self.stats.rows_received += len(run.tokens)
        try:
            self.handler.on_rdata_run(link, run)
        except ProtocolError as exc:
            log.warning("ignoring RDATA from %s: %s", run.instance_name, exc)

    def _handle(self, link: RedisLink, data: bytes) -> None:
        if data.startswith(MULTILINE):
            if data != self._announcement:
                self._multiline.add(data[len(MULTILINE) :])
            return
        try:
            cmd = wire.parse_command(data)
        except wire.CommandParseError as exc:
            log.warning("ignoring a replication line that does not parse (%s): %r", exc, data[:200])
            return
        if type(cmd) is wire.RdataCommand and self.counting:
            self.stats.rows_received += 1
        if type(cmd) is wire.ReplicateCommand:
            self._peers = True  # someone (re)subscribed: answer them, and keep sending
            self._forget_multiline()
        try:
            self.handler.on_command(link, cmd)
        except ProtocolError as exc:
            log.warning("ignoring %s: %s", cmd.NAME, exc)
