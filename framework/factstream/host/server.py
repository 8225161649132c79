"""Serving the HTTP API with uvicorn inside the host's event loop.

The host binds the socket itself, so a port in use fails the start-up with an error naming the
address (uvicorn would log and ``sys.exit``), and hands it to a ``uvicorn.Server`` running as a
task of the host's loop. Signals stay the host's: uvicorn's own handlers are not installed, and
``close`` asks the server to stop, gives open requests ``grace`` seconds (long polls are then
cancelled) and waits for the task.

Every accepted connection gets TCP_NODELAY (:mod:`factstream.sockets`): uvicorn writes a response's
head and body separately, and with Nagle's algorithm on the body would wait for the client's delayed
acknowledgement of the head, ~40 ms on every small answer of a kept-alive connection. The option is
set per connection by the protocol, so it holds for a socket handed in (``sock=``) as for our own.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import Iterator

import uvicorn
from starlette.types import ASGIApp
from uvicorn.protocols.http.h11_impl import H11Protocol

from factstream.errors import ConfigError
from factstream.sockets import set_nodelay

log = logging.getLogger(__name__)


class _Server(uvicorn.Server):
    """uvicorn without its signal handlers: the host owns SIGINT and SIGTERM."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


class _NoDelayProtocol(H11Protocol):
    """uvicorn's HTTP/1.1 protocol with TCP_NODELAY set on the connection it serves."""

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        set_nodelay(transport)
        super().connection_made(transport)


class HttpServer:
    """The HTTP API of one host: ``await start()``, ``url``, ``await close()``.

    ``sock`` is a listening socket handed in (bound and listening, by a supervisor or a test); the
    server then serves it instead of binding ``host:port`` and closes it when it stops.
    """

    def __init__(
        self, app: ASGIApp, host: str, port: int, *, grace: int = 1, sock: socket.socket | None = None
    ) -> None:
        self.app = app
        self.host = host
        self.port = port
        self.grace = grace
        self._server: _Server | None = None
        self._task: asyncio.Task[None] | None = None
        self._socket: socket.socket | None = sock
        if sock is not None:
            address = sock.getsockname()
            self.host, self.port = str(address[0]), int(address[1])

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}"

    def _bind(self) -> socket.socket:
        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM, socket.IPPROTO_TCP)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((self.host, self.port))
        except OSError as exc:
            sock.close()
            raise ConfigError(f"cannot listen for HTTP on {self.host}:{self.port}: {exc.strerror or exc}") from None
        sock.listen(2048)
        sock.setblocking(False)
        return sock

    async def start(self) -> None:
        """Bind and start serving; returns once the server accepts connections."""
        if self._socket is None:
            self._socket = self._bind()
        self._socket.setblocking(False)
        config = uvicorn.Config(
            self.app,
            lifespan="off",
            log_config=None,
            access_log=False,
            ws="none",
            http=_NoDelayProtocol,
            timeout_graceful_shutdown=self.grace,
            timeout_keep_alive=75,
            backlog=2048,
        )
        server = self._server = _Server(config)
        self._task = asyncio.get_running_loop().create_task(server.serve(sockets=[self._socket]), name="http-server")
        while not server.started:
            if self._task.done():
                self._task.result()  # raises what stopped it
                raise ConfigError(f"the HTTP server on {self.url} stopped while starting")
            await asyncio.sleep(0.01)
        log.debug("HTTP API listening on %s", self.url)

    def connection_sockets(self) -> list[socket.socket]:
        """The sockets of the client connections open now (for diagnostics and tests)."""
        if self._server is None:
            return []
        found = (conn.transport.get_extra_info("socket") for conn in self._server.server_state.connections)
        return [sock for sock in found if sock is not None]

    async def close(self) -> None:
        if self._server is not None:
            self._server.should_exit = True
        if self._task is not None:
            try:
                await asyncio.wait_for(asyncio.shield(self._task), self.grace + 5.0)
            except TimeoutError:
                self._task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await self._task
            except Exception:
                log.exception("the HTTP server failed while stopping")
            self._task = None
        if self._socket is not None:
            self._socket.close()
            self._socket = None
        self._server = None
