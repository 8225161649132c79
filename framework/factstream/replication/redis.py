"""Redis pub/sub transport: every instance publishes to and subscribes to one channel.

Two connections per process, as in the reference: one publishing, one subscribed (a subscribed
connection cannot publish). On every (re)connection the subscriber first SUBSCRIBEs, and only then
does the process publish ``REPLICATE`` and announce its own positions: peers cannot see that we
connected, and a POSITION published before our subscription would be lost (the reference fixed this
ordering after losing positions). Each connection counts as a new link for the handler, so nothing
is accepted on it before a POSITION, whose catch-up reads any gap from the database.

Everything published comes back to us: our own RDATA and POSITION are recognised by their prefix and
dropped before parsing. Lines that do not parse are logged and skipped (there is no peer to answer).
Publishes go out in order from one task, pipelined in batches, so the streamer never waits on Redis;
the same task counts the channel's subscribers (``PUBSUB NUMSUB``) once a second, which also checks
the publishing connection. The subscribed connection sends ``PING`` after a quiet while and is
dropped if even that gets no answer.

Beyond the reference, RDATA lines may travel several to a message (``packing``): every factstream
process announces ``FS_MULTILINE <instance>`` on subscribing and again on every ``REPLICATE`` it
sees, and a writer packs only while the subscriber count (taken after the last ``REPLICATE``) is
covered by those announcements. Any ``REPLICATE`` turns packing off at once, before the writer
answers it, so a reference peer (which subscribes, then publishes ``REPLICATE``, and never announces)
receives one command per message from its first ``POSITION`` on; what it got before that it drops
anyway, and catches up from the database. Whenever packing stops, every stream's ``POSITION t t``
goes out first, for a subscriber that processed some earlier POSITION and then could not read packed
rows. Received messages are split into lines either way.

With ``replication.secret`` set, every message published is signed with this instance's name and
every message received must carry a valid signature (:meth:`ReplicationSecret.sign`); others are
dropped, counted and logged before they are parsed, and so is every RDATA or POSITION line of a
signed message that is not under its signer's name (decision 17). Reads made only of own echoes are
recognised by their prefix first, unchecked.

Both connections speak RESP directly (:mod:`factstream.replication.resp`). Lines are published as
they are sent, written straight to the socket, with the replies counted as they come back; a
pipeline not yet answered when the connection breaks is published again after reconnecting (a
reader drops what it has seen). Received messages are handled in the event loop's read callback, a
socket read at a time: consecutive RDATA lines of one stream and writer go to the handler as one run,
as over TCP.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
from collections import deque
from collections.abc import Callable, Mapping
from itertools import compress
from operator import itemgetter, methodcaller, not_
from typing import Any, Protocol

from factstream.config import Settings
from factstream.replication import wire
from factstream.replication.auth import ReplicationSecret
from factstream.replication.resp import RedisAddress, RespClient, RespError
from factstream.replication.wire import ProtocolError, RdataRun, split_runs, uniform_run

log = logging.getLogger(__name__)

HEALTH_CHECK_SECONDS = 5
MAX_BACKOFF = 5.0
PEER_CHECK_SECONDS = 1.0
#: Bytes waiting in the publishing socket's buffer beyond which new messages queue instead.
WRITE_BUFFER_LIMIT = 1024 * 1024
#: Messages waiting while Redis is unreachable before they are dropped. From then on everything is
#: dropped until publishing works again, and then the streamer's positions go out before anything
#: else, so readers see the gap and catch up from the database (see ``on_gap``).
MAX_OUTBOX = 100_000


_data = itemgetter(2)

#: Beyond the reference: the line by which a factstream process says "I read Redis messages that hold
#: several lines". A writer packs its RDATA lines into few messages only while every other
#: subscriber of the channel has said so (see ``RedisTransport`` and docs/decisions.md); reference
#: peers never send it, and only log it if they receive it.
MULTILINE = b"FS_MULTILINE "
#: Lines per packed message at most.
PACKED_LINES = 1_000
#: After a REPLICATE, how soon the subscribers are counted again (so packing resumes quickly).
RECOUNT_SECONDS = 0.1


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

    def __init__(self, transport: RedisTransport, generation: int) -> None:
        self.transport = transport
        self.name = f"redis#{generation}"

    def send(self, command: wire.Command) -> None:
        self.transport.send(command)


class RedisTransport:
    """Replication over one Redis pub/sub channel named after the deployment."""

    def __init__(self, settings: Settings, handler: Reader) -> None:
        assert settings.redis.url
        self.url = settings.redis.url
        self.address = RedisAddress.from_url(settings.redis.url)
        self.channel = settings.deployment
        self._channel = self.channel.encode("utf-8")
        self.handler = handler
        self.max_line = settings.replication.max_line
        self.on_connected: Callable[[], None] | None = None
        #: Called once publishing works again after commands were dropped: it must publish, before
        #: anything else, a POSITION for every stream this process writes (the streamer's mark_gap).
        self.on_gap: Callable[[], None] | None = None
        self.link: RedisLink | None = None
        self._generation = 0
        self._publisher: RespClient | None = None
        #: ``(channel, messages, commands in them)`` not yet written (no connection, or a full socket), in order.
        self._outbox: deque[tuple[bytes, list[bytes], int]] = deque()
        self._waiting = 0
        self._outbox_ready = asyncio.Event()
        self._gap = False  # commands were dropped: drop everything until publishing works again
        self._tasks: list[asyncio.Task[None]] = []
        self._resuming: asyncio.Task[None] | None = None
        self.connected = asyncio.Event()
        self.published = 0
        self._peers = True
        #: Whether RDATA lines go out packed, several to a message: only while every other subscriber
        #: announced that it reads them (``MULTILINE``), counted after the last ``REPLICATE``.
        self.packing = False
        self._multiline: set[bytes] = set()
        #: Bumped by every ``REPLICATE`` (someone subscribed): a subscriber count asked for before it
        #: may not include the newcomer, so it cannot turn packing on.
        self._replicate_epoch = 0
        #: When the publishing task counts the subscribers early (after a REPLICATE), if it will.
        self._recount_at: float | None = None
        self._me = settings.instance_name.encode("utf-8")
        self._announcement = MULTILINE + self._me
        self._may_pack = settings.replication.redis_packing
        self._secret = ReplicationSecret.from_settings(settings)
        #: Messages (or lines of signed messages) dropped: unsigned, wrongly signed, or not the signer's.
        self.unsigned = 0
        self._unsigned_logged = -60.0
        #: Per signer, the line prefixes under its own name (``RDATA <stream> <signer> ``, ...).
        self._signer_prefixes: dict[bytes, tuple[bytes, ...]] = {}
        # Our own RDATA and POSITION come back to us: recognised by prefix, before any parsing.
        self._own = self._prefixes_of(self._me)

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._tasks = [
            loop.create_task(self._subscribe_loop(), name="repl-redis-sub"),
            loop.create_task(self._publish_loop(), name="repl-redis-pub"),
        ]

    # -- publishing ----------------------------------------------------------------------------------

    def send(self, command: wire.Command) -> None:
        self._publish(command.redis_channel(self.channel).encode("utf-8"), [wire.encode_line(command)[:-1]])

    #: How the streamer ends the lines it hands to :meth:`send_lines`: not at all (a message is a line).
    line_end = b""

    def send_lines(self, lines: list[bytes]) -> None:
        # RDATA lines: one message per command as the reference publishes them, unless every
        # subscriber reads packed messages.
        if self.packing and len(lines) > 1:
            self._publish(
                self._channel,
                [b"\n".join(lines[i : i + PACKED_LINES]) for i in range(0, len(lines), PACKED_LINES)],
                len(lines),
            )
        else:
            self._publish(self._channel, lines)

    def _publish(self, channel: bytes, messages: list[bytes], commands: int | None = None) -> None:
        """Publish ``messages`` in order; ``commands`` is how many commands they hold (default: one each)."""
        if self._gap:
            return  # nothing may go out before the positions that make readers catch up
        if self._secret is not None:
            sign, me = self._secret.sign, self._me
            messages = [sign(message, me) for message in messages]
        publisher = self._publisher
        if (
            not self._outbox
            and publisher is not None
            and publisher.lost is None
            and publisher.write_buffer_size() < WRITE_BUFFER_LIMIT
        ):
            publisher.publish([(channel, messages)])  # written now; replies are counted as they come
            self.published += len(messages)
            return
        count = len(messages) if commands is None else commands
        if self._waiting + count > MAX_OUTBOX:
            log.warning(
                "Redis unreachable: dropping %d unpublished commands (readers will catch up from the database)",
                self._waiting + count,
            )
            self._outbox.clear()
            self._waiting = 0
            self._gap = True
            return
        self._outbox.append((channel, messages, count))
        self._waiting += count
        self._outbox_ready.set()

    def has_peers(self) -> bool:
        """Whether anyone else is subscribed; with nobody listening the streamer skips its work.

        Safe to be briefly wrong: a newcomer subscribes and then publishes ``REPLICATE``, which
        sets the flag at once and is answered with positions, from which it catches up.
        """
        return self.link is not None and self._peers

    async def _publish_loop(self) -> None:
        """Keep the publishing connection up, drain what queued, count the subscribers every second."""
        loop = asyncio.get_running_loop()
        delay = 0.1
        while True:
            publisher = self._publisher
            try:
                if publisher is None or publisher.lost is not None:
                    resend = publisher.unacknowledged_batches() if publisher is not None else []
                    self._publisher = None
                    publisher = await RespClient.open(self.address)
                    if resend:
                        publisher.publish(resend)  # not answered before the break: again (readers drop repeats)
                    self._publisher = publisher
                    delay = 0.1
                    if self._gap:
                        self._gap = False
                        if self.on_gap is not None:
                            self.on_gap()  # positions first: readers catch up what was dropped
                checked = loop.time()
                self._recount_at = None
                subscribed = self.link is not None  # then one of the subscribers is us
                epoch = self._replicate_epoch
                reply = await publisher.command("PUBSUB", "NUMSUB", self._channel)
                count = int(reply[1])
                self._peers = count > (1 if subscribed else 0)
                # Packed messages only if every other subscriber reads them. A subscriber that never
                # announced (a reference peer, a monitoring client) keeps them off; a newcomer's
                # REPLICATE turns them off until a count taken after it confirms.
                if (
                    self._may_pack
                    and subscribed
                    and self.link is not None
                    and epoch == self._replicate_epoch
                    and count - 1 <= len(self._multiline)
                ):
                    self.packing = True
                else:
                    self._stop_packing()
                while publisher.lost is None:
                    outbox = self._outbox
                    while outbox and publisher.write_buffer_size() < WRITE_BUFFER_LIMIT:
                        channel, messages, count = outbox.popleft()
                        self._waiting -= count
                        publisher.publish([(channel, messages)])
                        self.published += len(messages)
                    if outbox:
                        await publisher.writable.wait()
                        continue
                    self._outbox_ready.clear()
                    # A REPLICATE asks for an early count: its sender and the peers' announcements
                    # answering it are on the channel within milliseconds.
                    due = checked + PEER_CHECK_SECONDS
                    if self._recount_at is not None:
                        due = min(due, self._recount_at)
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(max(0.0, due - loop.time())):
                            await self._outbox_ready.wait()
                    if loop.time() >= due:
                        break  # time to count the subscribers again (which also checks the connection)
            except asyncio.CancelledError:
                raise
            except (RespError, OSError, ValueError, IndexError, TypeError) as exc:
                # Not lost for readers: republished after reconnecting (and they catch up from the database).
                self._peers = True  # unknown: keep sending
                log.warning("cannot publish to Redis at %s (%s); retrying in %.1fs", self.address, exc, delay)
                if publisher is not None:
                    publisher.close()
                await asyncio.sleep(delay)
                delay = min(delay * 2, MAX_BACKOFF)

    # -- subscribing ---------------------------------------------------------------------------------

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
                log.warning("Redis subscription lost (%s); reconnecting in %.1fs", exc, delay)
            finally:
                self.connected.clear()
                self._stop_packing()  # whoever subscribes meanwhile has not been counted
                if link is not None:
                    self.handler.lost_connection(link)
                    if self.link is link:
                        self.link = None
                if client is not None:
                    client.close()
            await asyncio.sleep(delay)
            delay = min(delay * 2, MAX_BACKOFF)

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
                self._dispatch_run(link, run)
                return
        if signer is not None:
            datas = self._signers_lines(datas, signer)
        echoes = list(map(methodcaller("startswith", own), datas))
        lines = list(compress(datas, map(not_, echoes))) if any(echoes) else datas
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
        try:
            self.handler.on_rdata_run(link, run)
        except ProtocolError as exc:
            log.warning("ignoring RDATA from %s: %s", run.instance_name, exc)

    def _forget_multiline(self) -> None:
        """Someone (re)subscribed: stop packing, count again who reads packed messages, and announce
        that we do (for the count that may turn packing back on)."""
        self._stop_packing()
        self._multiline.clear()
        self._replicate_epoch += 1
        if self._recount_at is None:
            self._recount_at = asyncio.get_running_loop().time() + RECOUNT_SECONDS
            self._outbox_ready.set()  # wakes the publishing task, which then waits for the recount
        self._publish(self._channel, [self._announcement])

    def _stop_packing(self) -> None:
        """Publish one command per message from now on.

        A subscriber we had not counted may have received packed messages it could not read, after
        a POSITION it did process (one not sent for its REPLICATE, which had not reached us yet). So
        every stream's ``POSITION t t`` goes out first (``on_gap``), ``t`` the last token sent: such
        a reader is behind ``t`` and catches up from the database before any later row.
        """
        if self.packing:
            self.packing = False
            if self.on_gap is not None:
                self.on_gap()

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
        if type(cmd) is wire.ReplicateCommand:
            self._peers = True  # someone (re)subscribed: answer them, and keep sending
            self._forget_multiline()
        try:
            self.handler.on_command(link, cmd)
        except ProtocolError as exc:
            log.warning("ignoring %s: %s", cmd.NAME, exc)

    async def close(self) -> None:
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        if self._resuming is not None:
            self._resuming.cancel()
        if self._publisher is not None:
            self._publisher.close()
