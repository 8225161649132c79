"""TCP_NODELAY on every TCP connection the project opens or accepts.

Every protocol factstream speaks is request and answer (HTTP, the replication line protocol, RESP), and
an answer often leaves as two writes (uvicorn sends a response's head and its body separately). With
Nagle's algorithm on, the second write waits until the peer acknowledges the first, and a peer delays
that acknowledgement by up to 40 ms: every small answer on a kept-alive connection then takes ~40 ms.

asyncio sets TCP_NODELAY by itself only on sockets whose ``proto`` is ``IPPROTO_TCP``; a socket made
with ``socket.socket(family, SOCK_STREAM)`` has ``proto`` 0, and so do the connections it accepts. The
project therefore sets the option explicitly on each connection (:func:`set_nodelay`) rather than
relying on how its listening socket happened to be created.

:func:`free_port` lives here too: a port for a server that is configured before it starts.
"""

from __future__ import annotations

import asyncio
import os
import random
import socket
from typing import Any

_TCP_FAMILIES = frozenset({socket.AF_INET, socket.AF_INET6})


def _tcp_socket(target: asyncio.BaseTransport | socket.socket | Any) -> Any:
    """The TCP socket of ``target`` (a socket, or an asyncio transport's), or None for any other."""
    sock = target.get_extra_info("socket") if isinstance(target, asyncio.BaseTransport) else target
    if sock is None or sock.family not in _TCP_FAMILIES or sock.type != socket.SOCK_STREAM:
        return None
    return sock


def set_nodelay(target: asyncio.BaseTransport | socket.socket | Any) -> bool:
    """Turn Nagle's algorithm off on a TCP socket or the socket of an asyncio transport.

    Returns whether the option was set: ``False`` for a Unix socket, a transport without a socket (an
    in-memory test transport) or a socket already closed.
    """
    sock = _tcp_socket(target)
    if sock is None:
        return False
    try:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    except OSError:  # closed by the peer in the meantime
        return False
    return True


def nodelay(target: asyncio.BaseTransport | socket.socket | Any) -> bool:
    """Whether TCP_NODELAY is set on a socket or a transport's socket (``False`` for non-TCP ones)."""
    sock = _tcp_socket(target)
    if sock is None:
        return False
    return bool(sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY))


#: Ports :func:`free_port` has handed out in this process: the kernel may offer a port again as soon as
#: the probing socket closes, and two ports asked for in a row (a main's replication port and a worker's
#: HTTP port) must not be the same one before either is listened on.
_handed_out: set[int] = set()

#: ``LOW-HIGH``: the ports :func:`free_port` draws from (both included). The test plugin gives each
#: pytest-xdist worker a range of its own, so two workers never hand out the same port.
PORTS_ENV = "FACTSTREAM_PORTS"


def port_range(text: str) -> range:
    """The ports of a ``LOW-HIGH`` text (:data:`PORTS_ENV`); ``ValueError`` saying what is wrong."""
    low, dash, high = text.partition("-")
    try:
        first, last = int(low), int(high)
    except ValueError:
        raise ValueError(f"{PORTS_ENV}: expected LOW-HIGH (for example 20000-21999), got {text!r}") from None
    if not dash or not 1024 <= first <= last <= 65535:
        raise ValueError(f"{PORTS_ENV}: expected LOW-HIGH with 1024 <= LOW <= HIGH <= 65535, got {text!r}")
    return range(first, last + 1)


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on (at the time of the call) and that no earlier call
    in this process returned.

    From the kernel's ephemeral ports, or, when ``FACTSTREAM_PORTS`` is set, from that range, starting
    at a random place in it (a child process drawing from its parent's range then rarely meets the
    ports its parent handed out and has not bound yet).
    """
    text = os.environ.get(PORTS_ENV)
    if text:
        ports = port_range(text)
        start = random.randrange(len(ports))
        for i in range(len(ports)):
            port = ports[(start + i) % len(ports)]
            if port not in _handed_out and _bindable(port):
                _handed_out.add(port)
                return port
        raise OSError(f"no free TCP port on 127.0.0.1 in {PORTS_ENV}={text} that was not handed out already")
    for _ in range(1000):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = int(s.getsockname()[1])
        if port not in _handed_out:
            _handed_out.add(port)
            return port
    raise OSError("no free TCP port on 127.0.0.1 that was not handed out already")


def _bindable(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True
