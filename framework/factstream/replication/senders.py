"""Who may say what on a replication link (docs/security.md): the reader's checks of every sender.

RDATA and POSITION are accepted only under the name of an instance configured to write the stream
(or any, for streams anyone writes), never under this process's own name, and, on a link whose peer
is one instance (a TCP client seen from the server), only under that peer's name. A POSITION can
never move a position past what the stream's sequence has handed out.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping
from typing import Protocol

from factstream.replication import wire
from factstream.replication.stream import ReplicatedStream
from factstream.replication.wire import ProtocolError

log = logging.getLogger("factstream.replication.handler")

#: Seconds between two log lines about refused commands of one kind from one sender.
REFUSAL_LOG_SECONDS = 60.0


class Connection(Protocol):
    """What the handler needs of a transport connection."""

    name: str
    #: The one instance this link's peer speaks for (``None``: not known yet, or see ``relays``).
    peer: str | None
    #: Whether the link carries several instances' commands (Redis, the hub seen from a client).
    relays: bool

    def send(self, command: wire.Command) -> None: ...


class Senders:
    """The sender checks of one reader, and the count of what they refused."""

    def __init__(self, instance_name: str, streams: Mapping[str, ReplicatedStream]) -> None:
        self.instance_name = instance_name
        self.streams = streams
        self._refusals_logged: dict[tuple[str, str, str], float] = {}
        #: Commands refused because of who sent them or what they claimed, since start.
        self.refused = 0

    def refusal(self, conn: Connection, stream: ReplicatedStream, instance: str) -> str | None:
        """Why ``conn`` may not send ``stream``'s RDATA or POSITION under ``instance``'s name, or None."""
        if instance == self.instance_name:
            return f"{instance} is this process's own instance name"
        if not conn.relays and instance != conn.peer:
            if conn.peer is None:
                return f"a peer must send NAME before it speaks for {instance}"
            return f"peer {conn.peer} cannot speak for {instance}"
        if not stream.may_write(instance):
            return f"instance {instance} is not configured to write stream {stream.name} (stream_writers)"
        return None

    def accept(self, conn: Connection, stream: ReplicatedStream, instance: str, what: str) -> bool:
        """True to accept; False to drop silently (a relaying link); raises ProtocolError otherwise."""
        reason = self.refusal(conn, stream, instance)
        if reason is None:
            return True
        if conn.relays and instance == self.instance_name:
            return False  # our own echo (Redis delivers our publications back to us)
        self.refused += 1
        if not conn.relays:
            raise ProtocolError(f"{what} {stream.name} {instance}: {reason}")
        self.log_refusal(
            conn, stream.name, instance, f"dropping {what} {stream.name} {instance} from {conn.name}: {reason}"
        )
        return False

    def log_refusal(self, conn: Connection, stream: str, instance: str, message: str) -> None:
        """Log a dropped command, at most once a minute per (link, stream, sender): a flood stays one line."""
        key = (conn.name, stream, instance)
        now = time.monotonic()
        if now - self._refusals_logged.get(key, -REFUSAL_LOG_SECONDS) >= REFUSAL_LOG_SECONDS:
            self._refusals_logged[key] = now
            log.warning("%s", message)

    def position_known(self, conn: Connection, cmd: wire.PositionCommand) -> bool:
        """Whether ``cmd`` needs no :meth:`check_position`: its token is at most what this process
        knows the stream's sequence to have handed out (or the stream is unknown: refused anyway)."""
        stream = self.streams.get(cmd.stream_name)
        return stream is None or stream.position_allowed(cmd.new_token)

    async def check_position(self, conn: Connection, cmd: wire.PositionCommand) -> str | None:
        """Why ``cmd`` must be refused, or None: the sender must be allowed to send it, and its token
        cannot be beyond the highest ID the stream's sequence has handed out (read again if needed).

        A writer's position is always an ID it was handed: a POSITION beyond the sequence is forged
        or corrupt, and accepting it would move the watermark past IDs not yet allocated (readers
        would skip them, and this process could hand them out twice).
        """
        stream = self.streams.get(cmd.stream_name)
        if stream is None:
            return None
        reason = self.refusal(conn, stream, cmd.instance_name)
        if reason is not None:
            self.refused += 1
            return f"POSITION {cmd.stream_name} {cmd.instance_name}: {reason}"
        if stream.position_allowed(cmd.new_token):
            return None
        bound = await stream.refresh_allocated()
        if stream.position_allowed(cmd.new_token):
            return None
        self.refused += 1
        return (
            f"POSITION {cmd.stream_name} {cmd.instance_name} {cmd.new_token}: beyond the highest ID "
            f"the stream's sequence has handed out ({bound})"
        )
