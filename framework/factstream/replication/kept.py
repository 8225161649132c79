"""Where a kept stream's updates come from: its writer's keeper, asked in process or over HTTP.

A kept stream (``StreamSpec(kept=True)``) has no table to catch up from. Its writer's plugin hands the
host a *keeper* (``host.kept_stream(...)``): ``(from, upto, limit) -> (updates, upto, limited)``, the
facts it holds with positions in ``(from, upto]``, read from wherever it keeps them. This module makes
that the stream's update function everywhere:

* on the writer, :meth:`KeptSource.updates` calls the keeper (the streamer reads what to send with it);
* on every other process it asks the writer: ``GET /replication/kept/<stream>?from=&upto=&limit=`` on
  the writer's ``instance_map`` HTTP port (the route is :func:`kept_updates_route`), as the reference
  asks its typing writer (``/_synapse/replication/get_repl_stream_updates``). With ``replication.secret``
  the request is signed (``X-Factstream-Replication``) and the writer refuses one that is not; without
  it the route is as open as the replication port itself.

The answer carries the writer's *epoch*, where its current run started (``factstream.idgen.kept``). A
reader whose view of the writer is below the epoch (``from < epoch``) holds facts of an earlier run
that the writer no longer has: before the answer's rows are delivered, the view is *reset*: the host
calls every rows handler's ``reset`` for that writer (the plugins drop what it said) and wakes every
long poll of the stream once the position moves (their clients' answers may have changed). The
keeper, asked from below its epoch, answers everything it holds, so the rows then rebuild the view.

A writer announces its position as soon as its replication link is up and serves HTTP a moment later,
so a refused connection is tried again for up to ``timeout`` seconds. A reader that still cannot reach
the writer (no HTTP port in ``instance_map``, a failed request) logs why, resets its view of that
writer as if a run had started at the announced position and moves there without rows: it shows less
than there is until the writer's next facts, rather than what is no longer true.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import time
import urllib.parse
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import msgspec

from factstream.replication.auth import ReplicationSecret

if TYPE_CHECKING:
    from factstream.plugin.streams import Update

log = logging.getLogger(__name__)

#: The route every instance serves for the kept streams it writes (``{stream}``: the stream's name).
KEPT_UPDATES_PATH = "/replication/kept/{stream}"
#: The header carrying a signed request's instance and HMAC (with ``replication.secret``).
SIGNATURE_HEADER = "X-Factstream-Replication"
#: Most updates one request may ask for.
MAX_KEPT_LIMIT = 10_000
#: How long a reader waits before asking a writer that refused the connection again.
RETRY_SECONDS = 0.2
#: Longest answer a reader accepts, in bytes.
MAX_ANSWER_BYTES = 64 * 1024 * 1024

#: A keeper: ``(from exclusive, upto inclusive, limit) -> (updates, upto, limited)``, as an update function.
Keeper = Callable[[int, int, int], "Awaitable[tuple[list[Update], int, bool]] | tuple[list[Update], int, bool]"]
#: Called before a reader delivers the rows of a writer's new run: ``(writer, epoch)``.
ResetListener = Callable[[str, int], Awaitable[None]]


class KeptAnswer(msgspec.Struct, frozen=True):
    """What the writer answers: its epoch, the updates as ``[token, row array]`` pairs, upto, limited."""

    epoch: int
    updates: list[tuple[int, list[Any]]]
    upto: int
    limited: bool


class KeptUnreachable(Exception):
    """The writer could not be asked; the message says why."""


class KeptNoAddress(KeptUnreachable):
    """The configuration gives the writer no HTTP port to ask."""


class KeptRefused(KeptUnreachable):
    """The writer's HTTP port refused the connection (it may be starting: asked again)."""


class KeptSource:
    """One kept stream's update function in this process (module docstring)."""

    def __init__(
        self,
        stream: str,
        instance: str,
        *,
        epoch: int,
        url_of: Callable[[str], tuple[str, int] | None],
        secret: ReplicationSecret | None,
        timeout: float = 10.0,
    ) -> None:
        self.stream = stream
        self.instance = instance
        #: Where this process's own run of the stream started (0 when it does not write it).
        self.epoch = epoch
        self.keeper: Keeper | None = None
        self.on_reset: ResetListener | None = None
        self.parse_row: Callable[[Any], Any] = lambda raw: raw
        self._url_of = url_of
        self._secret = secret
        self.timeout = timeout
        #: Per writer, the epoch of the run this process's view is of.
        self.epochs: dict[str, int] = {}
        #: Requests made to writers.
        self.asked = 0
        self._warned: set[str] = set()

    async def local(self, from_token: int, upto_token: int, limit: int) -> tuple[list[Update], int, bool]:
        """The keeper's answer (nothing yet while no keeper is set: positions only)."""
        if self.keeper is None or from_token >= upto_token:
            return [], upto_token, False
        answer = self.keeper(from_token, upto_token, limit)
        if inspect.isawaitable(answer):
            return await answer
        return answer

    async def updates(
        self, db: object, instance: str, from_token: int, upto_token: int, limit: int
    ) -> tuple[list[Update], int, bool]:
        """The stream's update function: the keeper here, the writer's over HTTP elsewhere."""
        if instance == self.instance:
            return await self.local(from_token, upto_token, limit)
        try:
            answer = await self._ask_until(instance, from_token, upto_token, limit)
        except KeptUnreachable as exc:
            # A writer without an HTTP port (a configuration that never asks): a warning, once per writer.
            # A request that failed: an error, every time.
            quiet = isinstance(exc, KeptNoAddress)
            if not quiet or instance not in self._warned:
                self._warned.add(instance)
                log.log(
                    logging.WARNING if quiet else logging.ERROR,
                    "cannot catch up on kept stream %s from %s (%s): its facts there are dropped here until it "
                    "writes again",
                    self.stream,
                    instance,
                    exc,
                )
            # Whatever this process knew of the writer may be gone, and so may everything up to the
            # announced position: a token below it is treated as from before the writer's run.
            self.epochs[instance] = upto_token
            await self._reset(instance, upto_token)
            return [], upto_token, False
        if from_token < answer.epoch:
            await self._reset(instance, answer.epoch)
        self.epochs[instance] = answer.epoch
        parse = self.parse_row
        return [(token, parse(row)) for token, row in answer.updates], answer.upto, answer.limited

    async def _ask_until(self, instance: str, from_token: int, upto_token: int, limit: int) -> KeptAnswer:
        """:meth:`_ask`, again while the writer refuses connections, for up to :attr:`timeout` seconds: a
        writer announces its position as soon as replication is up, and serves HTTP last (a moment later)."""
        deadline = time.monotonic() + self.timeout
        while True:
            try:
                return await self._ask(instance, from_token, upto_token, limit)
            except KeptRefused:
                if time.monotonic() >= deadline:
                    raise
                await asyncio.sleep(RETRY_SECONDS)

    async def _reset(self, instance: str, epoch: int) -> None:
        if self.on_reset is not None:
            await self.on_reset(instance, epoch)

    async def _ask(self, instance: str, from_token: int, upto_token: int, limit: int) -> KeptAnswer:
        where = self._url_of(instance)
        if where is None:
            raise KeptNoAddress(f"instance_map gives {instance!r} no http_port")
        host, port = where
        query = urllib.parse.urlencode({"from": from_token, "upto": upto_token, "limit": limit})
        target = KEPT_UPDATES_PATH.format(stream=self.stream) + "?" + query
        headers = {"Host": f"{host}:{port}", "Accept": "application/json", "Connection": "close"}
        if self._secret is not None:
            headers[SIGNATURE_HEADER] = self._secret.sign_request(self.instance, target)
        self.asked += 1
        try:
            async with asyncio.timeout(self.timeout):
                status, body = await _get(host, port, target, headers)
        except ConnectionRefusedError as exc:
            raise KeptRefused(f"GET http://{host}:{port}{target}: {exc}") from None
        except (OSError, TimeoutError, ValueError) as exc:
            raise KeptUnreachable(f"GET http://{host}:{port}{target}: {type(exc).__name__}: {exc}") from None
        if status != 200:
            raise KeptUnreachable(f"GET http://{host}:{port}{target}: HTTP {status}: {body[:200]!r}")
        try:
            return msgspec.json.decode(body, type=KeptAnswer)
        except msgspec.DecodeError as exc:
            raise KeptUnreachable(f"the answer of {instance!r} is not a kept stream's answer: {exc}") from None


async def _get(host: str, port: int, target: str, headers: dict[str, str]) -> tuple[int, bytes]:
    """One HTTP/1.1 GET, ``Connection: close``: ``(status, body)``; ValueError for a malformed answer."""
    reader, writer = await asyncio.open_connection(host, port)
    try:
        head = f"GET {target} HTTP/1.1\r\n" + "".join(f"{k}: {v}\r\n" for k, v in headers.items()) + "\r\n"
        writer.write(head.encode("latin-1"))
        await writer.drain()
        chunks: list[bytes] = []
        total = 0
        while more := await reader.read(65_536):
            total += len(more)
            if total > MAX_ANSWER_BYTES + 65_536:
                raise ValueError(f"the answer is longer than {MAX_ANSWER_BYTES} bytes")
            chunks.append(more)
    finally:
        writer.close()
    return _parse_answer(b"".join(chunks))


def _parse_answer(data: bytes) -> tuple[int, bytes]:
    head, sep, body = data.partition(b"\r\n\r\n")
    if not sep:
        raise ValueError("no complete HTTP head")
    lines = head.split(b"\r\n")
    parts = lines[0].split(b" ", 2)
    if len(parts) < 2 or not parts[0].startswith(b"HTTP/1.") or not parts[1].isdigit():
        raise ValueError(f"not an HTTP status line: {lines[0][:80]!r}")
    fields = {}
    for line in lines[1:]:
        name, _, value = line.partition(b":")
        fields[name.strip().lower()] = value.strip()
    if fields.get(b"transfer-encoding", b"").lower() == b"chunked":
        body = _unchunk(body)
    elif b"content-length" in fields:
        length = int(fields[b"content-length"])
        if len(body) < length:
            raise ValueError(f"the body is cut short: {len(body)} of {length} bytes")
        body = body[:length]
    return int(parts[1]), body


def _unchunk(body: bytes) -> bytes:
    out = bytearray()
    while True:
        size_line, sep, rest = body.partition(b"\r\n")
        if not sep:
            raise ValueError("a chunked body is cut short")
        size = int(size_line.split(b";")[0], 16)
        if size == 0:
            return bytes(out)
        out += rest[:size]
        body = rest[size + 2 :]
