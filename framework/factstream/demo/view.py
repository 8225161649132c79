"""What the demo shows while its story plays: per instance and stream, the writer's position, what
each instance has seen, the replication lag, the cache invalidations applied, and the worker's
``/sync`` long poll waking.

A :class:`Monitor` thread reads the instances' public endpoints (``/streams``, ``/metrics``,
``/health``) a few times a second into a :class:`Snapshot`; :func:`render` draws the board for rich's
``Live``. When stdout is not a terminal, the story's lines are printed as they happen instead.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from factstream.demo.client import Client
from factstream.demo.cluster import DemoError


def parse_metrics(text: str, name: str) -> dict[tuple[tuple[str, str], ...], float]:
    """The samples of metric ``name`` in Prometheus text: labels (sorted pairs) -> value."""
    samples: dict[tuple[tuple[str, str], ...], float] = {}
    for line in text.splitlines():
        if not line.startswith(name) or line.startswith("#"):
            continue
        head, _, value = line.rpartition(" ")
        metric, _, labels = head.partition("{")
        if metric != name:
            continue
        pairs = []
        for part in labels.rstrip("}").split('",'):
            key, sep, val = part.partition('="')
            if sep:
                pairs.append((key.strip(","), val.rstrip('"')))
        samples[tuple(sorted(pairs))] = float(value)
    return samples


@dataclass
class StreamView:
    """One stream as one instance sees it."""

    positions: dict[str, int]
    current_token: int


@dataclass
class InstanceView:
    name: str
    streams: dict[str, StreamView] = field(default_factory=dict)
    writers: dict[str, list[str]] = field(default_factory=dict)
    invalidations: float = 0.0
    wakeups: float = 0.0
    connected: bool = False
    error: str = ""


@dataclass
class Snapshot:
    instances: dict[str, InstanceView] = field(default_factory=dict)
    taken: float = 0.0

    def writer_position(self, stream: str) -> int:
        """The stream's position at its writers (the highest any instance has seen of them)."""
        best = 0
        for inst in self.instances.values():
            view = inst.streams.get(stream)
            if view is not None:
                best = max(best, max(view.positions.values(), default=0))
        return best

    def streams(self) -> list[str]:
        names: set[str] = set()
        for inst in self.instances.values():
            names |= set(inst.streams)
        return sorted(names)


def read_instance(name: str, client: Client, public: Client) -> InstanceView:
    view = InstanceView(name)
    body = client.get("/streams", timeout=5)
    for s in body["streams"] if isinstance(body, dict) else body:
        positions = {w: int(p) for w, p in (s.get("positions") or {}).items()}
        view.streams[s["name"]] = StreamView(positions, int(s.get("current_token") or 0))
        view.writers[s["name"]] = s.get("writers") if isinstance(s.get("writers"), list) else []
    metrics = public.get("/metrics", timeout=5, raw=True)
    view.invalidations = sum(parse_metrics(metrics, "factstream_cache_invalidations_total").values()) or sum(
        parse_metrics(metrics, "factstream_cache_invalidations").values()
    )
    view.wakeups = sum(parse_metrics(metrics, "factstream_sync_wakeups_total").values())
    health = public.get("/health", timeout=5)
    view.connected = bool((health.get("replication") or {}).get("connected"))
    return view


class Board:
    """What the story tells and the monitor measures, shared between their threads."""

    def __init__(self, plain: Any = None) -> None:
        self._lock = threading.Lock()
        self.lines: deque[str] = deque(maxlen=9)
        self.wakes: deque[str] = deque(maxlen=4)
        self.snapshot = Snapshot()
        self.title = "factstream demo"
        #: ``print`` of plain lines when stdout is not a terminal (None: only the live view).
        self.plain = plain

    def say(self, line: str) -> None:
        with self._lock:
            self.lines.append(line)
        if self.plain is not None:
            self.plain(line)

    def woke(self, line: str) -> None:
        with self._lock:
            self.wakes.append(line)
        if self.plain is not None:
            self.plain(line)

    def set_snapshot(self, snapshot: Snapshot) -> None:
        with self._lock:
            self.snapshot = snapshot

    def state(self) -> tuple[list[str], list[str], Snapshot]:
        with self._lock:
            return list(self.lines), list(self.wakes), self.snapshot


def positions_table(snapshot: Snapshot) -> Table:
    """Per stream: its writer's position, what main and the worker have seen, the worker's lag."""
    names = list(snapshot.instances)
    table = Table(title="streams (from each instance's /streams)", title_justify="left", expand=False)
    table.add_column("stream")
    table.add_column("writer position", justify="right")
    for name in names:
        table.add_column(f"{name} has seen", justify="right")
    table.add_column("lag", justify="right")
    for stream in snapshot.streams():
        top = snapshot.writer_position(stream)
        seen = []
        for name in names:
            view = snapshot.instances[name].streams.get(stream)
            seen.append(max(view.positions.values(), default=0) if view else 0)
        lag = top - min(seen, default=top)
        table.add_row(stream, str(top), *map(str, seen), Text(str(lag), style="green" if lag == 0 else "yellow"))
    return table


def instances_table(snapshot: Snapshot) -> Table:
    table = Table(title="instances (/health, /metrics)", title_justify="left")
    for col in ("instance", "replication", "cache invalidations applied", "/sync wake-ups"):
        table.add_column(col, justify="left" if col in ("instance", "replication") else "right")
    for inst in snapshot.instances.values():
        link = "[red]" + inst.error + "[/red]" if inst.error else ("connected" if inst.connected else "-")
        table.add_row(inst.name, link, f"{inst.invalidations:.0f}", f"{inst.wakeups:.0f}")
    return table


def render(board: Board) -> RenderableType:
    lines, wakes, snapshot = board.state()
    story = Text("\n".join(lines) or "starting...")
    woke = Text("\n".join(wakes) or "(waiting for the first wake-up)", style="cyan")
    return Group(
        Text(board.title, style="bold"),
        positions_table(snapshot),
        instances_table(snapshot),
        Text("bob's /sync long poll on the worker:", style="bold"),
        woke,
        Text("story:", style="bold"),
        story,
    )


class Monitor(threading.Thread):
    """Reads every instance's endpoints every ``interval`` seconds into the board's snapshot."""

    def __init__(self, board: Board, clients: dict[str, tuple[Client, Client]], interval: float = 0.25) -> None:
        super().__init__(name="demo-monitor", daemon=True)
        self.board = board
        self.clients = clients
        self.interval = interval
        self.stopping = threading.Event()

    def poll(self) -> Snapshot:
        snapshot = Snapshot(taken=time.monotonic())
        for name, (client, public) in self.clients.items():
            try:
                snapshot.instances[name] = read_instance(name, client, public)
            except (DemoError, KeyError, ValueError, TypeError) as exc:
                snapshot.instances[name] = InstanceView(name, error=str(exc)[:80])
        self.board.set_snapshot(snapshot)
        return snapshot

    def run(self) -> None:
        while not self.stopping.wait(self.interval):
            self.poll()

    def stop(self) -> None:
        self.stopping.set()
        self.join(5)
