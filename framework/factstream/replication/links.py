"""What an operator sees of replication: the links of this process and its lag behind each writer.

:class:`LinkStats` is one replication link's live state and counters. The transports own them and
bump plain integer attributes on their hot paths (no call into a metrics library per command); the
metrics collector (:func:`register`), ``/health`` and the dashboard read them when asked.

* TCP client (a worker): one outbound link to the main instance that persists across reconnects,
  down while disconnected.
* TCP server (the main instance): one inbound link per connected peer, named after the instance
  once it said who it is, plus the recently closed ones for :data:`RECENT_SECONDS` (a peer that
  reconnects under the same name continues its counters).
* Redis: one outbound link for the pair of connections (publishing and subscribed), up while the
  subscription is.

:class:`StreamLag` is how far this instance is behind one writer of one stream, from
:meth:`ReplicationHandler.lags <factstream.replication.handler.ReplicationHandler.lags>`.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import Any

#: How long the TCP main keeps a closed inbound link in ``links()`` (its peer may come back).
RECENT_SECONDS = 600.0


@dataclass(eq=False)
class LinkStats:
    """One replication link of this process, live counters (the transport bumps them)."""

    peer: str
    transport: str  # "tcp" | "redis"
    direction: str  # "outbound" (this process connects) | "inbound" (accepted by the main)
    up: bool = False
    since: float = field(default_factory=time.time)
    connects: int = 0
    disconnects: int = 0
    commands_sent: int = 0
    commands_received: int = 0
    rows_sent: int = 0
    rows_received: int = 0
    bytes_sent: int = 0
    bytes_received: int = 0

    def connected(self, now: float | None = None) -> None:
        """The link came up: counted, and ``since`` is now."""
        self.up = True
        self.connects += 1
        self.since = time.time() if now is None else now

    def disconnected(self, now: float | None = None) -> None:
        """The link went down (counted once, however many times the transport says so)."""
        if not self.up:
            return
        self.up = False
        self.disconnects += 1
        self.since = time.time() if now is None else now

    def down_for(self, now: float) -> float:
        """Seconds the link has been down at ``now`` (0 while it is up)."""
        return 0.0 if self.up else max(0.0, now - self.since)

    def as_json(self) -> dict[str, Any]:
        """Every field, plus ``"state": "up" | "down"``."""
        data = asdict(self)
        data["state"] = "up" if self.up else "down"
        return data


@dataclass(frozen=True)
class StreamLag:
    """How far this instance is behind one writer of one stream, as this instance sees it."""

    stream: str
    writer: str
    #: The newest position the writer announced that this instance heard of.
    writer_position: int
    #: What this instance has applied (its ID generator's view of that writer).
    applied_position: int
    #: ``max(0, writer_position - applied_position)``.
    lag_positions: int
    #: How long the oldest announced-but-unapplied position has been waiting, on this instance's
    #: clock, counted from when the writer stamped it (see docs/replication.md, "Lag"); 0 when
    #: nothing is waiting.
    lag_seconds: float

    def as_json(self) -> dict[str, Any]:
        return asdict(self)
