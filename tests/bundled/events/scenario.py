"""Helpers of the events plugin's end-to-end scenarios over HTTP (``test_*_http.py``).

* more users than ``conftest.USERS`` (a scenario needs one per kind of member), with their tokens;
* :class:`RoomDriver`: a local room built only through the public routes, each call checked;
* :func:`history`: a room's events as stored, in topological order (the scenario's ground truth);
* :func:`expect`: what the rules of docs/plugins/events.md, Who sees what show a user, written from their text and the
  reference's read rules, independently of ``factstream_events.rules.visibility``;
* :func:`remote_event` / :func:`remote_body`: complete events for ``POST /rooms/{room}/remote_events``;
* :func:`table_counts`: the row count of every table of the plugin (bad input must leave them alone).
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx

from factstream.host.app import Host
from tests.bundled.events.conftest import SERVER_TOKEN, token_of
from tests.bundled.events.remote_history import RemoteRoom

ALICE, BOB, CAROL, DAVE, EVE = "@alice:hs", "@bob:hs", "@carol:hs", "@dave:hs", "@eve:hs"
FRED, GINA, HANK, IVAN, JUDY = "@fred:hs", "@gina:hs", "@hank:hs", "@ivan:hs", "@judy:hs"
PEOPLE = (ALICE, BOB, CAROL, DAVE, EVE, FRED, GINA, HANK, IVAN, JUDY)
TOKENS = {token_of(u): {"user": u} for u in PEOPLE} | {SERVER_TOKEN: {"user": "@server:hs", "write": True}}

MEMBER = "m.room.member"
HV = "m.room.history_visibility"
REDACTION = "m.room.redaction"
VISIBILITIES = ("world_readable", "shared", "invited", "joined")
_MEMBERSHIP_RANK = ("join", "invite", "knock", "leave", "ban")
_NEVER_SHOWN = ("m.room.dummy", "m.room.aliases")

#: Every table of the plugin's migration branch.
PLUGIN_TABLES = (
    "rooms",
    "events",
    "event_json",
    "event_edges",
    "event_forward_extremities",
    "event_backward_extremities",
    "state_groups",
    "current_state_events",
    "current_state_delta_stream",
    "room_memberships",
    "redactions",
    "ex_outlier_stream",
    "event_txn_ids",
)

Clients = Callable[[str], httpx.AsyncClient]
_txn = itertools.count()


async def table_counts(host: Host) -> dict[str, int]:
    """The number of rows in each table of :data:`PLUGIN_TABLES`."""
    sql = " UNION ALL ".join(f"SELECT '{t}', count(*) FROM {t}" for t in PLUGIN_TABLES)
    return {str(t): int(n) for t, n in await host.api.database().fetchall(sql)}


def error_of(r: httpx.Response) -> str:
    """A refusal's ``error`` message (asserting it is a 4xx ``{"errcode", "error"}``)."""
    assert 400 <= r.status_code < 500, (r.status_code, r.text[:300])
    body = r.json()
    assert set(body) >= {"errcode", "error"}, body
    return str(body["error"])


# -- a local room through the routes ------------------------------------------------------------------


@dataclass
class RoomDriver:
    """A local room driven through the HTTP routes; every write must answer 200 with an event ID."""

    client: Clients
    room_id: str
    sent: dict[str, str] = field(default_factory=dict)  # label -> event ID

    @classmethod
    async def create(cls, client: Clients, creator: str = ALICE, **body: Any) -> RoomDriver:
        r = await client(creator).post("/createRoom", json=body)
        assert r.status_code == 200, r.text
        return cls(client, r.json()["room_id"])

    async def _ok(self, r: httpx.Response, label: str | None) -> str:
        assert r.status_code == 200, (label, r.status_code, r.text)
        event_id = str(r.json()["event_id"])
        if label is not None:
            self.sent[label] = event_id
        return event_id

    async def say(self, user: str, label: str, **content: Any) -> str:
        """Send an ``m.room.message`` whose body is ``label`` (and remember its ID under ``label``)."""
        body = {"msgtype": "m.text", "body": label, **content}
        r = await self.client(user).put(f"/rooms/{self.room_id}/send/m.room.message/t{next(_txn)}", json=body)
        return await self._ok(r, label)

    async def send(self, user: str, event_type: str, content: Mapping[str, Any], label: str | None = None) -> str:
        r = await self.client(user).put(f"/rooms/{self.room_id}/send/{event_type}/t{next(_txn)}", json=content)
        return await self._ok(r, label)

    async def state(
        self, user: str, event_type: str, content: Mapping[str, Any], key: str = "", label: str | None = None
    ) -> str:
        path = f"/rooms/{self.room_id}/state/{event_type}" + (f"/{key}" if key else "")
        return await self._ok(await self.client(user).put(path, json=content), label)

    async def visibility(self, user: str, value: str, label: str | None = None) -> str:
        return await self.state(user, HV, {"history_visibility": value}, label=label)

    async def member(self, verb: str, user: str, target: str | None = None, label: str | None = None) -> str:
        """``join``/``leave`` for ``user``; ``invite``/``kick``/``ban``/``unban`` of ``target`` by ``user``."""
        body = {} if target is None else {"user_id": target}
        return await self._ok(await self.client(user).post(f"/rooms/{self.room_id}/{verb}", json=body), label)

    async def redact(self, user: str, target: str, reason: str | None = None, label: str | None = None) -> str:
        body = {} if reason is None else {"reason": reason}
        r = await self.client(user).put(f"/rooms/{self.room_id}/redact/{target}/r{next(_txn)}", json=body)
        return await self._ok(r, label)


# -- the client format -------------------------------------------------------------------------------------

#: Top-level keys of the federation format a user is never served (the client format drops them).
FEDERATION_ONLY = ("auth_events", "prev_events", "hashes", "signatures", "depth", "origin", "prev_state")


def client_view(event: Mapping[str, Any]) -> dict[str, Any]:
    """``event`` (as stored, or as the federation format has it) less what the client format drops and
    less ``unsigned`` (the server's own, compared on its own)."""
    return {k: v for k, v in event.items() if k not in FEDERATION_ONLY and k != "unsigned"}


# -- reading back -----------------------------------------------------------------------------------------


async def history(host: Host, room_id: str) -> list[dict[str, Any]]:
    """The room's non-outlier events as stored, parsed, with ``event_id``, in topological order."""
    rows = await host.api.database().fetchall(
        "SELECT e.event_id, j.json FROM events e JOIN event_json j ON j.event_id = e.event_id"
        " WHERE e.room_id = %(r)s AND NOT e.outlier ORDER BY e.topological_ordering, e.stream_ordering",
        {"r": room_id},
    )
    return [dict(json.loads(bytes(raw)), event_id=str(eid)) for eid, raw in rows]


@dataclass(frozen=True)
class Walk:
    """All of ``/messages`` for one user and direction: the status, the events, the pages' sizes."""

    status: int
    events: list[dict[str, Any]]
    pages: list[int]

    @property
    def ids(self) -> list[str]:
        return [e["event_id"] for e in self.events]


async def walk(c: httpx.AsyncClient, room_id: str, *, direction: str = "b", limit: int = 3) -> Walk:
    """Page ``/messages`` from the start until a page comes back without ``end`` (at most 500 pages)."""
    params: dict[str, Any] = {"dir": direction, "limit": limit}
    events: list[dict[str, Any]] = []
    pages: list[int] = []
    for _ in range(500):
        r = await c.get(f"/rooms/{room_id}/messages", params=params)
        if r.status_code != 200:
            assert not events, r.text
            return Walk(r.status_code, [], [])
        page = r.json()
        assert len(page["chunk"]) <= limit
        events += page["chunk"]
        pages.append(len(page["chunk"]))
        if "end" not in page:
            return Walk(200, events, pages)
        params["from"] = page["end"]
    raise AssertionError("/messages never came to an end")


# -- what the visibility rules allow ----------------------------------------------------------------------


def _set_visibility(content: Any) -> str:
    value = content.get("history_visibility") if isinstance(content, dict) else None
    return value if value in VISIBILITIES else "shared"


def _rank(membership: Any) -> str:
    return membership if membership in _MEMBERSHIP_RANK else "leave"


@dataclass(frozen=True)
class Seen:
    """One event of a linear history as one user meets it."""

    event: dict[str, Any]
    visibility: str  # the history visibility the event is judged by (rule 3 applied)
    before: str | None  # the user's membership in the state before the event
    after: str | None  # ... and after it

    def own(self, user: str) -> bool:
        return self.event["type"] == MEMBER and self.event.get("state_key") == user

    def annotation(self, user: str) -> str:
        """``unsigned.membership`` (rule 6)."""
        if self.own(user):
            return str(self.event["content"].get("membership"))
        return self.after or "leave"

    def visible(self, user: str, *, peeking: bool) -> bool:
        """Rules 1, 3, 4 and 5 (docs/plugins/events.md, Who sees what) for a non-outlier event."""
        if self.event["type"] in _NEVER_SHOWN:
            return False
        if self.visibility == "world_readable" or (self.visibility == "shared" and not peeking):
            return True
        membership = self.after
        if self.own(user):
            new, old = _rank(self.event["content"].get("membership")), _rank(self.before)
            if new == "leave" and old in ("join", "invite"):
                return True
            membership = min(new, old, key=_MEMBERSHIP_RANK.index)
        return membership == "join" or (self.visibility == "invited" and membership == "invite")


def meet(events: Sequence[dict[str, Any]], user: str) -> list[Seen]:
    """Replay a linear history (each event follows the one before it) for ``user``."""
    visibility, members = "shared", {}  # a room without a history-visibility event reads as shared
    out = []
    for event in events:
        before_vis, before = visibility, members.get(user)
        key = event.get("state_key")
        if key is not None and event["type"] == HV and key == "":
            visibility = _set_visibility(event["content"])
        if key is not None and event["type"] == MEMBER:
            members[key] = event["content"].get("membership")
        judged = visibility
        if event["type"] == HV and key is not None:
            judged = min(before_vis, visibility, key=VISIBILITIES.index)
        out.append(Seen(event, judged, before, members.get(user)))
    return out


@dataclass(frozen=True)
class Expected:
    """What a user should be shown: ``messages`` (None: ``/messages`` answers 403), event ID ->
    ``unsigned.membership`` in topological order; ``by_id``: per event ID, the membership ``/event``
    shows it with, or None where it must answer 404 (events absent from it: either answer is fine)."""

    messages: dict[str, str] | None
    by_id: dict[str, str | None]


def expect(events: Sequence[dict[str, Any]], user: str) -> Expected:
    """The visibility rules (docs/plugins/events.md, Who sees what) for ``user`` over a linear
    history, with the reference's read rules:

    * joined now: every event by the rules, not peeking;
    * left now (left, kicked, rejected an invite): not peeking, nothing after their last member event;
    * anything else (never in the room, invited, banned): ``/messages`` 403 unless the room is
      ``world_readable`` now, and read as a peeker (the reference has no member event to page from).

    ``/event`` follows the same rules, and must not show a departed user anything after their leave
    except (no opinion) ``world_readable`` events, which the reference's two routes answer differently.
    """
    seen = meet(events, user)
    now, now_visibility = standing(events, user)
    cap = None
    if now == "leave":
        cap = max(i for i, s in enumerate(seen) if s.own(user))
    peeking = now not in ("join", "leave")
    by_id: dict[str, str | None] = {}
    shown: dict[str, str] = {}
    for i, s in enumerate(seen):
        after_leave = cap is not None and i > cap
        if after_leave and s.visibility == "world_readable":
            continue
        ok = not after_leave and s.visible(user, peeking=peeking)
        by_id[s.event["event_id"]] = s.annotation(user) if ok else None
        if ok:
            shown[s.event["event_id"]] = s.annotation(user)
    readable = now in ("join", "leave") or now_visibility == "world_readable"
    return Expected(shown if readable else None, by_id)


def standing(events: Sequence[dict[str, Any]], user: str) -> tuple[str | None, str]:
    """The user's membership at the end of a linear history (None: never had one) and the room's
    history visibility then."""
    membership = next(
        (
            e["content"].get("membership")
            for e in reversed(events)
            if e["type"] == MEMBER and e.get("state_key") == user
        ),
        None,
    )
    last_hv = next((e for e in reversed(events) if e["type"] == HV and e.get("state_key") == ""), None)
    return membership, _set_visibility(last_hv["content"] if last_hv else None)


def describe(events: Sequence[dict[str, Any]], labels: Mapping[str, str]) -> dict[str, str]:
    """A short name for each event ID (the scenario's label, else its type and state key) for messages."""
    names = {v: k for k, v in labels.items()}
    return {
        e["event_id"]: names.get(e["event_id"], f"{e['type']}[{e.get('state_key', '')}]".replace("[]", ""))
        for e in events
    }


async def mismatches(
    client: Clients,
    room: RoomDriver,
    events: Sequence[dict[str, Any]],
    user: str,
    *,
    messages: bool = True,
    by_id: str = "all",
) -> list[str]:
    """Where what ``user`` is shown differs from :func:`expect`.

    ``messages``: walk ``/messages`` both ways. ``by_id``: which events to fetch one by one with
    ``/event``: ``"all"``, ``"up_to_leave"`` (a departed user: the events up to their last member event),
    ``"shown"`` (only those the visibility rules show: each must be 200 with the right membership), ``"none"``.
    """
    want = expect(events, user)
    names = describe(events, room.sent)
    c = client(user)
    out: list[str] = []
    for direction in ("b", "f") if messages else ():
        got = await walk(c, room.room_id, direction=direction)
        if want.messages is None:
            if got.status != 403:
                out.append(f"{user} /messages dir={direction}: {got.status}, expected 403")
            continue
        order = list(want.messages) if direction == "f" else list(reversed(want.messages))
        if got.ids != order:
            missing = [names.get(i, i) for i in order if i not in got.ids]
            extra = [names.get(i, i) for i in got.ids if i not in order]
            out.append(f"{user} /messages dir={direction}: missing {missing}, extra {extra} (or out of order)")
        for e in got.events:
            membership = e.get("unsigned", {}).get("membership")
            if e["event_id"] in want.messages and membership != want.messages[e["event_id"]]:
                name = names.get(e["event_id"])
                out.append(f"{user} /messages {name}: membership {membership}, not {want.messages[e['event_id']]}")
    checked = list(want.by_id.items())
    if by_id == "up_to_leave":
        last = max(i for i, e in enumerate(events) if e["type"] == MEMBER and e.get("state_key") == user)
        upto = {e["event_id"] for e in events[: last + 1]}
        checked = [(i, m) for i, m in checked if i in upto]
    elif by_id == "shown":
        checked = [(i, m) for i, m in checked if m is not None]
    elif by_id == "none":
        checked = []
    for event_id, membership in checked:
        r = await c.get(f"/rooms/{room.room_id}/event/{event_id}")
        name = names[event_id]
        if membership is None and r.status_code != 404:
            out.append(f"{user} /event {name}: {r.status_code}, expected 404")
        elif membership is not None and r.status_code != 200:
            out.append(f"{user} /event {name}: {r.status_code}, expected 200")
        elif membership is not None and r.json().get("unsigned", {}).get("membership") != membership:
            out.append(f"{user} /event {name}: unsigned {r.json().get('unsigned')}, not membership {membership}")
    return out


# -- remote events ----------------------------------------------------------------------------------------


def remote_event(
    room_id: str,
    event_type: str,
    sender: str,
    content: Mapping[str, Any],
    prev: Sequence[str],
    depth: int,
    *,
    state_key: str | None = None,
    redacts: str | None = None,
) -> tuple[dict[str, Any], str]:
    """A complete remote event of room version 10 (hashed) and its ID (``remote_history.RemoteRoom``)."""
    built = RemoteRoom(room_id).add(
        event_type, sender, dict(content), state_key=state_key, prev=prev, depth=depth, redacts=redacts, append=False
    )
    return built.event, built.event_id


def remote_body(events: Sequence[Mapping[str, Any]], **extra: Any) -> bytes:
    """A ``remote_events`` body whose events keep their own (non-canonical) spacing and key order."""
    return json.dumps({"events": list(events), **extra}, indent=1).encode()


async def post_remote(client: Clients, room_id: str, events: Sequence[Mapping[str, Any]], **extra: Any) -> Any:
    r = await client("server").post(f"/rooms/{room_id}/remote_events", content=remote_body(events, **extra))
    assert r.status_code == 200, r.text
    return r.json()
