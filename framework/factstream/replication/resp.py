"""A small Redis client for replication's hot path: RESP2 on an asyncio protocol, parsed by hiredis.

Replication publishes one message per command and every instance receives every message, its own
included: tens of thousands a second. redis-py's asyncio client spends about 20 µs on each received
pub/sub message and several on each pipelined ``PUBLISH`` (see docs/decisions.md). Here incoming
bytes are parsed by hiredis as they arrive, in the event loop's own callback: replies resolve the
commands waiting for them, in order, and a subscribed connection hands every read's messages to a
callback at once, with no task switch. ``PUBLISH`` is written at once and its replies are counted
as they come back, so a publisher never waits for Redis between two sends.

Only what replication needs is implemented: connecting (TCP, TLS for ``rediss://``, Unix sockets,
``AUTH`` and ``SELECT`` from the URL), commands with replies, pipelined publishing, and subscribing.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import ssl
from collections.abc import Callable
from dataclasses import dataclass
from operator import itemgetter
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

import hiredis
import msgspec

from factstream.sockets import set_nodelay

log = logging.getLogger(__name__)


class RespError(Exception):
    """Redis answered with an error, or the connection broke or timed out."""


@dataclass(frozen=True)
class RedisAddress:
    """Where and how to connect, from a ``redis://``, ``rediss://`` or ``unix://`` URL."""

    host: str = "127.0.0.1"
    port: int = 6379
    path: str | None = None
    tls: bool = False
    db: int = 0
    username: str | None = None
    password: str | None = None

    @classmethod
    def from_url(cls, url: str) -> RedisAddress:
        """Read ``redis://[[user]:password@]host[:port][/db]``, ``rediss://...`` or ``unix://path[?db=N]``."""
        parts = urlsplit(url)
        query = parse_qs(parts.query)
        username = unquote(parts.username) if parts.username else None
        password = unquote(parts.password) if parts.password is not None else None
        db_text = query.get("db", [""])[0]
        if parts.scheme != "unix":
            db_text = db_text or parts.path.lstrip("/")
        try:
            db = int(db_text or 0)
            port = parts.port or 6379
        except ValueError:
            raise ValueError(f"not a valid Redis URL (database or port): {url!r}") from None
        if parts.scheme == "unix":
            return cls(path=parts.path, db=db, username=username, password=password)
        if parts.scheme not in ("redis", "rediss"):
            raise ValueError(f"must be a redis://, rediss:// or unix:// URL, not {url!r}")
        return cls(
            host=parts.hostname or "127.0.0.1",
            port=port,
            tls=parts.scheme == "rediss",
            db=db,
            username=username or None,
            password=password,
        )

    def __str__(self) -> str:
        return self.path or f"{self.host}:{self.port}"


def pack(*args: bytes | str | int) -> bytes:
    """One command in RESP: an array of bulk strings."""
    out = [b"*%d\r\n" % len(args)]
    for arg in args:
        data = arg if isinstance(arg, bytes) else str(arg).encode("utf-8")
        out.append(b"$%d\r\n%b\r\n" % (len(data), data))
    return b"".join(out)


def pack_publishes(messages: list[tuple[bytes, list[bytes]]]) -> bytes:
    """``PUBLISH channel message`` for every message of every ``(channel, messages)`` pair, in order.

    Built from its pieces in C-level passes (the lengths written by msgspec in one call, the pieces
    placed by slice assignment, one join): a busy writer publishes every row it writes.
    """
    out = []
    for channel, texts in messages:
        count = len(texts)
        if not count:
            continue
        parts = [b"\r\n"] * (5 * count)  # head, length, CRLF, message, CRLF
        parts[0::5] = [b"*3\r\n$7\r\nPUBLISH\r\n$%d\r\n%b\r\n$" % (len(channel), channel)] * count
        parts[1::5] = _encode_json(list(map(len, texts)))[1:-1].split(b",")
        parts[3::5] = texts
        out.append(b"".join(parts))
    return b"".join(out)


_encode_json = msgspec.json.Encoder().encode

_first = itemgetter(0)
#: What the parser returns when no whole reply is buffered: a sentinel no reply can equal (hiredis's
#: default, ``False``, equals an integer reply of 0, such as a PUBLISH nobody received).
_NOT_ENOUGH_DATA = object()


def _all_messages(replies: list[Any]) -> bool:
    """Whether every reply is a ``[b"message", channel, data]`` push (C-level passes, no Python loop)."""
    try:
        # A reply that is not a list has no len() (an integer, an error) or a first item that is
        # not b"message" (bytes give an int): any of them makes this False.
        return bool(replies) and set(map(_first, replies)) == _MESSAGE and set(map(len, replies)) == _THREE
    except (TypeError, IndexError):
        return False


_THREE = {3}
_MESSAGE = {b"message"}

#: Messages of one read of a subscribed connection: ``[b"message", channel, data]`` lists, in order.
MessageCallback = Callable[[list[Any]], None]


#: Turns replies off for the publishes that follow, then on again: Redis answers the whole pipeline
#: with one ``OK`` instead of one integer per message (which it would write, and we would parse).
_QUIET_OFF = b"*3\r\n$6\r\nCLIENT\r\n$5\r\nREPLY\r\n$3\r\nOFF\r\n"
_QUIET_ON = b"*3\r\n$6\r\nCLIENT\r\n$5\r\nREPLY\r\n$2\r\nON\r\n"


class _Published:
    """A pipeline of ``PUBLISH`` commands whose replies are still to come (kept for a resend).

    ``left`` replies are expected; each acknowledges ``weight`` messages (1, or the whole pipeline
    when it was published with replies off).
    """

    __slots__ = ("batch", "left", "weight")

    def __init__(self, batch: list[tuple[bytes, list[bytes]]], replies: int, weight: int) -> None:
        self.batch = batch
        self.left = replies
        self.weight = weight


class RespClient(asyncio.Protocol):
    """One connection to Redis.

    Replies resolve waiting commands in the order they were sent. After :meth:`subscribe`, messages
    go to ``on_message`` a read at a time; ``on_lost`` is called once when the connection ends.
    """

    def __init__(self, address: RedisAddress) -> None:
        self.address = address
        self.parser = hiredis.Reader(notEnoughData=_NOT_ENOUGH_DATA)
        self.transport: asyncio.Transport | None = None
        self.on_message: MessageCallback | None = None
        self.on_lost: Callable[[Exception], None] | None = None
        self.lost: Exception | None = None
        self.last_received = 0.0
        #: What each reply answers, in order: a future (one reply), ``None`` (a reply nobody awaits,
        #: such as a subscriber's PONG) or a pipeline of publishes.
        self._waiting: collections.deque[asyncio.Future[Any] | _Published | None] = collections.deque()
        self._unacknowledged = 0
        #: Whether Redis takes ``CLIENT REPLY`` (checked by :meth:`open`): pipelines of publishes are
        #: then answered once, not once per message.
        self.quiet_publishing = False
        #: Set while the socket takes more data (asyncio's write flow control).
        self.writable = asyncio.Event()
        self.writable.set()

    # -- connecting --------------------------------------------------------------------------------

    @classmethod
    async def open(cls, address: RedisAddress, *, timeout: float = 5.0) -> RespClient:
        """Connect, authenticate and select the database; raises :class:`RespError` on failure."""
        loop = asyncio.get_running_loop()
        client = cls(address)
        try:
            async with asyncio.timeout(timeout):
                if address.path is not None:
                    await loop.create_unix_connection(lambda: client, address.path)
                else:
                    context = ssl.create_default_context() if address.tls else None
                    await loop.create_connection(lambda: client, address.host, address.port, ssl=context)
                if address.password is not None:
                    user = [] if address.username is None else [address.username]
                    await client.command("AUTH", *user, address.password)
                if address.db:
                    await client.command("SELECT", address.db)
                try:
                    await client.command("CLIENT", "REPLY", "ON")
                except RespError as exc:
                    if client.lost is not None:
                        raise
                    # Renamed or forbidden on some managed services: one reply per message, then.
                    log.info("Redis at %s refuses CLIENT REPLY (%s): publishing with a reply per message", address, exc)
                else:
                    client.quiet_publishing = True
        except TimeoutError:
            client.close()
            raise RespError(f"connecting to Redis at {address} timed out after {timeout:g}s") from None
        except OSError as exc:
            client.close()
            raise RespError(f"cannot connect to Redis at {address}: {exc}") from None
        except RespError:
            client.close()
            raise
        return client

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        set_nodelay(transport)  # a reply must not wait for Redis's delayed ACK (factstream.sockets)
        self.transport = transport
        self.last_received = asyncio.get_running_loop().time()

    def connection_lost(self, exc: Exception | None) -> None:
        if self.lost is None:
            self.lost = RespError(f"the connection to Redis at {self.address} was lost" + (f": {exc}" if exc else ""))
        self.writable.set()  # nobody waits for a socket that is gone
        kept: collections.deque[asyncio.Future[Any] | _Published | None] = collections.deque()
        for item in self._waiting:
            if isinstance(item, _Published):
                kept.append(item)  # for unacknowledged_batches()
            elif item is not None and not item.done():
                item.set_exception(self.lost)
        self._waiting = kept
        if self.on_lost is not None:
            self.on_lost(self.lost)

    # -- sending -----------------------------------------------------------------------------------

    def _write(self, data: bytes) -> None:
        if self.lost is not None or self.transport is None:
            raise self.lost or RespError(f"not connected to Redis at {self.address}")
        self.transport.write(data)

    async def command(self, *args: bytes | str | int, timeout: float = 5.0) -> Any:
        """Send one command and return its reply; an error reply raises :class:`RespError`."""
        self._write(pack(*args))
        future: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        self._waiting.append(future)
        try:
            async with asyncio.timeout(timeout):
                reply = await future
        except TimeoutError:
            self.close()
            raise RespError(f"Redis at {self.address} did not answer within {timeout:g}s") from None
        if isinstance(reply, hiredis.ReplyError):
            raise RespError(f"Redis at {self.address} answered: {reply}")
        return reply

    def publish(self, batch: list[tuple[bytes, list[bytes]]]) -> None:
        """Write ``PUBLISH`` commands at once; their replies are counted as they arrive."""
        count = sum(len(texts) for _, texts in batch)
        if not count:
            return
        if count > 1 and self.quiet_publishing:
            # Replies off for the pipeline: a PUBLISH that Redis refused would go unreported, but
            # one that fails here fails on every connection, and replication's own commands
            # (REPLICATE, POSITION) are published alone, with their replies.
            self._write(_QUIET_OFF + pack_publishes(batch) + _QUIET_ON)
            self._waiting.append(_Published(batch, 1, count))
        else:
            self._write(pack_publishes(batch))
            self._waiting.append(_Published(batch, count, 1))
        self._unacknowledged += count

    @property
    def unacknowledged(self) -> int:
        """``PUBLISH`` commands written and not yet answered."""
        return self._unacknowledged

    def unacknowledged_batches(self) -> list[tuple[bytes, list[bytes]]]:
        """The pipelines not wholly answered yet (to publish again after a reconnection)."""
        return [pair for item in self._waiting if isinstance(item, _Published) for pair in item.batch]

    def write_buffer_size(self) -> int:
        return self.transport.get_write_buffer_size() if self.transport is not None else 0

    async def subscribe(self, channel: bytes, on_message: MessageCallback, *, timeout: float = 5.0) -> None:
        """Subscribe to ``channel``; from then on every read's messages go to ``on_message``."""
        self.on_message = on_message
        await self.command("SUBSCRIBE", channel, timeout=timeout)

    def ping(self) -> None:
        """Send ``PING`` without waiting for the answer (which still counts as received data)."""
        self._write(pack("PING"))
        self._waiting.append(None)

    # -- receiving ---------------------------------------------------------------------------------

    def data_received(self, data: bytes) -> None:
        self.last_received = asyncio.get_running_loop().time()
        self.parser.feed(data)
        try:
            replies = list(iter(self.parser.gets, _NOT_ENOUGH_DATA))
        except hiredis.ProtocolError as exc:
            self.close(exc)
            return
        on_message = self.on_message
        if on_message is not None and _all_messages(replies):
            on_message(replies)  # a subscriber's usual read: checked and handed over in C-level passes
            return
        waiting = self._waiting
        messages: list[Any] = []
        try:
            for reply in replies:
                if on_message is not None and type(reply) is list and len(reply) == 3 and reply[0] == b"message":
                    messages.append(reply)
                    continue
                if not waiting:
                    continue  # an answer to nothing we asked: ignore it
                head = waiting[0]
                if isinstance(head, _Published):
                    self._unacknowledged -= head.weight
                    head.left -= 1
                    if head.left <= 0:
                        waiting.popleft()
                    if isinstance(reply, hiredis.ReplyError):
                        raise RespError(f"Redis at {self.address} refused a PUBLISH: {reply}")
                    continue
                waiting.popleft()
                if head is not None and not head.done():
                    head.set_result(reply)
        except RespError as exc:
            self.close(exc)
            return
        finally:
            if messages and on_message is not None:
                on_message(messages)

    def pause_writing(self) -> None:
        self.writable.clear()

    def resume_writing(self) -> None:
        self.writable.set()

    def pause_reading(self) -> None:
        if self.transport is not None:
            self.transport.pause_reading()

    def resume_reading(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.resume_reading()

    # -- closing -----------------------------------------------------------------------------------

    def close(self, reason: Exception | None = None) -> None:
        """Close the connection (``connection_lost`` follows, failing whatever still waits)."""
        if self.transport is not None:
            if reason is not None and self.lost is None:
                self.lost = RespError(str(reason))
            with contextlib.suppress(Exception):
                self.transport.close()

    async def aclose(self) -> None:
        self.close()
        with contextlib.suppress(Exception):
            await asyncio.sleep(0)
