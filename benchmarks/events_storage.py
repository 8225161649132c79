"""Room event storage (the bundled ``events`` plugin) on a real ``Host``, each figure beside a baseline
measured in the same run.

One host (instance ``main``, writer of ``events`` and ``backfill``) in this process; its Python API
(``host.api.state(EventsStore)``) is what is measured. Remote events are made here as a remote server
would make them: room version 10, ``hashes.sha256`` set, a signature, no ``event_id`` (the store
computes each ID from the reference hash), each event's ``prev_events`` the event before it.

* **local**: one ``m.room.message`` per transaction through ``EventsStore.send`` (the server picks
  prev_events, depth and the ID, the local policy checks it). Baseline: plain synchronous psycopg
  building the event (``json.dumps`` with sorted keys, SHA-256 for its ID) and writing the same rows
  in one transaction: ``nextval``, the ``events`` row, its JSON, its edge, the forward extremity
  replaced, the room's row updated; into copies of those tables (``CREATE TABLE ... LIKE ... INCLUDING
  ALL``). Alternating rounds, as in ``idgen_append``. Target: >= 0.8x.
* **remote**: batches of 100 events through ``EventsStore.persist_remote`` (95 messages and 5 joins of
  new members per batch), made before the clock starts. Baseline: psycopg writing the same rows per
  batch (``executemany`` per table, nothing parsed or hashed). Target: >= 20,000 events/s.
* **state**: a room where 10,000 members join (remote batches of 100), then 2,000 of them leave one per
  transaction (``change_membership``); ``state_groups`` rows, delta entries and bytes written per
  change, beside the reference's model (1 + S/100 rows per change, S members). Target: <= 2 rows per
  change. Then ``reads.state_ids(room, at=...)`` for random events of the room, twice: with the
  process's state cache emptied (``StateStore.forget()``) before each sample, and with the cache as it
  is (its default size holds about 100 of the room's 12,000 states). Target: p99 <= 5 ms.
* **messages**: a 200,000-event room (history visibility ``joined``; a new member joins every 50
  events; the reader joins at event 100,000); ``reads.messages(reader, room, from_token=t..., limit=50)``
  backwards from random events of the room, half of them before the reader's join (pages it may see
  nothing of). Target: p99 <= 10 ms.
* **recent**: a reader in 2,000 rooms (300 events each, the reader left 10% of them halfway), filler
  rooms until the database holds 1,000,000 events; the last batches of the rooms land in random
  order. ``reads.recent(reader, rooms=20, limit=10)``, against two per-room baselines: one query per
  room of the reader's 2,000 (its newest 10 events the reader may see, then the top 20 formatted by
  ``reads.for_user``); and the top 20 ranked from ``rooms.last_stream_ordering`` first, then one query
  per room. Target: p99 <= 20 ms and >= 10x the per-room baseline.

Every build is timed and bounded (``setup_seconds`` each); a build that runs out of time skips its
measurement with a note. ``scale`` shrinks every size (1.0: the issue's sizes).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import hashlib
import json
import os
import random
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg

from factstream.db.engine import libpq_url
from factstream.host.app import Host, freeze_startup_heap
from factstream.testing import HostCluster

ROOM_VERSION = "10"
SERVER = "remote.example"
BATCH = 100
#: What a remote event carries as its signature (its bytes are not checked here).
_SIGNATURE = base64.b64encode(hashlib.sha512(b"bench").digest()).decode().rstrip("=")
_MEMBER = "m.room.member"

Emit = Callable[[str], None]


class SetupTimeout(Exception):
    """A build ran out of its time."""


# -- remote events ---------------------------------------------------------------------------------------

_TOP_KEPT = frozenset(
    {
        "event_id", "type", "room_id", "sender", "state_key", "content", "hashes", "depth", "prev_events",
        "auth_events", "origin_server_ts", "origin", "membership", "prev_state",
    }
)  # fmt: skip
_CONTENT_KEPT = {
    "m.room.member": {"membership"},
    "m.room.create": {"creator"},
    "m.room.join_rules": {"join_rule"},
    "m.room.history_visibility": {"history_visibility"},
    "m.room.power_levels": {"ban", "events", "events_default", "kick", "redact", "state_default", "users",
                            "users_default"},
}  # fmt: skip


def _canonical(value: Any) -> bytes:
    """Canonical JSON of the generator's own values (ASCII text, small integers: nothing to refuse)."""
    return json.dumps(value, ensure_ascii=False, sort_keys=True, separators=(",", ":")).encode()


def _b64(digest: bytes, url_safe: bool = False) -> str:
    return (base64.urlsafe_b64encode(digest) if url_safe else base64.b64encode(digest)).rstrip(b"=").decode()


def _power_levels(creator: str) -> dict[str, Any]:
    return {
        "users": {creator: 100}, "users_default": 0, "events_default": 0, "state_default": 50, "ban": 50,
        "kick": 50, "redact": 50, "invite": 0, "events": {},
    }  # fmt: skip


class RemoteRoom:
    """A room as a remote server writes it: room version 10 events with reference-hash IDs, linear.

    The hashes are computed here with a short version of the plugin's rules for the events this
    generator makes; the first events of each type are checked against ``factstream_events.rules.eventid``.
    """

    checked: set[str] = set()

    def __init__(self, creator: str, *, room_id: str | None = None) -> None:
        self.room_id = room_id or f"!{os.urandom(9).hex()}:{SERVER}"
        self.creator = creator
        self.prev: list[str] = []
        self.depth = 0
        self.ts = 1_700_000_000_000
        self.create_id: str | None = None
        self.pl_id: str | None = None
        self.members: dict[str, str] = {}

    def event(self, event_type: str, sender: str, content: dict[str, Any], state_key: str | None = None) -> bytes:
        self.depth += 1
        auth = [e for e in (self.create_id, self.pl_id, self.members.get(sender)) if e is not None]
        event: dict[str, Any] = {
            "auth_events": auth,
            "content": content,
            "depth": self.depth,
            "origin": SERVER,
            "origin_server_ts": self.ts + self.depth,
            "prev_events": self.prev,
            "room_id": self.room_id,
            "sender": sender,
            "type": event_type,
        }
        if state_key is not None:
            event["state_key"] = state_key
        event["hashes"] = {"sha256": _b64(hashlib.sha256(_canonical(event)).digest())}
        kept = _CONTENT_KEPT.get(event_type, ())
        pruned = {k: v for k, v in event.items() if k in _TOP_KEPT}
        pruned["content"] = {k: v for k, v in content.items() if k in kept}
        event_id = "$" + _b64(hashlib.sha256(_canonical(pruned)).digest(), url_safe=True)
        event["signatures"] = {SERVER: {"ed25519:key1": _SIGNATURE}}
        if event_type not in RemoteRoom.checked:
            from factstream_events.rules.eventid import event_id_for

            assert event_id_for(event, ROOM_VERSION) == event_id, "the generator's hash rules drifted"
            RemoteRoom.checked.add(event_type)
        self.prev = [event_id]
        if event_type == "m.room.create":
            self.create_id = event_id
        elif event_type == "m.room.power_levels":
            self.pl_id = event_id
        elif event_type == _MEMBER and state_key is not None:
            self.members[state_key] = event_id
        return json.dumps(event, separators=(",", ":")).encode()

    def start(self, history_visibility: str = "shared") -> list[bytes]:
        c = self.creator
        return [
            self.event("m.room.create", c, {"creator": c, "room_version": ROOM_VERSION}, ""),
            self.event(_MEMBER, c, {"membership": "join", "displayname": "creator"}, c),
            self.event("m.room.power_levels", c, _power_levels(c), ""),
            self.event("m.room.join_rules", c, {"join_rule": "public"}, ""),
            self.event("m.room.history_visibility", c, {"history_visibility": history_visibility}, ""),
        ]

    def member(self, user: str, membership: str) -> bytes:
        return self.event(_MEMBER, user, {"membership": membership}, user)

    def message(self, sender: str, n: int) -> bytes:
        body = f"message {n}: the quick brown fox jumps over the lazy dog"
        return self.event("m.room.message", sender, {"msgtype": "m.text", "body": body})


# -- the host ----------------------------------------------------------------------------------------------


@contextlib.asynccontextmanager
async def events_host(url: str, **config: Any) -> AsyncIterator[Host]:
    """One started host writing ``events`` and ``backfill`` on ``url`` (an already migrated database);
    ``config``: configuration sections of the host (``http={...}``)."""
    with tempfile.TemporaryDirectory(prefix="factstream-events-bench-") as state:
        cluster = HostCluster(Path(state), database=url, instances=("main",)).configure(**config)
        try:
            host = await cluster("main")
            freeze_startup_heap()
            yield host
        finally:
            await cluster.close()


def store_of(host: Host) -> Any:
    from factstream_events import EventsStore

    return host.api.state(EventsStore)


async def persist(store: Any, room_id: str, raws: Sequence[bytes], **kw: Any) -> Any:
    from factstream_events.store import RemoteEvent

    # The version is given, as a server receiving a federation transaction knows it.
    return await store.persist_remote(room_id, [RemoteEvent(r) for r in raws], room_version=ROOM_VERSION, **kw)


class Clock:
    """A build's time budget, and its progress lines."""

    def __init__(self, name: str, seconds: float, emit: Emit) -> None:
        self.name = name
        self.start = time.monotonic()
        self.deadline = self.start + seconds
        self.seconds = seconds
        self.emit = emit
        self._last = self.start

    def check(self, what: str, force: bool = False) -> None:
        now = time.monotonic()
        if now > self.deadline:
            raise SetupTimeout(f"{self.name}: setup ran out of its {self.seconds:g} s at {what}")
        if force or now - self._last >= 10:
            self._last = now
            self.emit(f"  .. {self.name}: {what} ({now - self.start:.0f} s)")

    @property
    def elapsed(self) -> float:
        return time.monotonic() - self.start


def pct(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def ms(values: Sequence[float]) -> str:
    return f"p50 {pct(values, 0.5) * 1000:6.2f} ms  p99 {pct(values, 0.99) * 1000:6.2f} ms"


def verdict(ok: bool) -> str:
    return "holds" if ok else "MISSED"


# -- baseline tables ----------------------------------------------------------------------------------------

_BASE_TABLES = ("rooms", "events", "event_json", "event_edges", "event_forward_extremities")


def prepare_baseline(url: str) -> None:
    """Copies of the tables the baselines write (same columns, indexes and defaults), and a sequence."""
    with psycopg.connect(libpq_url(url), autocommit=True) as conn:
        for table in _BASE_TABLES:
            conn.execute(f"DROP TABLE IF EXISTS bench_{table}")
            conn.execute(f"CREATE TABLE bench_{table} (LIKE {table} INCLUDING ALL)")
        conn.execute("DROP SEQUENCE IF EXISTS bench_events_seq")
        conn.execute("CREATE SEQUENCE bench_events_seq")


_B_EVENT = """
INSERT INTO bench_events (event_id, room_id, stream_ordering, instance_name, topological_ordering, type, state_key,
    sender, origin_server_ts, received_ts, outlier, backfilled, state_group, visibility, membership,
    prev_membership, redacts, relates_to, redacted_by)
VALUES (%(event_id)s, %(room_id)s, %(stream)s, 'main', %(depth)s, %(type)s, %(state_key)s, %(sender)s,
    %(ts)s, %(ts)s, FALSE, FALSE, %(state_group)s, 'shared', %(membership)s, NULL, NULL, NULL, NULL)
"""
_B_JSON = "INSERT INTO bench_event_json (event_id, room_id, json) VALUES (%(event_id)s, %(room_id)s, %(json)s)"
_B_EDGE = (
    "INSERT INTO bench_event_edges (event_id, prev_event_id, room_id) VALUES (%(event_id)s, %(prev)s, %(room_id)s)"
)
_B_DROP_FWD = "DELETE FROM bench_event_forward_extremities WHERE room_id = %(room_id)s"
_B_ADD_FWD = "INSERT INTO bench_event_forward_extremities (room_id, event_id) VALUES (%(room_id)s, %(event_id)s)"
_B_ROOM = """
UPDATE bench_rooms SET writes = writes + 1, last_stream_ordering = %(stream)s, last_event_id = %(event_id)s
WHERE room_id = %(room_id)s
"""


def _baseline_room(conn: psycopg.Connection[Any], room_id: str) -> None:
    conn.execute(
        "INSERT INTO bench_rooms (room_id, room_version, creator, is_local, created_ts, current_state_group)"
        " VALUES (%s, '10', '@bench:local', TRUE, 0, 1)",
        (room_id,),
    )
    conn.execute(
        "INSERT INTO bench_event_forward_extremities (room_id, event_id) VALUES (%s, '$start')",
        (room_id,),
    )
    conn.commit()


@dataclass
class Rate:
    name: str
    count: int = 0
    seconds: float = 0.0
    rounds: list[float] = field(default_factory=list)

    def add(self, count: int, seconds: float) -> None:
        self.count += count
        self.seconds += seconds
        self.rounds.append(count / seconds if seconds else 0.0)

    @property
    def rate(self) -> float:
        return self.count / self.seconds if self.seconds else 0.0


# -- a. a local message, one per transaction -----------------------------------------------------------------


def baseline_local(url: str, room_id: str, seconds: float, state: dict[str, Any]) -> tuple[int, float]:
    """Plain psycopg: build the event, write its rows in one transaction; as many as fit in ``seconds``."""
    n = 0
    with psycopg.connect(libpq_url(url)) as conn:
        start = time.perf_counter()
        stop = start + seconds
        while time.perf_counter() < stop:
            ts = int(time.time() * 1000)
            prev = state["prev"]
            event = {
                "room_id": room_id,
                "type": "m.room.message",
                "sender": "@bench:local",
                "content": {"msgtype": "m.text", "body": f"hello {state['n']}"},
                "origin_server_ts": ts,
                "prev_events": [prev],
                "depth": state["depth"],
                "auth_events": state["auth"],
            }
            raw = json.dumps(event, ensure_ascii=False, sort_keys=True, separators=(",", ":")).encode()
            event_id = "$" + _b64(hashlib.sha256(raw).digest(), url_safe=True)
            (stream,) = conn.execute("SELECT nextval('bench_events_seq')").fetchone()  # type: ignore[misc]
            row = {
                "event_id": event_id, "room_id": room_id, "stream": stream, "depth": state["depth"],
                "type": "m.room.message", "state_key": None, "sender": "@bench:local", "ts": ts,
                "state_group": 1, "membership": None, "json": raw, "prev": prev,
            }  # fmt: skip
            conn.execute(_B_EVENT, row)
            conn.execute(_B_JSON, row)
            conn.execute(_B_EDGE, row)
            conn.execute(_B_DROP_FWD, row)
            conn.execute(_B_ADD_FWD, row)
            conn.execute(_B_ROOM, row)
            conn.commit()
            state["prev"], state["depth"], state["n"] = event_id, state["depth"] + 1, state["n"] + 1
            n += 1
        return n, time.perf_counter() - start


async def bench_local(host: Host, url: str, seconds: float, emit: Emit, rounds: int = 4) -> None:
    store = store_of(host)
    room_id = await store.create_room("@bench:local", preset="public_chat")
    base_room = "!baseline-local:local"
    with psycopg.connect(libpq_url(url)) as conn:
        _baseline_room(conn, base_room)
    state: dict[str, Any] = {"prev": "$start", "depth": 6, "n": 0, "auth": ["$c", "$p", "$m"]}
    base, ours = Rate("baseline psycopg"), Rate("EventsStore.send")
    counter = 0
    for _ in range(rounds):
        n, dt = await asyncio.to_thread(baseline_local, url, base_room, seconds / rounds, state)
        base.add(n, dt)
        loop = asyncio.get_running_loop()
        start = time.perf_counter()
        stop = loop.time() + seconds / rounds
        n = 0
        while loop.time() < stop:
            await store.send(room_id, "@bench:local", "m.room.message", {"msgtype": "m.text", "body": f"hi {counter}"})
            counter += 1
            n += 1
        ours.add(n, time.perf_counter() - start)
    ratio = ours.rate / base.rate
    emit(f"{'baseline psycopg, one message per transaction':52s} {base.rate:9,.0f} events/s")
    emit(
        f"{'EventsStore.send, one message per transaction':52s} {ours.rate:9,.0f} events/s  {ratio:5.2f}x baseline "
        f"(target >= 0.8x: {verdict(ratio >= 0.8)}; rounds "
        f"{min(o / b for o, b in zip(ours.rounds, base.rounds, strict=True)):.2f}x-"
        f"{max(o / b for o, b in zip(ours.rounds, base.rounds, strict=True)):.2f}x)"
    )


# -- b. remote batches of 100 ---------------------------------------------------------------------------------


def remote_batches(room: RemoteRoom, count: int, joins_per_batch: int = 5) -> list[list[bytes]]:
    """``count`` batches of :data:`BATCH` events: messages, and ``joins_per_batch`` new members."""
    out = []
    member = len(room.members)
    every = BATCH // joins_per_batch if joins_per_batch else BATCH + 1
    for b in range(count):
        batch = []
        for i in range(BATCH):
            if i % every == every - 1:
                member += 1
                batch.append(room.member(f"@m{member}:{SERVER}", "join"))
            else:
                batch.append(room.message(room.creator, b * BATCH + i))
        out.append(batch)
    return out


def baseline_write_batch(conn: psycopg.Connection[Any], rows: list[dict[str, Any]]) -> None:
    """The baseline's statements for one batch of rows (parsed and hashed beforehand), one transaction."""
    # The IDs themselves, not the first plus an offset: processes drawing at once get interleaved IDs.
    ids = conn.execute("SELECT nextval('bench_events_seq') FROM generate_series(1, %s)", (len(rows),)).fetchall()
    for r, (stream_id,) in zip(rows, ids, strict=True):
        r["stream"] = stream_id
    with conn.cursor() as cur:
        cur.executemany(_B_EVENT, rows)
        cur.executemany(_B_JSON, rows)
        cur.executemany(_B_EDGE, rows)
        cur.execute(_B_DROP_FWD, rows[-1])
        cur.execute(_B_ADD_FWD, rows[-1])
        cur.execute(_B_ROOM, rows[-1])
    conn.commit()


def baseline_remote(url: str, batches: list[list[dict[str, Any]]], seconds: float) -> tuple[int, float]:
    """Plain psycopg: the rows of each batch (parsed and hashed beforehand), one transaction each."""
    n = 0
    with psycopg.connect(libpq_url(url)) as conn:
        start = time.perf_counter()
        stop = start + seconds
        while batches:
            rows = batches.pop(0)
            baseline_write_batch(conn, rows)
            n += len(rows)
            if time.perf_counter() >= stop:
                break
        return n, time.perf_counter() - start


def _baseline_rows(room_id: str, batches: list[list[bytes]], state: dict[str, Any]) -> list[list[dict[str, Any]]]:
    out = []
    for batch in batches:
        rows = []
        for raw in batch:
            event = json.loads(raw)
            event_id = "$" + _b64(hashlib.sha256(raw).digest(), url_safe=True)
            state["n"] += 1
            rows.append(
                {
                    "event_id": event_id, "room_id": room_id, "depth": state["n"], "type": event["type"],
                    "state_key": event.get("state_key"), "sender": event["sender"], "ts": event["origin_server_ts"],
                    "state_group": state["n"], "membership": event["content"].get("membership"), "json": raw,
                    "prev": state["prev"],
                }
            )  # fmt: skip
            state["prev"] = event_id
        out.append(rows)
    return out


class RemoteSender:
    """``rooms`` rooms written at once, each by one task persisting its batches in order (as a server
    receiving federation traffic for several rooms does); batches are made before a round starts."""

    def __init__(self, rooms: int) -> None:
        self.rooms = [RemoteRoom(f"@creator{i}:{SERVER}") for i in range(rooms)]
        self.pending: list[list[list[bytes]]] = [[] for _ in self.rooms]
        self.rate = Rate(f"{rooms} room(s)")

    async def start(self, store: Any) -> None:
        for room in self.rooms:
            await persist(store, room.room_id, room.start())

    def top_up(self, batches: int) -> None:
        for room, pending in zip(self.rooms, self.pending, strict=True):
            pending += remote_batches(room, max(0, batches - len(pending)))

    async def run(self, store: Any, seconds: float) -> None:
        loop = asyncio.get_running_loop()
        stop = loop.time() + seconds
        written = [0] * len(self.rooms)

        async def one(i: int) -> None:
            room, pending = self.rooms[i], self.pending[i]
            while pending and loop.time() < stop:
                batch = pending.pop(0)
                done = await persist(store, room.room_id, batch)
                assert len(done.stored) == len(batch), "every event of a fresh batch is stored"
                written[i] += len(batch)

        start = time.perf_counter()
        await asyncio.gather(*(one(i) for i in range(len(self.rooms))))
        self.rate.add(sum(written), time.perf_counter() - start)


async def bench_remote(host: Host, url: str, seconds: float, emit: Emit, rounds: int = 4) -> None:
    store = store_of(host)
    senders = [RemoteSender(1), RemoteSender(4)]
    for sender in senders:
        await sender.start(store)
        sender.top_up(20)  # a warm-up, then the statistics autovacuum would gather
        await sender.run(store, 3600)
    await analyze(host)
    base_room = "!baseline-remote:local"
    with psycopg.connect(libpq_url(url)) as conn:
        _baseline_room(conn, base_room)
    base_state: dict[str, Any] = {"n": 0, "prev": "$start"}
    base = Rate("baseline")
    per_round = max(2, int(seconds / rounds * 40_000 / BATCH))  # more than a round can use at 40,000/s
    base_pending: list[list[dict[str, Any]]] = []
    for _ in range(rounds):
        base_pending += _baseline_rows(base_room, remote_batches(RemoteRoom("@b:local"), per_round), base_state)
        n, dt = await asyncio.to_thread(baseline_remote, url, base_pending, seconds / rounds)
        base.add(n, dt)
        for sender in senders:
            sender.top_up(max(2, per_round // len(sender.rooms)))
            await sender.run(store, seconds / rounds)
    emit(f"{'baseline psycopg, the same rows, batches of 100':52s} {base.rate:9,.0f} events/s")
    for sender in senders:
        rate = sender.rate
        label = f"persist_remote, batches of 100, {len(sender.rooms)} room(s) at once"
        emit(
            f"{label:52s} {rate.rate:9,.0f} events/s  {rate.rate / base.rate:5.2f}x baseline (target >= 20,000"
            f" events/s: {verdict(rate.rate >= 20_000)}; rounds {min(rate.rounds):,.0f}-{max(rate.rounds):,.0f})"
        )


# -- helpers for the big builds ---------------------------------------------------------------------------


async def analyze(host: Host) -> None:
    """``ANALYZE`` the events tables: what autovacuum does after a bulk load (it is off on some servers,
    and a planner without statistics reads ``event_edges`` sequentially for every batch)."""
    async with host.api.database().autocommit() as conn:
        for table in ("events", "event_json", "event_edges", "state_groups", "current_state_events", "rooms",
                      "room_memberships", "redactions"):  # fmt: skip
            await conn.execute(f"ANALYZE {table}")


async def persist_rounds(
    store: Any,
    rounds: Sequence[Sequence[tuple[str, Callable[[], list[bytes]]]]],
    clock: Clock,
    concurrency: int = 4,
    what: str = "",
) -> int:
    """Persist round after round; in a round, each ``(room, make batch)`` of a different room, ``concurrency``
    at a time (a room's batches stay in order: they are in successive rounds). Returns the events written."""
    written = 0
    for r, work in enumerate(rounds):

        async def worker(queue: list[tuple[str, Callable[[], list[bytes]]]]) -> None:
            nonlocal written
            while queue:
                room_id, make = queue.pop()
                batch = make()
                done = await persist(store, room_id, batch)
                if len(done.stored) != len(batch):
                    raise RuntimeError(f"room {room_id}: {len(done.stored)} of {len(batch)} events stored")
                written += len(batch)

        queue = list(work)
        await asyncio.gather(*(worker(queue) for _ in range(concurrency)))
        clock.check(what or f"round {r + 1} of {len(rounds)}, {written:,} events")
    return written


async def count(host: Host, sql: str, params: dict[str, Any] | None = None) -> Any:
    rows = await host.api.database().fetchall(sql, params or {})
    return rows[0] if len(rows[0]) > 1 else rows[0][0]


async def timed(samples: int, fn: Callable[[int], Any]) -> list[float]:
    out = []
    for i in range(samples):
        start = time.perf_counter()
        await fn(i)
        out.append(time.perf_counter() - start)
    return out


# -- c. state groups at 10,000 members ---------------------------------------------------------------------


_STATE_ROWS = "SELECT count(*), COALESCE(sum(length(delta)), 0) FROM state_groups WHERE room_id = %(r)s"


async def bench_state(host: Host, sizes: Sizes, setup_seconds: float, emit: Emit) -> None:
    store = store_of(host)
    clock = Clock("state", setup_seconds, emit)
    room = RemoteRoom(f"@creator:{SERVER}")
    await persist(store, room.room_id, room.start())
    users = [f"@u{i}:{SERVER}" for i in range(sizes.members)]
    rows0, bytes0 = await count(host, _STATE_ROWS, {"r": room.room_id})
    for start in range(0, len(users), BATCH):
        await persist(store, room.room_id, [room.member(u, "join") for u in users[start : start + BATCH]])
        clock.check(f"{min(start + BATCH, len(users)):,} of {len(users):,} joins (remote batches of {BATCH})")
    rows1, bytes1 = await count(host, _STATE_ROWS, {"r": room.room_id})
    base_size = 5  # create, creator, power levels, join rules, history visibility
    joins_ref = sum(1 + (base_size + i + 1) / 100 for i in range(len(users)))
    leavers = random.Random(18).sample(users, sizes.leaves)
    started = time.perf_counter()
    for i, user in enumerate(leavers):
        await store.change_membership(room.room_id, user, user, "leave")
        if i % 100 == 99:
            clock.check(f"{i + 1:,} of {len(leavers):,} leaves (change_membership, one per transaction)")
    leave_seconds = time.perf_counter() - started
    rows2, bytes2 = await count(host, _STATE_ROWS, {"r": room.room_id})
    size = base_size + len(users)
    emit(f"state: room built in {clock.elapsed:.0f} s ({len(users):,} joins, then {len(leavers):,} leaves)")
    j, lv = len(users), len(leavers)
    emit(
        f"{'state rows per change, joins 0 -> ' + f'{j:,}':52s} {(rows1 - rows0) / j:9.2f} rows  "
        f"{(bytes1 - bytes0) / j:6.0f} delta bytes  (reference model 1 + S/100: {joins_ref / j:.1f} rows)"
    )
    emit(
        f"{'state rows per change, ' + f'{lv:,} leaves at {j:,} members':52s} {(rows2 - rows1) / lv:9.2f} rows  "
        f"{(bytes2 - bytes1) / lv:6.0f} delta bytes  (reference model: {1 + size / 100:.1f} rows; target <= 2: "
        f"{verdict((rows2 - rows1) / lv <= 2 and (rows1 - rows0) / j <= 2)}); "
        f"{lv / leave_seconds:,.0f} leaves/s"
    )
    await analyze(host)
    reads = store.reads
    events = [str(r[0]) for r in await host.api.database().fetchall(
        "SELECT event_id FROM events WHERE room_id = %(r)s", {"r": room.room_id}
    )]  # fmt: skip
    picks = random.Random(5).choices(events, k=sizes.samples)
    assert await reads.state_ids(room.room_id, at=picks[0]), "a state"

    async def cold(i: int) -> None:
        await reads.state_ids(room.room_id, at=picks[i])

    cold_times = []
    for i in range(len(picks)):
        store.states.forget()
        start = time.perf_counter()
        await cold(i)
        cold_times.append(time.perf_counter() - start)
    warm_times = await timed(len(picks), cold)
    for label, times, note in (
        ("state_ids at a random event, cache emptied", cold_times, "forget() before each read"),
        (
            "state_ids at a random event, cache as it is",
            warm_times,
            f"the default cache, {store.states.max_entries:,} entries: about"
            f" {store.states.max_entries // size:,} of the room's {len(events):,} states",
        ),
    ):
        emit(
            f"{label:52s} {ms(times)}  (target p99 <= 5 ms: {verdict(pct(times, 0.99) <= 0.005)};"
            f" {len(times):,} reads of {len(events):,} events; {note})"
        )


# -- d. /messages in a 200,000-event room -------------------------------------------------------------------

READER = "@reader:bench.local"


async def bench_messages(host: Host, sizes: Sizes, setup_seconds: float, emit: Emit) -> None:
    store = store_of(host)
    clock = Clock("messages", setup_seconds, emit)
    room = RemoteRoom(f"@creator:{SERVER}")
    await persist(store, room.room_id, room.start("joined"))
    total = sizes.messages_room - 5
    half = total // 2
    senders = [room.creator]
    state = {"i": 0}

    def make() -> list[bytes]:
        batch = []
        while len(batch) < BATCH and state["i"] < total:
            i = state["i"]
            state["i"] += 1
            if i == half:
                batch.append(room.member(READER, "join"))
            elif i % 50 == 49:
                senders.append(f"@m{i}:{SERVER}")
                batch.append(room.member(senders[-1], "join"))
            else:
                batch.append(room.message(senders[i % len(senders)], i))
        return batch

    rounds = [[(room.room_id, make)] for _ in range((total + BATCH - 1) // BATCH)]
    await persist_rounds(store, rounds, clock, concurrency=1)
    await analyze(host)
    rows = await host.api.database().fetchall(
        "SELECT topological_ordering, stream_ordering FROM events WHERE room_id = %(r)s", {"r": room.room_id}
    )
    join_depth = 5 + half + 1
    emit(
        f"messages: {len(rows):,}-event room built in {clock.elapsed:.0f} s (the reader joins at depth {join_depth:,})"
    )
    picks = random.Random(7).choices(rows, k=sizes.samples)
    shown: list[int] = []

    async def page(i: int) -> None:
        topo, stream = picks[i]
        got = await store.reads.messages(READER, room.room_id, from_token=f"t{topo}-{stream}", limit=50)
        shown.append(len(got.chunk))

    times = await timed(len(picks), page)
    after = [t for t, (topo, _) in zip(times, picks, strict=True) if topo >= join_depth]
    before = [t for t, (topo, _) in zip(times, picks, strict=True) if topo < join_depth]
    emit(
        f"{'/messages page of 50 from a random event':52s} {ms(times)}  (target p99 <= 10 ms: "
        f"{verdict(pct(times, 0.99) <= 0.010)}; {len(times):,} pages, {sum(shown) / len(shown):.1f} events shown"
        " a page)"
    )
    for label, part in (
        ("  of which after the reader's join", after),
        ("  of which before it (nothing shown)", before),
    ):
        if part:
            emit(f"{label:52s} {ms(part)}  ({len(part):,} pages)")


# -- e. recent events in the top rooms of a user in 2,000 rooms ---------------------------------------------

_MY_ROOMS = """
SELECT room_id FROM current_state_events
WHERE type = 'm.room.member' AND state_key = %(user)s AND membership IN ('join', 'invite')
"""
_RANKED = """
SELECT c.room_id FROM current_state_events c JOIN rooms r ON r.room_id = c.room_id
WHERE c.type = 'm.room.member' AND c.state_key = %(user)s AND c.membership = 'join'
ORDER BY r.last_stream_ordering DESC NULLS LAST, c.room_id LIMIT %(rooms)s
"""


def _newest_sql() -> str:
    from factstream_events.shared.stored import COLUMNS

    return (
        f"SELECT {COLUMNS}, j.json FROM events e JOIN event_json j ON j.event_id = e.event_id"
        " WHERE e.room_id = %(room)s AND NOT e.outlier"
        " ORDER BY e.topological_ordering DESC, e.stream_ordering DESC LIMIT %(limit)s"
    )


async def per_room(host: Host, user: str, top: int, limit: int, *, ranked: bool) -> list[tuple[str, list[bytes]]]:
    """The baseline: one query per room for its newest events (``ranked``: only the top rooms by
    ``rooms.last_stream_ordering``, else every room of the user, ranked by what was read)."""
    from factstream_events.shared.stored import row_of

    reads = store_of(host).reads
    newest = _newest_sql()
    async with host.api.database().autocommit() as conn:
        if ranked:
            cur = await conn.execute(_RANKED, {"user": user, "rooms": top})
        else:
            cur = await conn.execute(_MY_ROOMS, {"user": user})
        rooms = [str(r[0]) for r in await cur.fetchall()]
        read = []
        for room_id in rooms:
            cur = await conn.execute(newest, {"room": room_id, "limit": limit + 1})
            rows = [row_of(r) for r in await cur.fetchall()]
            read.append((max((r.stream for r in rows), default=0), room_id, rows))
        if not ranked:
            read.sort(key=lambda t: (-t[0], t[1]))
        out = []
        for _, room_id, rows in read[:top]:
            out.append((room_id, await reads.for_user(conn, user, rows[:limit][::-1])))
        return out


async def bench_recent(host: Host, sizes: Sizes, setup_seconds: float, emit: Emit) -> None:
    store = store_of(host)
    clock = Clock("recent", setup_seconds, emit)
    rng = random.Random(11)
    rooms = [RemoteRoom(f"@c{i}:{SERVER}") for i in range(sizes.user_rooms)]
    per_room_batches = max(1, sizes.events_per_room // BATCH)

    def first(room: RemoteRoom) -> Callable[[], list[bytes]]:
        def make() -> list[bytes]:
            batch = [*room.start(), room.member(READER, "join")]
            return batch + [room.message(room.creator, n) for n in range(BATCH - len(batch))]

        return make

    def more(room: RemoteRoom) -> Callable[[], list[bytes]]:
        return lambda: [room.message(READER if n % 7 == 0 else room.creator, n) for n in range(BATCH)]

    rounds = []
    for r in range(per_room_batches):
        work = [(room.room_id, first(room) if r == 0 else more(room)) for room in rooms]
        rng.shuffle(work)  # the rooms' last batches land in random order: a ranking to find
        rounds.append(work)
    await persist_rounds(store, rounds, clock)
    held = await count(host, "SELECT count(*) FROM events")
    filler_rooms = []
    while held < sizes.database_events:
        filler = RemoteRoom(f"@filler:{SERVER}")
        filler_rooms.append(filler)
        n = min(1_000, sizes.database_events - held)
        batches = [filler.start()] + [
            [filler.message(filler.creator, i) for i in range(j, min(j + BATCH, n))] for j in range(5, n, BATCH)
        ]
        held += n
        work = [[(filler.room_id, lambda b=b: b)] for b in batches]
        await persist_rounds(store, work, clock, concurrency=1, what=f"filler rooms, {held:,} events in the database")
    await analyze(host)
    held = await count(host, "SELECT count(*) FROM events")
    emit(
        f"recent: {len(rooms):,} rooms of the reader ({per_room_batches * BATCH} events each) and "
        f"{len(filler_rooms):,} filler rooms, {held:,} events in the database, built in {clock.elapsed:.0f} s"
    )
    top, limit = 20, 10
    fanout = await timed(max(10, sizes.samples // 5), lambda _: per_room(host, READER, top, limit, ranked=True))
    every = await timed(max(5, sizes.samples // 50), lambda _: per_room(host, READER, top, limit, ranked=False))
    emit(f"{'baseline: rank all rooms, one query per room':52s} {ms(every)}  ({len(every)} reads)")
    emit(f"{'baseline: top 20 by last event, one query per room':52s} {ms(fanout)}  ({len(fanout)} reads)")
    timeline = getattr(store, "timeline", None)
    if timeline is None or not hasattr(timeline, "recent"):
        emit("recent 10 events in the top 20 rooms: SKIPPED (EventsStore.timeline.recent is not there yet)")
        return
    got = await timeline.recent(READER, rooms=top, limit=limit)
    expected = await per_room(host, READER, top, limit, ranked=True)
    same = [t.room_id for t in got] == [room_id for room_id, _ in expected]
    ours = await timed(sizes.samples, lambda _: timeline.recent(READER, rooms=top, limit=limit))
    p99 = pct(ours, 0.99)
    emit(
        f"{'timeline.recent(rooms=20, limit=10)':52s} {ms(ours)}  (target p99 <= 20 ms: {verdict(p99 <= 0.020)};"
        f" {len(ours)} reads; {'the same rooms as' if same else 'OTHER ROOMS THAN'} the ranked baseline)"
    )
    for label, base in (
        ("  vs rank all rooms, one query per room", every),
        ("  vs top 20 first, one query per room", fanout),
    ):
        ratio = pct(base, 0.99) / p99
        emit(
            f"{label:52s} {pct(base, 0.5) / pct(ours, 0.5):6.1f}x at p50 {ratio:6.1f}x at p99"
            f"  (target >= 10x: {verdict(ratio >= 10)})"
        )


# -- entry points --------------------------------------------------------------------------------------------


@dataclass
class Sizes:
    members: int = 10_000
    leaves: int = 2_000
    messages_room: int = 200_000
    user_rooms: int = 2_000
    events_per_room: int = 300
    database_events: int = 1_000_000
    samples: int = 1_000

    def scaled(self, scale: float) -> Sizes:
        return Sizes(*(max(10, int(v * scale)) for v in vars(self).values()))


async def run_async(url: str, seconds: float, sizes: Sizes, setup_seconds: float, only: set[str], emit: Emit) -> None:
    prepare_baseline(url)
    async with events_host(url) as host:
        if "local" in only:
            await bench_local(host, url, seconds, emit)
        if "remote" in only:
            await bench_remote(host, url, seconds, emit)
        for part, bench in (("state", bench_state), ("messages", bench_messages), ("recent", bench_recent)):
            if part in only:
                try:
                    await bench(host, sizes, setup_seconds, emit)
                except SetupTimeout as exc:
                    emit(f"{part}: SKIPPED: {exc}")


PARTS = ("local", "remote", "state", "messages", "recent")


def run(
    url: str,
    seconds: float = 3.0,
    *,
    scale: float = 1.0,
    setup_seconds: float = 600.0,
    only: Sequence[str] = PARTS,
    emit: Emit = print,
) -> None:
    """Run the measurements, emitting each line as it is known (progress lines start with ``..``)."""
    asyncio.run(run_async(url, seconds, Sizes().scaled(scale), setup_seconds, set(only), emit))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("url", help="a migrated database (every plugin's branch, events included)")
    parser.add_argument("--seconds", type=float, default=3.0)
    parser.add_argument("--scale", type=float, default=1.0)
    parser.add_argument("--setup-seconds", type=float, default=600.0)
    parser.add_argument("--part", choices=PARTS, action="append")
    args = parser.parse_args()
    run(
        args.url,
        args.seconds,
        scale=args.scale,
        setup_seconds=args.setup_seconds,
        only=args.part or PARTS,
        emit=lambda line: print(line, flush=True),
    )


if __name__ == "__main__":
    main()
