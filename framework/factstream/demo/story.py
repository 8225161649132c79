"""The demo's scripted story, played through the public HTTP API: writes go to main (the writer of
every stream), reads and ``/sync`` to the worker, which sees it all through TCP replication.

alice creates a public room whose history visibility is ``joined``; bob joins and long-polls ``/sync``
on the worker (device ``BOBPHONE``) for the whole story; they talk; carol joins late and reads the
room on the worker (her ``/messages`` and initial ``/sync`` lack what came before her join); alice
redacts a message; alice sends bob a to-device message; bob changes his account data; alice types (a
typing notification, kept in main's memory) and stops, and sends a read receipt. What the story
checks and measures is kept in :class:`Record` (written to ``<state_dir>/demo/summary.json``).
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any

from factstream.demo.client import Client, path
from factstream.demo.cluster import DemoCluster, DemoError, user_id
from factstream.demo.view import Board, Monitor

BOB_DEVICE = "BOBPHONE"
#: A device of bob that never syncs: its message stays in the inbox (and in the export).
BOB_LAPTOP = "BOBLAPTOP"
BEFORE_CAROL = ("hello bob, welcome to the demo room", "hi alice! is replication fast?", "the launch code is 1234")
AFTER_CAROL = ("welcome carol", "oops, I should not have written the code here")
WAIT = 20.0


@dataclass
class Record:
    """What happened, as the story saw it through the API."""

    room_id: str = ""
    #: Event IDs of the story's writes after bob's first /sync, which his long poll must bring, in order.
    expected_by_bob: list[str] = field(default_factory=list)
    #: Every room event bob's /sync on the worker brought after his first sync, in arrival order.
    received_by_bob: list[str] = field(default_factory=list)
    to_device_received: list[dict[str, Any]] = field(default_factory=list)
    account_data_received: list[dict[str, Any]] = field(default_factory=list)
    #: Each wake-up of bob's long poll: milliseconds it waited, room events, to-device, account data.
    wakes: list[dict[str, Any]] = field(default_factory=list)
    #: Milliseconds from a write's request on main to its arrival in bob's /sync on the worker.
    write_to_wake_ms: list[float] = field(default_factory=list)
    messages: dict[str, str] = field(default_factory=dict)  # body -> event ID
    carol_messages_bodies: list[str] = field(default_factory=list)
    carol_sync_bodies: list[str] = field(default_factory=list)
    redacted_event_id: str = ""
    redaction_event_id: str = ""
    redacted_content_seen_by_bob: Any = None
    to_device_stored: int = 0
    account_data_positions: list[int] = field(default_factory=list)
    #: Each ``m.typing`` list bob's /sync brought, in arrival order.
    typing_seen: list[list[str]] = field(default_factory=list)
    #: Each read receipt bob's /sync brought: ``[event_id, receipt_type, user]``.
    receipts_seen: list[list[str]] = field(default_factory=list)
    #: Every event of the room (alice's /messages on main at the end), oldest first.
    room_event_ids: list[str] = field(default_factory=list)
    next_batch: str = ""


class SyncWatcher(threading.Thread):
    """bob's client: long polls ``/sync`` on the worker, records what each wake-up brought."""

    def __init__(self, client: Client, record: Record, board: Board) -> None:
        super().__init__(name="demo-sync", daemon=True)
        self.client = client
        self.record = record
        self.board = board
        self.token = ""
        self.stopping = threading.Event()
        self.arrived: dict[str, float] = {}
        self.error: Exception | None = None
        self._changed = threading.Condition()

    def initial(self) -> None:
        body = self.client.get("/sync", query={"device": BOB_DEVICE})
        self.token = body["next_batch"]

    def run(self) -> None:
        try:
            while not self.stopping.is_set():
                started = time.monotonic()
                query = {"since": self.token, "timeout": 1000, "device": BOB_DEVICE}
                body = self.client.get("/sync", query=query, timeout=30)
                self.take(body, (time.monotonic() - started) * 1000)
        except Exception as exc:  # the story reports it
            self.error = exc
            with self._changed:
                self._changed.notify_all()

    def take(self, body: dict[str, Any], waited_ms: float) -> None:
        now = time.monotonic()
        events = [
            ev
            for room in ((body.get("rooms") or {}).get("join") or {}).values()
            for ev in (room.get("timeline") or {}).get("events", [])
        ]
        streams = body.get("streams") or {}
        to_device = streams.get("to_device", [])
        account_data = streams.get("account_data", [])
        ephemeral = [
            ev
            for room in ((body.get("rooms") or {}).get("join") or {}).values()
            for ev in (room.get("ephemeral") or {}).get("events", [])
        ]
        with self._changed:
            for ev in ephemeral:
                for key in self._ephemeral(ev):
                    self.arrived.setdefault(key, now)
            self.token = body["next_batch"]
            for ev in events:
                self.record.received_by_bob.append(ev["event_id"])
                self.arrived.setdefault(ev["event_id"], now)
            for item in to_device:
                self.record.to_device_received.append(item)
                self.arrived.setdefault(f"to_device:{item['stream_id']}", now)
            for item in account_data:
                self.record.account_data_received.append(item)
                self.arrived.setdefault(f"account_data:{item['stream_id']}", now)
            self._changed.notify_all()
        if events or to_device or account_data or ephemeral:
            parts = [f"{len(events)} room event(s)"] if events else []
            parts += [f"{len(ephemeral)} ephemeral event(s) (typing, receipts)"] if ephemeral else []
            parts += [f"{len(to_device)} to-device message(s)"] if to_device else []
            parts += [f"{len(account_data)} account data change(s)"] if account_data else []
            self.record.wakes.append(
                {
                    "waited_ms": round(waited_ms, 1),
                    "room_events": len(events),
                    "to_device": len(to_device),
                    "account_data": len(account_data),
                    "ephemeral": len(ephemeral),
                }
            )
            # The long poll's whole wait, paced by the story: not the write-to-sync latency the summary
            # gives (measured from each write), so it is labelled as what it is.
            wait = f"a long poll answered after a {waited_ms:.0f} ms wait"
            self.board.woke(f"/sync on worker: {wait}, {', '.join(parts)}")

    def _ephemeral(self, ev: dict[str, Any]) -> list[str]:
        """Record a typing list or read receipts; the keys they arrive under (``typing:<users>``,
        ``receipt:<event>:<user>``)."""
        content = ev.get("content") or {}
        if ev.get("type") == "m.typing":
            users = list(content.get("user_ids", []))
            self.record.typing_seen.append(users)
            return ["typing:" + ",".join(users)]
        keys = []
        if ev.get("type") == "m.receipt":
            for event_id, types in content.items():
                for receipt_type, users in types.items():
                    for user in users:
                        self.record.receipts_seen.append([event_id, receipt_type, user])
                        keys.append(f"receipt:{event_id}:{user}")
        return keys

    def wait_for(self, key: str, since: float) -> float:
        """Wait until ``key`` (an event ID, ``to_device:N`` or ``account_data:N``) arrived; returns the
        milliseconds from ``since`` to its arrival."""
        deadline = time.monotonic() + WAIT
        with self._changed:
            while key not in self.arrived:
                if self.error is not None:
                    raise DemoError(f"bob's /sync on the worker failed: {self.error}")
                left = deadline - time.monotonic()
                if left <= 0:
                    raise DemoError(f"bob's /sync on the worker did not bring {key} within {WAIT:.0f} s")
                self._changed.wait(left)
            return (self.arrived[key] - since) * 1000

    def to_device_count(self) -> int:
        """How many to-device messages bob's /sync has brought so far."""
        with self._changed:
            return len(self.record.to_device_received)

    def wait_for_to_device(self, after: int) -> None:
        """Wait until bob's /sync has brought more than ``after`` to-device messages. ``after`` is counted
        before the send: the message can arrive before the send's answer does."""
        deadline = time.monotonic() + WAIT
        with self._changed:
            while len(self.record.to_device_received) <= after:
                left = deadline - time.monotonic()
                if self.error is not None or left <= 0:
                    raise DemoError(f"bob's /sync on the worker did not bring the to_device message: {self.error}")
                self._changed.wait(left)

    def stop(self) -> None:
        self.stopping.set()
        self.join(5)


class Story:
    def __init__(self, cluster: DemoCluster, board: Board, monitor: Monitor, *, pace: float = 0.0) -> None:
        self.cluster = cluster
        self.board = board
        #: Seconds to pause after each step, so that a person can follow the live view.
        self.pace = pace
        self.monitor = monitor
        self.record = Record()
        tok = cluster.tokens
        main, worker = cluster.main.url, cluster.worker.url
        self.alice = Client(main, tok["alice"], who="alice")
        self.bob = Client(main, tok["bob"], who="bob")
        self.carol = Client(main, tok["carol"], who="carol")
        self.bob_w = Client(worker, tok["bob"], who="bob")
        self.carol_w = Client(worker, tok["carol"], who="carol")
        self.watcher = SyncWatcher(self.bob_w, self.record, board)

    def caught_up(self) -> None:
        """Wait until the worker has seen every stream's writer position."""
        deadline = time.monotonic() + WAIT
        while True:
            snap = self.monitor.poll()
            main, worker = snap.instances.get("main"), snap.instances.get("worker")
            if main and worker and not main.error and not worker.error:
                behind = [
                    s
                    for s, view in main.streams.items()
                    if s in worker.streams
                    and max(worker.streams[s].positions.values(), default=0) < max(view.positions.values(), default=0)
                ]
                if not behind:
                    return
            if time.monotonic() > deadline:
                raise DemoError(f"the worker did not catch up with main within {WAIT:.0f} s")
            time.sleep(0.02)

    def send(self, client: Client, body: str, txn: str) -> str:
        started = time.monotonic()
        room = self.record.room_id
        answer = client.put(path("rooms", room, "send", "m.room.message", txn), {"msgtype": "m.text", "body": body})
        event_id: str = answer["event_id"]
        self.record.messages[body] = event_id
        self.expect(event_id, started)
        self.say(f"{client.who}: {body!r}")
        return event_id

    def expect(self, key: str, started: float) -> None:
        if not key.startswith(("to_device:", "account_data:", "typing:", "receipt:")):
            self.record.expected_by_bob.append(key)
        ms = self.watcher.wait_for(key, started)
        self.record.write_to_wake_ms.append(round(ms, 1))

    def ephemeral(self, room: str) -> None:
        """alice types, then stops; she sends a read receipt: each reaches bob's /sync on the worker."""
        alice = user_id("alice")
        for typing, key, line in (
            (True, f"typing:{alice}", "alice is typing: bob's /sync on the worker shows it (kept in main's memory)"),
            (False, "typing:", "alice stopped typing: bob's /sync on the worker shows nobody typing"),
        ):
            started = time.monotonic()
            self.alice.put(path("rooms", room, "typing", alice), {"typing": typing, "timeout": 30_000})
            self.expect(key, started)
            self.say(line)
        read = self.record.messages[AFTER_CAROL[1]]
        started = time.monotonic()
        self.alice.post(path("rooms", room, "receipt", "m.read", read))
        self.expect(f"receipt:{read}:{alice}", started)
        self.say(f"alice read up to {AFTER_CAROL[1]!r}: her read receipt reached bob's /sync on the worker")

    def say(self, line: str) -> None:
        self.board.say(line)
        time.sleep(self.pace)

    def play(self) -> Record:
        rec, say = self.record, self.say
        room = self.alice.post(
            "/createRoom", {"preset": "public_chat", "name": "demo", "history_visibility": "joined"}
        )["room_id"]
        rec.room_id = room
        say(f"alice created the public room {room} (history visibility: joined)")
        self.bob.post(path("rooms", room, "join"))
        say("bob joined; he long-polls /sync on the worker from now on")
        self.caught_up()
        self.watcher.initial()
        self.watcher.start()

        self.send(self.alice, BEFORE_CAROL[0], "a1")
        self.send(self.bob, BEFORE_CAROL[1], "b1")
        secret = self.send(self.alice, BEFORE_CAROL[2], "a2")

        started = time.monotonic()
        join = self.carol.post(path("rooms", room, "join"))["event_id"]
        self.expect(join, started)
        self.caught_up()
        page = self.carol_w.get(path("rooms", room, "messages"), query={"limit": 100})
        rec.carol_messages_bodies = [e["content"].get("body", "") for e in page["chunk"] if "body" in e["content"]]
        first = self.carol_w.get("/sync")
        timeline = ((first.get("rooms") or {}).get("join") or {}).get(room, {}).get("timeline", {}).get("events", [])
        rec.carol_sync_bodies = [e["content"]["body"] for e in timeline if "body" in e.get("content", {})]
        hidden = [b for b in BEFORE_CAROL if b not in rec.carol_messages_bodies + rec.carol_sync_bodies]
        say(
            f"carol joined late: on the worker her /messages and /sync show {len(rec.carol_messages_bodies)} and "
            f"{len(rec.carol_sync_bodies)} messages; {len(hidden)} of the {len(BEFORE_CAROL)} before her join hidden"
        )

        self.send(self.alice, AFTER_CAROL[0], "a3")
        self.send(self.alice, AFTER_CAROL[1], "a4")
        started = time.monotonic()
        redaction = self.alice.put(path("rooms", room, "redact", secret, "r1"), {"reason": "a secret"})["event_id"]
        self.expect(redaction, started)
        rec.redacted_event_id, rec.redaction_event_id = secret, redaction
        rec.redacted_content_seen_by_bob = self.bob_w.get(path("rooms", room, "event", secret))["content"]
        say(f"alice redacted {BEFORE_CAROL[2]!r}: bob now reads its content as {rec.redacted_content_seen_by_bob}")

        before = self.watcher.to_device_count()
        started = time.monotonic()
        sent = self.alice.put(
            path("sendToDevice", "m.demo.nudge", "t1"),
            {"messages": {user_id("bob"): {BOB_DEVICE: {"text": "psst, bob"}, BOB_LAPTOP: {"text": "psst, laptop"}}}},
        )
        rec.to_device_stored = int(sent["stored"])
        self.watcher.wait_for_to_device(before)
        self.record.write_to_wake_ms.append(round((time.monotonic() - started) * 1000, 1))
        say(
            f"alice sent bob's {BOB_DEVICE} and {BOB_LAPTOP} a to-device message each; {BOB_DEVICE} syncs and "
            f"receives its own (deleted once acknowledged), {BOB_LAPTOP}'s waits in its inbox"
        )

        for theme in ("dark", "light"):
            started = time.monotonic()
            put = self.bob.put(path("user", user_id("bob"), "account_data", "m.demo.theme"), {"theme": theme})
            rec.account_data_positions.append(int(put["stream_id"]))
            self.expect(f"account_data:{put['stream_id']}", started)
            say(f"bob set his account data m.demo.theme to {theme!r}")

        self.ephemeral(room)
        self.watcher.stop()
        self.caught_up()
        history = self.alice.get(path("rooms", room, "messages"), query={"dir": "f", "limit": 1000})
        rec.room_event_ids = [e["event_id"] for e in history["chunk"]]
        rec.next_batch = self.watcher.token
        return rec
