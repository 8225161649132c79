"""A small Redis client for replication's hot path: RESP2 over asyncio streams, parsed by hiredis.

Replication publishes one message per command and every instance receives every message, its own
included: tens of thousands a second. redis-py's asyncio client spends about 20 µs on each received
pub/sub message and several on each pipelined ``PUBLISH`` (see docs/decisions.md); here a pipeline of
``PUBLISH`` commands is packed into one buffer, and a socket read of messages is parsed by hiredis in
one pass. Only what replication needs is implemented: connecting (TCP, TLS for ``rediss://``, Unix
sockets, ``AUTH`` and ``SELECT`` from the URL), commands with replies, and a
subscribed connection's message stream.
"""

from __future__ import annotations

import asyncio
import contextlib
import ssl
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

import hiredis

#: Bytes read from the socket at a time.
READ_CHUNK = 256 * 1024


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
        db_text = query.get("db", [""])[0] or parts.path.lstrip("/")
        if parts.scheme == "unix":
            db_text = query.get("db", [""])[0]
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
    """``PUBLISH channel message`` for every message of every ``(channel, messages)`` pair, in order."""
    out = []
    for channel, texts in messages:
        head = b"*3\r\n$7\r\nPUBLISH\r\n$%d\r\n%b\r\n$" % (len(channel), channel)
        out.append(head)
        out.append(head.join(map(b"%d\r\n%b\r\n".__mod__, zip(map(len, texts), texts, strict=True))))
    return b"".join(out)


class RespConnection:
    """One connection to Redis. Not shared between tasks: replies come back in command order."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, address: RedisAddress) -> None:
        self.reader = reader
        self.writer = writer
        self.address = address
        self.parser = hiredis.Reader()
        self._replies: list[Any] = []

    @classmethod
    async def open(cls, address: RedisAddress, *, timeout: float = 5.0) -> RespConnection:
        """Connect, authenticate and select the database; raises :class:`RespError` on failure."""
        try:
            async with asyncio.timeout(timeout):
                if address.path is not None:
                    reader, writer = await asyncio.open_unix_connection(address.path, limit=READ_CHUNK)
                else:
                    context = ssl.create_default_context() if address.tls else None
                    reader, writer = await asyncio.open_connection(
                        address.host, address.port, ssl=context, limit=READ_CHUNK
                    )
                conn = cls(reader, writer, address)
                try:
                    if address.password is not None:
                        user = [] if address.username is None else [address.username]
                        await conn.command("AUTH", *user, address.password)
                    if address.db:
                        await conn.command("SELECT", address.db)
                except BaseException:
                    conn.close()
                    raise
                return conn
        except TimeoutError:
            raise RespError(f"connecting to Redis at {address} timed out after {timeout:g}s") from None
        except OSError as exc:
            raise RespError(f"cannot connect to Redis at {address}: {exc}") from None

    async def command(self, *args: bytes | str | int, timeout: float = 5.0) -> Any:
        """Send one command and return its reply."""
        self.writer.write(pack(*args))
        return (await self.replies(1, timeout=timeout))[0]

    async def publish(self, messages: list[tuple[bytes, list[bytes]]], *, timeout: float = 5.0) -> None:
        """Publish the messages in order, pipelined: one write, then every reply.

        Each ``PUBLISH`` is answered with one line, ``:<subscribers>``: the replies are counted
        rather than parsed one by one, and anything else (an error) raises :class:`RespError`.
        """
        n = sum(len(texts) for _, texts in messages)
        if not n:
            return
        self.writer.write(pack_publishes(messages))
        if self._replies or self.parser.has_data():
            await self.replies(n, timeout=timeout)  # replies of earlier commands are pending
            return
        received = bytearray()
        try:
            async with asyncio.timeout(timeout):
                await self.writer.drain()
                while received.count(b"\n") < n:
                    received += await self._recv()
        except TimeoutError:
            raise RespError(f"Redis at {self.address} did not answer within {timeout:g}s") from None
        if received[:1] != b":" or received.count(b"\n:") != n - 1 or received.count(b"\n") != n:
            odd = next((line for line in bytes(received).split(b"\r\n") if line[:1] != b":"), b"")
            raise RespError(f"Redis at {self.address} answered a PUBLISH with {odd[:200]!r}")

    async def replies(self, n: int, *, timeout: float | None = 5.0) -> list[Any]:
        """The next ``n`` replies (reading as needed); an error reply raises :class:`RespError`."""
        got = self._take(n)
        try:
            async with asyncio.timeout(timeout):
                await self.writer.drain()
                while len(got) < n:
                    await self._read()
                    got += self._take(n - len(got))
        except TimeoutError:
            raise RespError(f"Redis at {self.address} did not answer within {timeout:g}s") from None
        for reply in got:
            if isinstance(reply, hiredis.ReplyError):
                raise RespError(f"Redis at {self.address} answered: {reply}")
        return got

    async def available(self, *, timeout: float | None) -> list[Any]:
        """Every complete reply or message received so far, waiting for at least one (a subscriber's read).

        Returns an empty list after ``timeout`` seconds without any.
        """
        if not self._replies:
            try:
                async with asyncio.timeout(timeout):
                    while not self._replies:
                        await self._read()
            except TimeoutError:
                return []
        got, self._replies = self._replies, []
        return got

    async def _recv(self) -> bytes:
        """The next bytes from Redis (never empty)."""
        try:
            data = await self.reader.read(READ_CHUNK)
        except OSError as exc:
            raise RespError(f"the connection to Redis at {self.address} broke: {exc}") from None
        if not data:
            raise RespError(f"Redis at {self.address} closed the connection")
        return data

    async def _read(self) -> None:
        self.parser.feed(await self._recv())
        gets = self.parser.gets
        append = self._replies.append
        try:
            while (reply := gets()) is not False:
                append(reply)
        except hiredis.ProtocolError as exc:
            raise RespError(f"Redis at {self.address} sent something that is not RESP: {exc}") from None

    def _take(self, n: int) -> list[Any]:
        got, self._replies = self._replies[:n], self._replies[n:]
        return got

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.writer.close()

    async def aclose(self) -> None:
        self.close()
        with contextlib.suppress(Exception):
            await self.writer.wait_closed()
