"""Health that tells the truth: whether this instance can do its work, and if not, why.

:func:`check_health` answers ``ok``, or ``degraded`` with one :class:`Reason` per problem:

* ``replication_link_down``: a link this instance depends on (its TCP connection to the main
  instance, or its Redis connection) has been down longer than ``health.link_grace_seconds``. A
  reconnection within the grace period is not a problem; rows missed meanwhile are caught up from
  the database. Inbound links of the main instance are not counted: a worker that stops is that
  worker's problem (its own ``/health`` says so), not the main instance's.
* ``writer_stalled``: this instance writes a stream and holds unfinished IDs (reserved, not yet
  committed or rolled back) that have not moved for ``health.writer_stall_seconds``: its position
  cannot pass them, so every reader of the stream waits. "Not moved" means the oldest unfinished ID
  and this writer's position stayed the same; it is measured from the first check that saw them
  (checks run on every ``/health`` request and every ``/metrics`` scrape).
* ``database_unreachable``: a ``SELECT 1`` on the pool failed or took longer than
  ``health.database_timeout_seconds``.

``/health`` answers 200 or 503 from this (``factstream.host.routes``); the collector registered by
:func:`register` exports ``factstream_health_degraded`` and ``factstream_health_reason`` per code,
the database's from the last ``/health`` check (a scrape does not query the database).
"""

from __future__ import annotations

import asyncio
import time
import weakref
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from factstream import metrics
from factstream.idgen.generator import MultiWriterIdGenerator

if TYPE_CHECKING:
    from factstream.host.parts import HostParts

LINK_DOWN = "replication_link_down"
WRITER_STALLED = "writer_stalled"
DATABASE_UNREACHABLE = "database_unreachable"
#: Every reason's code, in the order a body lists them.
CODES = (LINK_DOWN, WRITER_STALLED, DATABASE_UNREACHABLE)


@dataclass(frozen=True)
class Reason:
    """One problem: a stable ``code`` to alert on, a sentence for people, and the numbers behind it."""

    code: str
    message: str
    details: dict[str, Any] = field(default_factory=dict)

    def as_json(self) -> dict[str, Any]:
        return {"code": self.code, "message": self.message, "details": self.details}


@dataclass(frozen=True)
class Health:
    status: Literal["ok", "degraded"]
    reasons: list[Reason]

    @property
    def degraded(self) -> bool:
        return self.status == "degraded"

    def as_json(self) -> dict[str, Any]:
        return {"status": self.status, "reasons": [reason.as_json() for reason in self.reasons]}


class _StallWatch:
    """Per stream this instance writes: since when its unfinished IDs have looked the same."""

    def __init__(self) -> None:
        self.seen: dict[str, tuple[tuple[int, int], float]] = {}

    def stalled(self, host: HostParts, now: float) -> list[Reason]:
        limit = host.settings.health.writer_stall_seconds
        reasons = []
        for name, stream in host.streams.items():
            gen = stream.id_gen
            if not isinstance(gen, MultiWriterIdGenerator) or not gen.is_writer:
                continue  # a kept stream's writer completes every position as it takes it
            unfinished = gen.tracker.unfinished
            if not unfinished:
                self.seen.pop(name, None)
                continue
            state = (min(unfinished), stream.current_token(host.instance_name))
            previous = self.seen.get(name)
            if previous is None or previous[0] != state:
                self.seen[name] = (state, now)
                continue
            still = now - previous[1]
            if still >= limit:
                details = {
                    "stream": name,
                    "oldest_unfinished": state[0],
                    "unfinished": len(unfinished),
                    "position": state[1],
                    "stalled_seconds": round(still, 1),
                }
                message = (
                    f"stream {name}: {len(unfinished)} unfinished ID(s) here, the oldest {state[0]}, "
                    f"have not moved for {still:.0f}s (the position is held at {state[1]})"
                )
                reasons.append(Reason(WRITER_STALLED, message, details))
        return reasons


_watches: weakref.WeakKeyDictionary[Any, _StallWatch] = weakref.WeakKeyDictionary()
#: The last database check's reason (None: reachable), per host.
_database: weakref.WeakKeyDictionary[Any, Reason | None] = weakref.WeakKeyDictionary()
_hosts: weakref.WeakSet[Any] = weakref.WeakSet()


def link_reasons(host: HostParts, now: float) -> list[Reason]:
    """A reason per outbound link down longer than ``health.link_grace_seconds`` at ``now`` (``time.time()``)."""
    transport = host.transport
    if transport is None:
        return []
    grace = host.settings.health.link_grace_seconds
    reasons = []
    for link in transport.links():
        down = link.down_for(now)
        if link.direction != "outbound" or link.up or down <= grace:
            continue
        details = {"peer": link.peer, "transport": link.transport, "down_seconds": round(down, 1)}
        message = f"the {link.transport} replication link to {link.peer} has been down for {down:.0f}s"
        reasons.append(Reason(LINK_DOWN, message, details))
    return reasons


def stall_reasons(host: HostParts, now: float) -> list[Reason]:
    watch = _watches.get(host)
    if watch is None:
        watch = _watches[host] = _StallWatch()
    return watch.stalled(host, now)


async def database_reason(host: HostParts) -> Reason | None:
    """``SELECT 1`` on the pool within ``health.database_timeout_seconds``; a reason if it fails."""
    timeout = host.settings.health.database_timeout_seconds
    reason: Reason | None = None
    started = time.monotonic()
    try:
        async with asyncio.timeout(timeout):
            await host.db.fetchall("SELECT 1")
    except TimeoutError:
        message = f"SELECT 1 took longer than {timeout:g}s"
        reason = Reason(DATABASE_UNREACHABLE, message, {"timeout_seconds": timeout})
    except Exception as exc:
        details = {"error": f"{type(exc).__name__}: {exc}"[:300], "seconds": round(time.monotonic() - started, 3)}
        reason = Reason(DATABASE_UNREACHABLE, f"SELECT 1 failed: {details['error']}", details)
    _database[host] = reason
    return reason


async def check_health(host: HostParts, now: float) -> Health:
    """This instance's health at ``now`` (``time.time()``): every reason that holds, in :data:`CODES` order."""
    track(host)
    reasons = link_reasons(host, now) + stall_reasons(host, now)
    database = await database_reason(host)
    if database is not None:
        reasons.append(database)
    return Health("degraded" if reasons else "ok", reasons)


def track(host: HostParts) -> None:
    """Export ``host``'s health in ``/metrics`` (the first check does this) until :func:`forget`."""
    _hosts.add(host)


def forget(host: HostParts) -> None:
    """Stop exporting ``host``'s health (it is stopping)."""
    _hosts.discard(host)


class _HealthCollector(Collector):
    def collect(self) -> Iterator[GaugeMetricFamily]:
        degraded = GaugeMetricFamily(
            "factstream_health_degraded", "1 while /health reports degraded", labels=["instance"]
        )
        reason = GaugeMetricFamily(
            "factstream_health_reason", "1 while the reason holds (see /health)", labels=["instance", "code"]
        )
        now = time.time()
        for host in list(_hosts):
            reasons = link_reasons(host, now) + stall_reasons(host, now)
            database = _database.get(host)
            if database is not None:
                reasons.append(database)
            codes = {r.code for r in reasons}
            degraded.add_metric([host.instance_name], 1 if codes else 0)
            for code in CODES:
                reason.add_metric([host.instance_name, code], 1 if code in codes else 0)
        yield from (degraded, reason)


_COLLECTOR = _HealthCollector()


def register() -> None:
    """Register the health collector in the default registry (once per process)."""
    metrics.register(_COLLECTOR)
