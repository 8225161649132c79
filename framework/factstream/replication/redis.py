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

Both connections speak RESP directly (:mod:`factstream.replication.resp`): messages arrive in
batches, one per socket read, and consecutive RDATA lines of one stream and writer are handed to the
handler as one run, as over TCP.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import Callable
from operator import itemgetter, methodcaller
from typing import Any

from factstream.config import Settings
from factstream.replication import commands as c
from factstream.replication.handler import ProtocolError, ReplicationHandler
from factstream.replication.resp import RedisAddress, RespConnection, RespError, pack
from factstream.replication.runs import uniform_run

log = logging.getLogger(__name__)

HEALTH_CHECK_SECONDS = 5
MAX_BACKOFF = 5.0
PEER_CHECK_SECONDS = 1.0
#: Messages published per pipeline.
PUBLISH_BATCH = 1_000
#: Messages waiting while Redis is unreachable before they are dropped; readers then catch up from
#: the database, as the positions are announced again once publishing works.
MAX_OUTBOX = 100_000


_kind = itemgetter(0)
_data = itemgetter(2)
_MESSAGE = frozenset({b"message"})


class RedisLink:
    """The handler's view of one subscription (a new object after each reconnection)."""

    def __init__(self, transport: RedisTransport, generation: int) -> None:
        self.transport = transport
        self.name = f"redis#{generation}"

    def send(self, command: c.Command) -> None:
        self.transport.send(command)


class RedisTransport:
    """Replication over one Redis pub/sub channel named after the deployment."""

    def __init__(self, settings: Settings, handler: ReplicationHandler) -> None:
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
        #: ``(channel, messages)`` waiting to be published, in order; ``_waiting`` counts the messages.
        self._outbox: deque[tuple[bytes, list[bytes]]] = deque()
        self._waiting = 0
        self._outbox_ready = asyncio.Event()
        self._dropped = False
        self._tasks: list[asyncio.Task[None]] = []
        self.connected = asyncio.Event()
        self.published = 0
        self._peers = True
        # Our own RDATA and POSITION come back to us: recognised by prefix, before any parsing.
        own = settings.instance_name.encode("utf-8")
        self._own = tuple(
            b"%s %s %s " % (kind, name.encode("utf-8"), own)
            for name in handler.streams
            for kind in (b"RDATA", b"POSITION")
        )

    async def start(self) -> None:
        loop = asyncio.get_running_loop()
        self._tasks = [
            loop.create_task(self._subscribe_loop(), name="repl-redis-sub"),
            loop.create_task(self._publish_loop(), name="repl-redis-pub"),
        ]

    def send(self, command: c.Command) -> None:
        self._queue(command.redis_channel(self.channel).encode("utf-8"), [c.encode_line(command)[:-1]])

    def send_lines(self, lines: list[bytes]) -> None:
        # RDATA lines, published one message per command as the reference does.
        self._queue(self._channel, [line[:-1] for line in lines])

    def _queue(self, channel: bytes, messages: list[bytes]) -> None:
        if self._waiting + len(messages) > MAX_OUTBOX:
            log.warning("Redis unreachable: dropping %d unpublished commands", self._waiting + len(messages))
            self._outbox.clear()
            self._waiting = 0
            self._dropped = True
            return
        self._outbox.append((channel, messages))
        self._waiting += len(messages)
        self._outbox_ready.set()

    def has_peers(self) -> bool:
        """Whether anyone else is subscribed; with nobody listening the streamer skips its work.

        Safe to be briefly wrong: a newcomer subscribes and then publishes ``REPLICATE``, which
        sets the flag at once and is answered with positions, from which it catches up.
        """
        return self.link is not None and self._peers

    async def _publish_loop(self) -> None:
        loop = asyncio.get_running_loop()
        conn: RespConnection | None = None
        delay = 0.1
        checked = 0.0
        while True:
            batch: list[tuple[bytes, list[bytes]]] = []
            try:
                if conn is None:
                    conn = await RespConnection.open(self.address)
                    delay = 0.1
                    checked = 0.0
                    if self._dropped and self.on_connected is not None:
                        self._dropped = False
                        self.on_connected()  # announce positions again: readers catch up what was dropped
                if not self._outbox:
                    self._outbox_ready.clear()
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(max(0.0, checked + PEER_CHECK_SECONDS - loop.time())):
                            await self._outbox_ready.wait()
                outbox = self._outbox
                if outbox:
                    size = 0
                    while outbox and size < PUBLISH_BATCH:
                        batch.append(outbox.popleft())
                        size += len(batch[-1][1])
                    self._waiting -= size
                    await conn.publish(batch)
                    self.published += size
                    batch = []
                if loop.time() >= checked + PEER_CHECK_SECONDS:
                    checked = loop.time()
                    subscribed = self.link is not None  # then one of the subscribers is us
                    reply = await conn.command("PUBSUB", "NUMSUB", self._channel)
                    self._peers = int(reply[1]) > (1 if subscribed else 0)
            except asyncio.CancelledError:
                raise
            except (RespError, OSError, ValueError, IndexError) as exc:
                # Not lost for readers: retried after reconnecting (and they catch up from the database).
                self._outbox.extendleft(reversed(batch))
                self._waiting += sum(len(texts) for _, texts in batch)
                self._peers = True  # unknown: keep sending
                log.warning("cannot publish to Redis at %s (%s); retrying in %.1fs", self.address, exc, delay)
                if conn is not None:
                    conn.close()
                    conn = None
                await asyncio.sleep(delay)
                delay = min(delay * 2, MAX_BACKOFF)

    async def _subscribe_loop(self) -> None:
        delay = 0.1
        while True:
            conn: RespConnection | None = None
            link: RedisLink | None = None
            try:
                conn = await RespConnection.open(self.address)
                conn.writer.write(pack("SUBSCRIBE", self._channel))
                await conn.replies(1)  # ["subscribe", channel, count]
                self._generation += 1
                link = RedisLink(self, self._generation)
                self.link = link
                self.handler.new_connection(link)
                self.send(c.ReplicateCommand())
                if self.on_connected is not None:
                    self.on_connected()
                self.connected.set()
                delay = 0.1
                quiet = 0
                while True:
                    replies = await conn.available(timeout=HEALTH_CHECK_SECONDS)
                    if not replies:
                        quiet += 1
                        if quiet > 1:
                            raise RespError(f"Redis at {self.address} did not answer a PING")
                        conn.writer.write(pack("PING"))  # detects a dead link while the channel is quiet
                        continue
                    quiet = 0
                    self._receive(link, replies)
                    if not self.handler.has_capacity():
                        await self.handler.wait_for_capacity()  # Redis disconnects us if we lag too far
            except asyncio.CancelledError:
                raise
            except (RespError, OSError) as exc:
                log.warning("Redis subscription lost (%s); reconnecting in %.1fs", exc, delay)
            finally:
                self.connected.clear()
                if link is not None:
                    self.handler.lost_connection(link)
                    if self.link is link:
                        self.link = None
                if conn is not None:
                    conn.close()
            await asyncio.sleep(delay)
            delay = min(delay * 2, MAX_BACKOFF)

    def _receive(self, link: RedisLink, replies: list[Any]) -> None:
        """Handle one read's worth of messages, in order: own echoes dropped, RDATA in runs."""
        own = self._own
        try:
            plain = _MESSAGE.issuperset(map(_kind, replies))  # every reply of a subscriber is a list
        except (TypeError, IndexError, KeyError):
            plain = False
        if plain:
            # The usual read, messages only. A writer mostly receives its own echoes: all dropped here.
            datas: list[bytes] = list(map(_data, replies))
            if all(map(methodcaller("startswith", own), datas)):
                return
            lines = [d for d in datas if not d.startswith(own)]
        else:
            lines = [
                r[2]
                for r in replies
                if type(r) is list and len(r) == 3 and r[0] == b"message" and not r[2].startswith(own)
            ]
        start = 0
        count = len(lines)
        while start < count:
            end = start
            while end < count and lines[end][:6] == b"RDATA ":
                end += 1
            if end - start > 1:
                run = uniform_run(lines[start:end], self.max_line)
                if run is not None:
                    try:
                        self.handler.on_rdata_run(link, run)
                    except ProtocolError as exc:
                        log.warning("ignoring RDATA from %s: %s", run.instance_name, exc)
                    start = end
                    continue
            end = max(end, start + 1)
            for line in lines[start:end]:
                self._handle(link, line)
            start = end

    def _handle(self, link: RedisLink, data: bytes) -> None:
        try:
            cmd = c.parse_command(data)
        except c.CommandParseError as exc:
            log.warning("ignoring a replication line that does not parse (%s): %r", exc, data[:200])
            return
        if type(cmd) is c.ReplicateCommand:
            self._peers = True  # someone (re)subscribed: answer them, and keep sending
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
