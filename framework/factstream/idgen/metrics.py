"""Prometheus metrics of the ID generators, read from the live generators at scrape time.

Registered when the first generator starts (:func:`track`) or a host starts (:func:`register`),
not when this module is imported (see :mod:`factstream.metrics`).
"""

from __future__ import annotations

import weakref
from collections.abc import Iterator
from typing import Protocol

from prometheus_client import Counter
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from factstream import metrics
from factstream.idgen.positions import PositionTracker


class MeteredGenerator(Protocol):
    """What the collector reads of a live ID generator (``MultiWriterIdGenerator`` is one).

    Defined here rather than importing the generator, which imports this module to count repairs:
    the metrics sit below the generator, never beside it in a cycle.
    """

    stream_name: str
    instance_name: str
    _tracker: PositionTracker | None

    def get_current_token(self) -> int: ...

    def get_current_token_for_writer(self, instance: str) -> int: ...

    def get_slowest_writer_token(self) -> int: ...


_live: weakref.WeakSet[MeteredGenerator] = weakref.WeakSet()

SEQUENCE_REPAIRS = Counter(
    "factstream_sequence_repairs",
    "Times a stream sequence was found behind IDs already used and moved forward (at start-up or while running)",
    ["stream"],
    registry=None,
)

#: Counted with a repair (so also in ``SEQUENCE_REPAIRS``) each time a running writer refuses IDs.
SEQUENCE_REISSUES = Counter(
    "factstream_sequence_reissues",
    "Times a running writer was handed a stream ID at or below one it had already seen allocated "
    "(the sequence went back, as after a failover), refused it, repaired the sequence and retried",
    ["stream"],
    registry=None,
)


def count_stream(stream: str) -> None:
    """Show a started stream's counters at 0 on ``/metrics`` before anything has happened."""
    SEQUENCE_REPAIRS.labels(stream=stream)
    SEQUENCE_REISSUES.labels(stream=stream)


def track(gen: MeteredGenerator) -> None:
    register()
    _live.add(gen)


def untrack(gen: MeteredGenerator) -> None:
    _live.discard(gen)


class _GeneratorCollector(Collector):
    def collect(self) -> Iterator[GaugeMetricFamily]:
        position = GaugeMetricFamily(
            "factstream_stream_position",
            "A writer's position as this instance sees it",
            labels=["stream", "writer", "instance"],
        )
        watermark = GaugeMetricFamily(
            "factstream_stream_persisted_upto", "Every fact at or below this is complete", labels=["stream", "instance"]
        )
        unfinished = GaugeMetricFamily(
            "factstream_stream_unfinished_ids", "IDs reserved here and not yet completed", labels=["stream", "instance"]
        )
        in_flight = GaugeMetricFamily(
            "factstream_stream_in_flight_fetches", "Sequence calls in progress here", labels=["stream", "instance"]
        )
        minimum = GaugeMetricFamily(
            "factstream_stream_min_position",
            "The lowest position of the stream's writers as this instance sees them (the slowest writer)",
            labels=["stream", "instance"],
        )
        for gen in list(_live):
            tracker = gen._tracker
            if tracker is None:
                continue
            me = gen.instance_name
            positions = {
                writer: gen.get_current_token_for_writer(writer) for writer in sorted(set(tracker.positions()) | {me})
            }
            for writer, at in positions.items():
                position.add_metric([gen.stream_name, writer, me], at)
            minimum.add_metric([gen.stream_name, me], gen.get_slowest_writer_token())
            watermark.add_metric([gen.stream_name, me], gen.get_current_token())
            unfinished.add_metric([gen.stream_name, me], len(tracker.unfinished))
            in_flight.add_metric([gen.stream_name, me], tracker.in_flight)
        yield from (position, minimum, watermark, unfinished, in_flight)


_COLLECTOR = _GeneratorCollector()


def register() -> None:
    """Register the generators' collector and counters in the default registry (once per process)."""
    metrics.register(_COLLECTOR, SEQUENCE_REPAIRS, SEQUENCE_REISSUES)
