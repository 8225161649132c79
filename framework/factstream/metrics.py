"""Registering the core's Prometheus collectors: when what they measure comes to life, never on import.

``import factstream`` (a plugin, a tool, a test that only wants the types) leaves
``prometheus_client``'s default registry as it found it. Each module that measures something
declares its metrics unregistered (``Counter(..., registry=None)``, a ``Collector`` object) and hands
them to :func:`register` where the thing it measures starts: the host when it starts
(``factstream.host.app``), an ID generator when it starts and a cache registry when it is made (so
that a generator used outside a host, in a tool or a test, is measured as before). Each collector is
registered once per process, however many hosts, generators and registries start.
"""

from __future__ import annotations

from prometheus_client import REGISTRY
from prometheus_client.registry import Collector

_registered: set[Collector] = set()


def register(*collectors: Collector) -> None:
    """Register each of ``collectors`` in the default registry, unless this process already did."""
    for collector in collectors:
        if collector not in _registered:
            REGISTRY.register(collector)
            _registered.add(collector)
