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

import logging
import math
import time
import weakref
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from factstream import metrics

#: How long the TCP main keeps a closed inbound link in ``links()`` (its peer may come back).
RECENT_SECONDS = 600.0
#: Announced positions heard within this many seconds of each other share one arrival time (the
#: later ones' lag in seconds is then overstated by at most this much): it bounds the bookkeeping.
LAG_RESOLUTION = 0.05
#: Arrival times kept per (stream, writer) before the applied ones are dropped.
LAG_ENTRIES = 64
#: The writer's clock offset is the smallest sample of the last one to two of these periods, so a
#: writer whose clock is stepped (NTP) is measured right again within two periods.
OFFSET_WINDOW = 300.0


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


class _Offset:
    """A writer's wall clock related to this process's monotonic clock.

    Each stamped POSITION gives a sample ``received - stamp`` (this process's monotonic clock at
    arrival minus the writer's wall clock when it reached the position): the true offset between the
    two clocks plus the time the POSITION travelled. The smallest sample is the offset plus the
    quickest trip, so ``stamp + offset`` maps a stamp onto this process's clock no later than the
    position really arrived, and the writer's clock may be any amount off without changing the
    result. Samples expire after one to two :data:`OFFSET_WINDOW` periods.
    """

    __slots__ = ("current", "previous", "started")

    def __init__(self, now: float) -> None:
        self.current = math.inf
        self.previous = math.inf
        self.started = now

    def sample(self, now: float, stamp: float) -> float:
        """Take a sample; the offset to use now."""
        if now - self.started >= OFFSET_WINDOW:
            self.previous, self.current, self.started = self.current, math.inf, now
        self.current = min(self.current, now - stamp)
        return min(self.current, self.previous)


class LagTracker:
    """What each writer announced, and when, as this process's handler heard it.

    Per (stream, writer): the newest position heard (POSITION or RDATA), and the arrival times of
    the positions not yet applied, on this process's monotonic clock: the local arrival time for
    RDATA and unstamped POSITIONs, ``stamp + offset`` (see :class:`_Offset`) for a stamped POSITION.
    The lag in seconds is the age of the oldest announced position still unapplied: it never
    compares two machines' clocks. ``applied`` reads this process's view of a writer (the handler's
    streams); it prunes what is applied when the bookkeeping fills up.
    """

    def __init__(self, applied: Callable[[str, str], int], clock: Callable[[], float] = time.monotonic) -> None:
        self.applied = applied
        self.clock = clock
        self.heard: dict[tuple[str, str], int] = {}
        self._waiting: dict[tuple[str, str], deque[tuple[int, float]]] = {}
        self._offsets: dict[str, _Offset] = {}

    def heard_token(self, stream: str, writer: str, token: int, stamp_ms: int | None = None) -> None:
        """``writer`` announced ``token`` on ``stream`` (``stamp_ms``: its clock then, if it said)."""
        key = (stream, writer)
        if token <= self.heard.get(key, -math.inf):
            if stamp_ms is not None:
                self._offset(writer, stamp_ms)  # still a sample of the writer's clock
            return
        self.heard[key] = token
        now = self.clock()
        at = now if stamp_ms is None else min(now, stamp_ms / 1000 + self._offset(writer, stamp_ms))
        waiting = self._waiting.get(key)
        if waiting is None:
            waiting = self._waiting[key] = deque()
        elif waiting:
            last_at = waiting[-1][1]
            if at - last_at < LAG_RESOLUTION:
                waiting[-1] = (token, last_at)
                return
            if len(waiting) >= LAG_ENTRIES:
                self._prune(waiting, self.applied(stream, writer))
                if len(waiting) >= LAG_ENTRIES:
                    waiting[-1] = (token, last_at)  # the oldest ones are what the lag is made of
                    return
        waiting.append((token, max(at, waiting[-1][1]) if waiting else at))

    def _offset(self, writer: str, stamp_ms: int) -> float:
        now = self.clock()
        offset = self._offsets.get(writer)
        if offset is None:
            offset = self._offsets[writer] = _Offset(now)
        return offset.sample(now, stamp_ms / 1000)

    @staticmethod
    def _prune(waiting: deque[tuple[int, float]], applied: int) -> None:
        while waiting and waiting[0][0] <= applied:
            waiting.popleft()

    def lag(self, stream: str, writer: str, applied: int) -> StreamLag:
        """The lag behind ``writer`` on ``stream`` given what this process applied."""
        heard = max(self.heard.get((stream, writer), applied), applied)
        waiting = self._waiting.get((stream, writer))
        seconds = 0.0
        if waiting:
            self._prune(waiting, applied)
            if waiting:
                seconds = max(0.0, self.clock() - waiting[0][1])
        return StreamLag(stream, writer, heard, applied, max(0, heard - applied), seconds)

    def forget(self, stream: str, writer: str) -> None:
        """Drop what is known of a writer (it is gone for good)."""
        self.heard.pop((stream, writer), None)
        self._waiting.pop((stream, writer), None)


class Reconnects:
    """The log lines of a link's reconnection attempts: the first failure at INFO (WARNING for one
    that needs the operator, such as a certificate not trusted), the next ones at DEBUG until a
    connection succeeds; :meth:`succeeded` says how many attempts failed meanwhile."""

    def __init__(self, log: logging.Logger, peer: str) -> None:
        self.log = log
        self.peer = peer
        self.failures = 0

    def failed(self, error: object, retry_in: float, *, warn: bool = False) -> None:
        self.failures += 1
        level = (logging.WARNING if warn else logging.INFO) if self.failures == 1 else logging.DEBUG
        fields = {"peer": self.peer, "attempt": self.failures, "error": str(error), "retry_in": round(retry_in, 1)}
        self.log.log(level, "replication reconnect failed", extra={"fields": fields})

    def succeeded(self) -> int:
        """The attempts that failed before this success (the count starts again)."""
        failed, self.failures = self.failures, 0
        return failed


def positions_text(positions: dict[str, int]) -> str:
    """``events:12,caches:3``: positions for a log line."""
    return ",".join(f"{stream}:{position}" for stream, position in sorted(positions.items()))


# -- metrics ---------------------------------------------------------------------------------------


class LinkSource(Protocol):
    """A transport, as the collector reads it."""

    instance_name: str

    def links(self) -> list[LinkStats]: ...


class LagSource(Protocol):
    """A reader (the replication handler), as the collector reads it."""

    instance_name: str

    def lags(self) -> list[StreamLag]: ...

    def catch_ups(self) -> dict[str, tuple[int, int]]:
        """Per stream, the catch-up pages and rows read from the database since start."""
        ...


_links: weakref.WeakSet[Any] = weakref.WeakSet()
_lags: weakref.WeakSet[Any] = weakref.WeakSet()


def track_links(source: LinkSource) -> None:
    """Export ``source``'s links until :func:`untrack` (transports call this when they start)."""
    _links.add(source)


def track_lags(source: LagSource) -> None:
    """Export ``source``'s lags and catch-ups until :func:`untrack`."""
    _lags.add(source)


def untrack(source: object) -> None:
    _links.discard(source)
    _lags.discard(source)


def metrics_enabled(settings: object) -> bool:
    """``metrics.enabled`` of the settings (true where the setting does not exist)."""
    return bool(getattr(getattr(settings, "metrics", None), "enabled", True))


_LINK_COUNTERS = (
    ("connects", "Times the link came up"),
    ("disconnects", "Times the link went down"),
    ("commands_sent", "Replication commands sent on the link"),
    ("commands_received", "Replication commands received on the link"),
    ("rows_sent", "RDATA rows sent on the link"),
    ("rows_received", "RDATA rows received on the link"),
    ("bytes_sent", "Bytes sent on the link"),
    ("bytes_received", "Bytes received on the link"),
)


class _ReplicationCollector(Collector):
    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        yield from self._links()
        yield from self._lags()

    def _links(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        labels = ["instance", "peer", "transport"]
        up = GaugeMetricFamily("factstream_replication_link_up", "1 while the replication link is up", labels=labels)
        counters = {
            name: CounterMetricFamily(f"factstream_replication_{name}", text, labels=labels)
            for name, text in _LINK_COUNTERS
        }
        for source in list(_links):
            seen: set[tuple[str, str]] = set()
            for stats in source.links():
                if (stats.peer, stats.transport) in seen:
                    continue  # one series per peer: the live link, not an older closed one
                seen.add((stats.peer, stats.transport))
                key = [source.instance_name, stats.peer, stats.transport]
                up.add_metric(key, 1 if stats.up else 0)
                for name, family in counters.items():
                    family.add_metric(key, getattr(stats, name))
        yield up
        yield from counters.values()

    def _lags(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        labels = ["instance", "stream", "writer"]
        position = GaugeMetricFamily(
            "factstream_replication_writer_position", "The newest position heard from the writer", labels=labels
        )
        lag_positions = GaugeMetricFamily(
            "factstream_replication_lag_positions", "Announced positions of the writer not yet applied", labels=labels
        )
        lag_seconds = GaugeMetricFamily(
            "factstream_replication_lag_seconds",
            "Age of the oldest announced position of the writer not yet applied",
            labels=labels,
        )
        per_stream = ["instance", "stream"]
        pages = CounterMetricFamily(
            "factstream_replication_catchup_pages", "Pages read from the database to catch up", labels=per_stream
        )
        rows = CounterMetricFamily(
            "factstream_replication_catchup_rows", "Rows read from the database to catch up", labels=per_stream
        )
        for source in list(_lags):
            me = source.instance_name
            for lag in source.lags():
                key = [me, lag.stream, lag.writer]
                position.add_metric(key, lag.writer_position)
                lag_positions.add_metric(key, lag.lag_positions)
                lag_seconds.add_metric(key, lag.lag_seconds)
            for stream, (page_count, row_count) in sorted(source.catch_ups().items()):
                pages.add_metric([me, stream], page_count)
                rows.add_metric([me, stream], row_count)
        yield from (position, lag_positions, lag_seconds, pages, rows)


_COLLECTOR = _ReplicationCollector()


def register() -> None:
    """Register the replication collector in the default registry (once per process)."""
    metrics.register(_COLLECTOR)
