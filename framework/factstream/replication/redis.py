"""Redis pub/sub transport: every instance publishes to and subscribes to one channel.

Two connections per process, as in the reference: one publishing, one subscribed (a subscribed
connection cannot publish). On every (re)connection the subscriber first SUBSCRIBEs, and only then
does the process publish ``REPLICATE`` and announce its own positions: peers cannot see that we
connected, and a POSITION published before our subscription would be lost (the reference fixed this
ordering after losing positions). Each connection counts as a new link for the handler, so nothing
is accepted on it before a POSITION, whose catch-up reads any gap from the database.

Everything published comes back to us: the handler ignores RDATA and POSITION carrying our own
instance name. Lines that do not parse are logged and skipped (there is no peer to answer). Publishes
go out in order from one task, pipelined in batches, so the streamer never waits on Redis.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable

from redis.asyncio import Redis
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import RedisError
from redis.exceptions import TimeoutError as RedisTimeoutError

from factstream.config import Settings
from factstream.replication import commands as c
from factstream.replication.handler import ProtocolError, ReplicationHandler

log = logging.getLogger(__name__)

HEALTH_CHECK_SECONDS = 5
MAX_BACKOFF = 5.0
PEER_CHECK_SECONDS = 1.0


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
        self.channel = settings.deployment
        self.handler = handler
        self.on_connected: Callable[[], None] | None = None
        self.link: RedisLink | None = None
        self._generation = 0
        self._outbox: asyncio.Queue[tuple[str, bytes]] = asyncio.Queue()
        self._publisher: Redis | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self.connected = asyncio.Event()
        self.published = 0
        self._peers = True
        # Our own RDATA and POSITION come back to us; recognised before parsing (third word).
        self._own = settings.instance_name.encode("utf-8")

    async def start(self) -> None:
        self._publisher = Redis.from_url(
            self.url, health_check_interval=HEALTH_CHECK_SECONDS, socket_connect_timeout=5, retry_on_timeout=True
        )
        loop = asyncio.get_running_loop()
        self._tasks = [
            loop.create_task(self._subscribe_loop(), name="repl-redis-sub"),
            loop.create_task(self._publish_loop(), name="repl-redis-pub"),
            loop.create_task(self._watch_peers(), name="repl-redis-peers"),
        ]

    def send(self, command: c.Command) -> None:
        self._outbox.put_nowait((command.redis_channel(self.channel), c.encode_line(command).rstrip(b"\n")))

    def send_lines(self, lines: list[bytes]) -> None:
        # RDATA lines, published one message per command as the reference does.
        put = self._outbox.put_nowait
        for line in lines:
            put((self.channel, line.rstrip(b"\n")))

    def has_peers(self) -> bool:
        """Whether anyone else is subscribed; with nobody listening the streamer skips its work.

        Safe to be briefly wrong: a newcomer subscribes and then publishes ``REPLICATE``, which
        sets the flag at once and is answered with positions, from which it catches up.
        """
        return self.link is not None and self._peers

    async def _watch_peers(self) -> None:
        """Count the channel's subscribers every second (``PUBSUB NUMSUB``); we are one of them."""
        assert self._publisher is not None
        while True:
            try:
                subscribed = self.link is not None  # then one of the subscribers is us
                counts = await self._publisher.pubsub_numsub(self.channel)
                self._peers = bool(counts) and int(counts[0][1]) > (1 if subscribed else 0)
            except (RedisError, OSError):
                self._peers = True  # unknown: keep sending
            await asyncio.sleep(PEER_CHECK_SECONDS)

    async def _publish_loop(self) -> None:
        assert self._publisher is not None
        delay = 0.1
        while True:
            first = await self._outbox.get()
            batch = [first]
            while not self._outbox.empty() and len(batch) < 1000:
                batch.append(self._outbox.get_nowait())
            while True:
                try:
                    async with self._publisher.pipeline(transaction=False) as pipe:
                        for channel, line in batch:
                            pipe.publish(channel, line)
                        await pipe.execute()
                    self.published += len(batch)
                    delay = 0.1
                    break
                except (RedisConnectionError, RedisTimeoutError, OSError) as exc:
                    # Not lost for readers: they catch up from the database after reconnecting.
                    log.warning("cannot publish to Redis (%s); retrying in %.1fs", exc, delay)
                    await asyncio.sleep(delay)
                    delay = min(delay * 2, MAX_BACKOFF)

    async def _subscribe_loop(self) -> None:
        delay = 0.1
        while True:
            client = Redis.from_url(self.url, socket_connect_timeout=5, health_check_interval=HEALTH_CHECK_SECONDS)
            pubsub = client.pubsub(ignore_subscribe_messages=True)
            link: RedisLink | None = None
            try:
                await pubsub.subscribe(self.channel)
                self._generation += 1
                link = RedisLink(self, self._generation)
                self.link = link
                self.handler.new_connection(link)
                self.send(c.ReplicateCommand())
                if self.on_connected is not None:
                    self.on_connected()
                self.connected.set()
                delay = 0.1
                while True:
                    message = await pubsub.get_message(timeout=HEALTH_CHECK_SECONDS)
                    if message is None:
                        await pubsub.ping()  # detects a dead link while the channel is quiet
                        continue
                    if message.get("type") != "message":
                        continue
                    self._handle(link, message["data"])
                    if not self.handler.has_capacity():
                        await self.handler.wait_for_capacity()  # Redis disconnects us if we lag too far
            except asyncio.CancelledError:
                raise
            except (RedisError, OSError) as exc:
                log.warning("Redis subscription lost (%s); reconnecting in %.1fs", exc, delay)
            finally:
                self.connected.clear()
                if link is not None:
                    self.handler.lost_connection(link)
                    if self.link is link:
                        self.link = None
                with contextlib.suppress(Exception):
                    await pubsub.aclose()  # type: ignore[no-untyped-call]
                with contextlib.suppress(Exception):
                    await client.aclose()
            await asyncio.sleep(delay)
            delay = min(delay * 2, MAX_BACKOFF)

    def _handle(self, link: RedisLink, data: bytes) -> None:
        if data[:6] == b"RDATA " or data[:9] == b"POSITION ":
            words = data.split(b" ", 3)
            if len(words) > 2 and words[2] == self._own:
                return  # our own publication, echoed back
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
        if self._publisher is not None:
            with contextlib.suppress(Exception):
                await self._publisher.aclose()
