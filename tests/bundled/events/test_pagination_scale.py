"""Pagination at scale, and filtering: a 10,000-event room paged through
``GET /rooms/{room_id}/messages`` in pages of 97, backwards and forwards, for users who see different
parts of it; then a backfilled stretch of older events, which must appear at its topological place.

The room is written as remote batches (the Python API) and holds messages, state changes, members
joining and leaving, history-visibility changes between ``shared`` and ``joined``, a few forks (events
at the same depth), ``m.room.dummy`` events and redactions. What each user may see is computed here,
independently of the plugin, by replaying the history with the rules of docs/plugins/events.md, Who
sees what (and the leave clamp of its ``GET /rooms/{room_id}/messages``: a user who left pages up to
their leave).
"""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from typing import Any

from tests.bundled.events.conftest import store_of
from tests.bundled.events.remote_history import Built, RemoteRoom, persist

ROOM = "!pages:elsewhere"
ZED = "@zed:elsewhere"
ALICE, BOB, CAROL, DAVE, EVE = "@alice:hs", "@bob:hs", "@carol:hs", "@dave:hs", "@eve:hs"
TOTAL = 10_000
PAGE = 97
#: A stretch of plain messages left out at first and backfilled later: [GAP_AT, GAP_AT + GAP).
GAP_AT, GAP = 1_000, 200
#: (fraction of the room, what happens there)
MILESTONES = [
    (0.25, ("visibility", "joined")),
    (0.30, ("member", DAVE, "join")),
    (0.40, ("member", DAVE, "leave")),
    (0.50, ("member", BOB, "join")),
    (0.60, ("visibility", "shared")),
    (0.67, ("member", CAROL, "leave")),
    (0.80, ("visibility", "joined")),
    (0.85, ("member", DAVE, "join")),
]
MORE_JOINED = ("join", "invite", "knock", "leave", "ban")
RESTRICTIVENESS = ("world_readable", "shared", "invited", "joined")


@dataclass
class History:
    room: RemoteRoom
    gap: list[Built] = field(default_factory=list)
    before_gap: str = ""
    after_gap: str = ""
    #: target -> the (first) redaction of it
    redacted: dict[str, str] = field(default_factory=dict)
    #: the redaction, sent before its target, of a message in the gap
    late_target: str = ""


def build() -> History:
    rng = random.Random(97)
    room = RemoteRoom(ROOM)
    room.create(ZED)
    history = History(room)
    joined = [ZED]
    messages: list[str] = []

    def member(user: str, membership: str) -> None:
        room.add("m.room.member", user, {"membership": membership}, state_key=user)
        if membership == "join":
            joined.append(user)
        else:
            joined.remove(user)

    def message(**kw: Any) -> Built:
        built = room.add(
            "m.room.message", rng.choice(joined), {"msgtype": "m.text", "body": f"m{len(room.events)}"}, **kw
        )
        messages.append(built.event_id)
        return built

    member(ALICE, "join")
    member(CAROL, "join")
    pending = [(int(f * TOTAL), what) for f, what in MILESTONES]
    remote = 0
    while len(room.events) < TOTAL:
        n = len(room.events)
        if pending and n >= pending[0][0]:
            what = pending.pop(0)[1]
            if what[0] == "visibility":
                room.add("m.room.history_visibility", ZED, {"history_visibility": what[1]}, state_key="")
            else:
                member(what[1], what[2])
            continue
        if not history.gap and n >= GAP_AT:
            history.before_gap = room.events[-1].event_id
            history.gap = [message() for _ in range(GAP)]
            history.after_gap = message(prev=[history.gap[-1].event_id, history.before_gap]).event_id
            continue
        if not history.late_target and n >= GAP_AT + GAP + 100:  # a redaction long before its target arrives
            target = rng.choice([b.event_id for b in history.gap if b.event_id not in history.redacted])
            history.late_target = target
            history.redacted[target] = room.add("m.room.redaction", ZED, {}, redacts=target).event_id
            continue
        roll = rng.random()
        if roll < 0.03:
            remote += 1
            member(f"@r{remote}:elsewhere", "join")
        elif roll < 0.05 and len(joined) > 6:
            member(rng.choice([u for u in joined if u.endswith(":elsewhere") and u != ZED]), "leave")
        elif roll < 0.06:
            room.add("m.room.topic", ZED, {"topic": f"topic {n}"}, state_key="")
        elif roll < 0.07:
            room.add("m.room.dummy", ZED, {})
        elif roll < 0.075:
            candidates = [m for m in messages[-500:] if m not in history.redacted]
            target = rng.choice(candidates)
            history.redacted[target] = room.add("m.room.redaction", ZED, {"reason": "r"}, redacts=target).event_id
        elif roll < 0.09 and n < TOTAL - 3:  # a fork: two messages after the same event, then a merge
            fork_from = room.events[-1].event_id
            first = message()
            second = message(prev=[fork_from])
            message(prev=[first.event_id, second.event_id])
        else:
            message()
    assert len(room.events) == TOTAL and not pending
    return history


def oracle(history: History, user: str, held: set[str]) -> dict[str, str]:
    """event_id -> the user's membership at it, for every held event the user may see (Who sees what, rules 1-6)."""
    members: dict[str, str] = {}
    visibility = "shared"
    shown: dict[str, str] = {}
    for built in history.room.events:  # creation order; forks and the gap hold messages only
        before = visibility
        content = built.event["content"]
        previous = members.get(str(built.state_key)) if built.type == "m.room.member" else None
        if built.type == "m.room.member":
            members[str(built.state_key)] = content["membership"]
        if built.type == "m.room.history_visibility" and built.state_key == "":
            visibility = content["history_visibility"]
        if built.event_id not in held or built.type == "m.room.dummy":
            continue
        if built.type == "m.room.redaction" and built.event.get("redacts") not in held:
            continue  # a redaction is not shown while its target is not held (events.md, Redactions)
        effective = visibility
        if built.type == "m.room.history_visibility" and built.state_key == "":
            effective = min(before, visibility, key=RESTRICTIVENESS.index)
        own = built.type == "m.room.member" and built.state_key == user
        annotation = content["membership"] if own else members.get(user, "leave")
        if effective in ("world_readable", "shared"):  # no user here is peeking: each has a membership
            shown[built.event_id] = annotation
            continue
        membership = members.get(user, "leave")
        if own:
            new, old = content["membership"], previous or "leave"
            if new == "leave" and old in ("join", "invite"):
                shown[built.event_id] = annotation
                continue
            membership = min(new, old, key=MORE_JOINED.index)
        if membership == "join" or (effective == "invited" and membership == "invite"):
            shown[built.event_id] = annotation
    return shown


async def walk(client: Any, direction: str) -> list[dict[str, Any]]:
    """Every page from the start (no ``from``) until one without ``end``, which must be empty."""
    events: list[dict[str, Any]] = []
    token = None
    for _ in range(TOTAL):
        params: dict[str, Any] = {"dir": direction, "limit": PAGE}
        if token is not None:
            params["from"] = token
        r = await client.get(f"/rooms/{ROOM}/messages", params=params)
        assert r.status_code == 200, r.text
        page = r.json()
        assert len(page["chunk"]) <= PAGE
        events += page["chunk"]
        if "end" not in page:
            assert page["chunk"] == [], "a page without end must be empty"
            return events
        token = page["end"]
    raise AssertionError("pagination did not end")


async def check_user(client: Any, history: History, user: str, held: set[str], orders: dict[str, tuple[int, int]]):
    """Backwards and forwards: exactly the events the user may see, once each, in (topological, stream)
    order; each annotated with the user's membership at it, and pruned if redacted."""
    expected = oracle(history, user, held)
    mine = [b for b in history.room.events if b.type == "m.room.member" and b.state_key == user]
    if mine[-1].event["content"]["membership"] == "leave":  # a user who left pages up to their leave
        expected = {e: m for e, m in expected.items() if orders[e] <= orders[mine[-1].event_id]}
    newest_first = sorted(expected, key=orders.__getitem__, reverse=True)
    for direction, order in (("b", newest_first), ("f", newest_first[::-1])):
        got = await walk(client(user), direction)
        ids = [e["event_id"] for e in got]
        missing, extra = set(order) - set(ids), set(ids) - set(order)
        assert ids == order, (user, direction, len(ids), len(order), sorted(missing)[:5], sorted(extra)[:5])
        for event in got:
            assert event["unsigned"]["membership"] == expected[event["event_id"]], (user, event)
            because = history.redacted.get(event["event_id"])
            if because is not None and because in held:
                assert event["content"] == {}, event
                # the redaction itself if the user may read it, else a marker that tells nothing of it
                shown = event["unsigned"]["redacted_because"]
                if because in expected:
                    assert shown["event_id"] == because, event
                else:
                    assert shown == {"type": "m.room.redaction", "content": {}}, (user, event)
            elif event["type"] == "m.room.message":
                assert event["content"]["body"], event
    return newest_first


async def test_paging_a_10000_event_room_for_each_user_then_backfill(main, client):
    history = build()
    gap = {b.event_id for b in history.gap}
    first = [b for b in history.room.events if b.event_id not in gap]
    await persist(store_of(main), ROOM, first)
    db = main.api.database()

    async def orderings() -> dict[str, tuple[int, int]]:
        rows = await db.fetchall(
            "SELECT event_id, topological_ordering, stream_ordering FROM events WHERE room_id = %(r)s", {"r": ROOM}
        )
        return {str(e): (int(t), int(s)) for e, t, s in rows}

    orders = await orderings()
    assert len(orders) == TOTAL - GAP
    held = set(orders)
    # Users who see different parts: joined from the start, joined halfway (under `joined`), left at
    # two thirds, in and out twice under `joined`.
    seen = {user: await check_user(client, history, user, held, orders) for user in (ALICE, BOB, CAROL, DAVE)}
    for user in (BOB, CAROL, DAVE):  # each misses a good part of what Alice sees
        assert set(seen[user]) < set(seen[ALICE]) and len(seen[ALICE]) - len(seen[user]) > TOTAL // 10, user
    assert all(not gap & set(ids) for ids in seen.values())
    r = await client(EVE).get(f"/rooms/{ROOM}/messages")
    assert r.status_code == 403, r.text  # never a member of a room that is not world-readable

    # Backfill the gap through the remote route: negative stream orderings, at its topological place.
    for start in range(0, GAP, 100):
        chunk = history.gap[start : start + 100]
        body = b'{"backfill": true, "events": [' + b",".join(b.raw for b in chunk) + b"]}"
        r = await client("server").post(f"/rooms/{ROOM}/remote_events", content=body)
        assert r.status_code == 200, r.text
        assert r.json()["stored"] == [b.event_id for b in chunk]
    orders = await orderings()
    assert len(orders) == TOTAL
    assert all(orders[e][1] < 0 for e in gap) and all(orders[e][1] > 0 for e in held)
    held = set(orders)
    for user in (ALICE, CAROL, DAVE, BOB):
        newest_first = await check_user(client, history, user, held, orders)
        if user in (ALICE, CAROL):  # both were joined all along the gap: they see all of it, in place
            at = newest_first.index(history.after_gap)
            assert newest_first[at + 1 : at + 1 + GAP] == [b.event_id for b in reversed(history.gap)]
            assert newest_first[at + 1 + GAP] == history.before_gap
    # The redaction that arrived long before its target now applies to it.
    event = json.loads((await client(ALICE).get(f"/rooms/{ROOM}/event/{history.late_target}")).content)
    assert event["unsigned"]["redacted_because"]["event_id"] == history.redacted[history.late_target]
