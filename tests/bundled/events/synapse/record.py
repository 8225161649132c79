"""Record room histories made by a real Matrix homeserver (Synapse), for
``tests/bundled/events/test_synapse_histories.py``.

Not a test (pytest does not collect it) and not needed at test time: it writes
``tests/bundled/events/synapse/histories.json``, which is committed. Run it again only to re-record::

    python3 -m pip install --user uv && export PATH="$HOME/.local/bin:$PATH"
    uv venv /tmp/synapse-venv && uv pip install --python /tmp/synapse-venv/bin/python matrix-synapse
    python3 tests/bundled/events/synapse/record.py [--venv /tmp/synapse-venv] \
        [--out tests/bundled/events/synapse/histories.json]

What it does (everything it writes besides the output goes to a temporary directory under /tmp):

1. generates a Synapse configuration for the server name ``hs.test`` (SQLite, a registration shared
   secret, one client listener on a free localhost port, every rate limit out of the way) and starts
   Synapse in the background;
2. registers :data:`USERS` through the shared-secret admin API and builds the rooms of :data:`ROOMS`
   through the client-server API only (creation presets, invites, joins, rejected invites, leaves,
   kicks, bans, unbans, re-joins, name/topic/power-level changes, history-visibility changes, redactions
   of messages, of state events and of a redaction);
3. pages every room backwards for every user, ``GET /_matrix/client/v3/rooms/{room}/messages?dir=b``
   with pages of :data:`PAGE` from the newest event, following ``end`` until Synapse gives none, and keeps
   each page's event IDs with their ``unsigned.membership`` (or Synapse's refusal);
4. stops Synapse and reads its SQLite database: every event of each room in Synapse's stream order
   (``events.stream_ordering``) with its JSON exactly as Synapse stored it (``event_json.json``: the
   federation form, no ``event_id`` from room version 3 on), and the state after every event, from
   ``event_to_state_groups`` (the state group *after* an event: a state event's group holds the event
   itself) walked through ``state_group_edges`` and ``state_groups_state``.

The output (``histories.json``), kept small by naming events by their index in the room's list::

    {"synapse": "<version>", "server_name": "hs.test", "page_size": PAGE, "users": [...],
     "rooms": [{"name", "room_id", "room_version",
                "event_ids": [...],             # Synapse's stream order
                "events": ["<stored JSON>", ...],  # the same order, the text exactly as stored
                "state_after": [[i, ...], ...],   # per event: the state after it, as indices of events
                "messages": {user: {"status": 200, "pages": [{"chunk": [i, ...], "membership": [...],
                                                               "end": true|false}, ...]}
                                  | {"status": 403, "errcode": "M_FORBIDDEN"}}}]}

``membership`` holds each chunk event's ``unsigned.membership`` as Synapse returned it (``null`` where it
returned none).
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import hmac
import json
import shutil
import socket
import sqlite3
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

SERVER = "hs.test"
NAMES = ("alice", "bob", "carol", "dave", "eve", "frank", "grace")
USERS = tuple(f"@{n}:{SERVER}" for n in NAMES)
ALICE, BOB, CAROL, DAVE, EVE, FRANK, GRACE = USERS
#: The page size of every recorded back-pagination.
PAGE = 10
HERE = Path(__file__).resolve().parent
UNLIMITED = {"per_second": 100000, "burst_count": 100000}

#: Settings merged into the generated homeserver.yaml (rate limits out of the way, no presence noise).
CONFIG: dict[str, Any] = {
    "enable_registration": False,
    "presence": {"enabled": False},
    "url_preview_enabled": False,
    "trusted_key_servers": [],
    "suppress_key_server_warning": True,
    "redaction_retention_period": "7d",
    "rc_message": UNLIMITED,
    "rc_registration": UNLIMITED,
    "rc_login": {"address": UNLIMITED, "account": UNLIMITED, "failed_attempts": UNLIMITED},
    "rc_admin_redaction": UNLIMITED,
    "rc_joins": {"local": UNLIMITED, "remote": UNLIMITED},
    "rc_joins_per_room": UNLIMITED,
    "rc_invites": {"per_room": UNLIMITED, "per_user": UNLIMITED, "per_issuer": UNLIMITED},
    "rc_room_creation": UNLIMITED,
    "rc_presence": {"per_user": UNLIMITED},
    "rc_profile": UNLIMITED,
}


class MatrixError(Exception):
    def __init__(self, status: int, body: dict[str, Any]) -> None:
        super().__init__(f"{status} {body}")
        self.status = status
        self.body = body


class Synapse:
    """A Synapse process in ``workdir``, and a tiny client-server API client."""

    def __init__(self, venv: Path, workdir: Path) -> None:
        self.python = str(venv / "bin" / "python")
        self.workdir = workdir
        self.config = workdir / "homeserver.yaml"
        self.port = _free_port()
        self.base = f"http://127.0.0.1:{self.port}"
        self.process: subprocess.Popen[bytes] | None = None
        self.secret = "record-shared-secret"
        self.tokens: dict[str, str] = {}
        self._txn = 0

    def configure(self) -> None:
        subprocess.run(
            [self.python, "-m", "synapse.app.homeserver", "--server-name", SERVER, "--config-path", str(self.config),
             "--generate-config", "--report-stats=no"],
            cwd=self.workdir, check=True, capture_output=True,
        )  # fmt: skip
        overrides = dict(CONFIG)
        overrides["registration_shared_secret"] = self.secret
        overrides["listeners"] = [
            {"port": self.port, "bind_addresses": ["127.0.0.1"], "type": "http", "tls": False,
             "x_forwarded": False, "resources": [{"names": ["client"], "compress": False}]}
        ]  # fmt: skip
        overrides["database"] = {"name": "sqlite3", "args": {"database": str(self.workdir / "homeserver.db")}}
        # Rewrite the generated YAML with Synapse's own interpreter (it has PyYAML): JSON is YAML.
        script = (
            "import json, sys, yaml\n"
            "path, extra = sys.argv[1], json.loads(sys.argv[2])\n"
            "config = yaml.safe_load(open(path))\n"
            "config.update(extra)\n"
            "open(path, 'w').write(json.dumps(config, indent=1))\n"
        )
        subprocess.run([self.python, "-c", script, str(self.config), json.dumps(overrides)], check=True)

    def start(self) -> None:
        log = open(self.workdir / "stdout.log", "wb")  # noqa: SIM115 (closed with the process)
        self.process = subprocess.Popen(
            [self.python, "-m", "synapse.app.homeserver", "--config-path", str(self.config)],
            cwd=self.workdir, stdout=log, stderr=subprocess.STDOUT,
        )  # fmt: skip
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"Synapse exited; see {self.workdir}/stdout.log and homeserver.log")
            with contextlib.suppress(OSError):
                self.request("GET", "/_matrix/client/versions")
                return
            time.sleep(0.5)
        raise RuntimeError("Synapse did not answer within 120 s")

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()

    def version(self) -> str:
        out = subprocess.run(
            [self.python, "-c", "import synapse; print(synapse.__version__)"], capture_output=True, check=True
        )
        return out.stdout.decode().strip()

    # -- HTTP --------------------------------------------------------------------------------------

    def request(
        self, method: str, path: str, body: Any = None, *, user: str | None = None, query: dict[str, Any] | None = None
    ) -> dict[str, Any]:
        url = self.base + path + ("?" + urllib.parse.urlencode(query) if query else "")
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(url, data=data, method=method)
        req.add_header("Content-Type", "application/json")
        if user is not None:
            req.add_header("Authorization", f"Bearer {self.tokens[user]}")
        try:
            with urllib.request.urlopen(req, timeout=60) as resp:
                answer: dict[str, Any] = json.loads(resp.read() or b"{}")
                return answer
        except urllib.error.HTTPError as exc:
            raise MatrixError(exc.code, json.loads(exc.read() or b"{}")) from None

    def register(self, name: str) -> None:
        nonce = self.request("GET", "/_synapse/admin/v1/register")["nonce"]
        password = "pw-" + name
        mac = hmac.new(self.secret.encode(), digestmod=hashlib.sha1)
        mac.update(b"\x00".join([nonce.encode(), name.encode(), password.encode(), b"notadmin"]))
        body = {"nonce": nonce, "username": name, "password": password, "admin": False, "mac": mac.hexdigest()}
        answer = self.request("POST", "/_synapse/admin/v1/register", body)
        self.tokens[answer["user_id"]] = answer["access_token"]

    # -- the client-server API, as a user ----------------------------------------------------------

    def txn(self) -> str:
        self._txn += 1
        return f"t{self._txn}"

    def create_room(self, user: str, *, history_visibility: str | None = None, **body: Any) -> str:
        """``POST /createRoom``; ``history_visibility`` overrides the preset's (as initial state)."""
        if history_visibility is not None:
            content = {"history_visibility": history_visibility}
            body["initial_state"] = [{"type": "m.room.history_visibility", "state_key": "", "content": content}]
        return str(self.request("POST", "/_matrix/client/v3/createRoom", body, user=user)["room_id"])

    def say(self, user: str, room: str, body: str) -> str:
        path = f"/_matrix/client/v3/rooms/{_q(room)}/send/m.room.message/{self.txn()}"
        return str(self.request("PUT", path, {"msgtype": "m.text", "body": body}, user=user)["event_id"])

    def state(self, user: str, room: str, event_type: str, content: dict[str, Any], state_key: str = "") -> str:
        path = f"/_matrix/client/v3/rooms/{_q(room)}/state/{event_type}/{_q(state_key)}"
        return str(self.request("PUT", path, content, user=user)["event_id"])

    def visibility(self, user: str, room: str, value: str) -> str:
        return self.state(user, room, "m.room.history_visibility", {"history_visibility": value})

    def member(self, user: str, room: str, action: str, target: str | None = None, reason: str | None = None) -> None:
        """``action``: join, leave (also rejects an invite), invite, kick, ban, unban."""
        body: dict[str, Any] = {}
        if target is not None:
            body["user_id"] = target
        if reason is not None:
            body["reason"] = reason
        self.request("POST", f"/_matrix/client/v3/rooms/{_q(room)}/{action}", body, user=user)

    def redact(self, user: str, room: str, event_id: str, reason: str | None = None) -> str:
        path = f"/_matrix/client/v3/rooms/{_q(room)}/redact/{_q(event_id)}/{self.txn()}"
        return str(self.request("PUT", path, {"reason": reason} if reason else {}, user=user)["event_id"])

    def power_levels(self, user: str, room: str, change: Callable[[dict[str, Any]], None]) -> str:
        path = f"/_matrix/client/v3/rooms/{_q(room)}/state/m.room.power_levels/"
        levels = self.request("GET", path, user=user)
        change(levels)
        return self.state(user, room, "m.room.power_levels", levels)

    def chat(self, room: str, users: tuple[str, ...], count: int, tag: str) -> list[str]:
        """``count`` messages, the senders taking turns."""
        return [self.say(users[i % len(users)], room, f"{tag} {i}") for i in range(count)]

    def paginate(self, user: str, room: str) -> dict[str, Any]:
        """The user's whole back-pagination of the room, from the newest event, in pages of PAGE."""
        pages: list[dict[str, Any]] = []
        query: dict[str, Any] = {"dir": "b", "limit": PAGE}
        while True:
            try:
                answer = self.request("GET", f"/_matrix/client/v3/rooms/{_q(room)}/messages", user=user, query=query)
            except MatrixError as exc:
                if pages:
                    raise
                return {"status": exc.status, "errcode": exc.body.get("errcode")}
            chunk = answer.get("chunk", [])
            end = answer.get("end")
            pages.append(
                {
                    "chunk": [e["event_id"] for e in chunk],
                    "membership": [e.get("unsigned", {}).get("membership") for e in chunk],
                    "end": end is not None,
                }
            )
            if end is None:
                return {"status": 200, "pages": pages}
            query = {"dir": "b", "limit": PAGE, "from": end}


def _q(text: str) -> str:
    return urllib.parse.quote(text, safe="")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# -- the rooms -------------------------------------------------------------------------------------------


def room_shared(hs: Synapse) -> tuple[str, str]:
    """Room version 10, created ``shared`` (private_chat preset); goes through ``joined``, ``invited``,
    ``shared`` and ends ``world_readable``. Carol rejects her invite; Frank stays invited; Grace's invite
    is rescinded (a kick); Dave is kicked; Eve is banned, unbanned, invited again and re-joins; Bob
    leaves, comes back and changes his display name (Synapse sends his join again)."""
    room = hs.create_room(ALICE, preset="private_chat", name="shared", topic="first topic", room_version="10")
    hs.chat(room, (ALICE,), 6, "before anyone")
    hs.member(ALICE, room, "invite", BOB)
    hs.member(BOB, room, "join")
    hs.chat(room, (ALICE, BOB), 8, "alice and bob")
    hs.member(ALICE, room, "invite", CAROL)
    hs.say(BOB, room, "carol is invited")
    hs.member(CAROL, room, "leave")  # rejects the invite
    hs.member(ALICE, room, "invite", DAVE)
    hs.member(DAVE, room, "join")
    doomed = hs.chat(room, (ALICE, BOB, DAVE), 9, "three of us")
    hs.visibility(ALICE, room, "joined")
    hs.chat(room, (ALICE, BOB, DAVE), 6, "joined only")
    hs.member(ALICE, room, "invite", EVE)
    hs.say(ALICE, room, "eve is invited")
    hs.member(EVE, room, "join")
    hs.chat(room, (ALICE, EVE), 6, "eve arrived")
    hs.member(BOB, room, "leave")
    hs.chat(room, (ALICE, DAVE, EVE), 6, "bob left")
    hs.visibility(ALICE, room, "invited")
    hs.member(ALICE, room, "invite", FRANK)
    hs.chat(room, (ALICE, DAVE, EVE), 5, "frank is invited")
    hs.member(ALICE, room, "invite", GRACE)
    hs.say(ALICE, room, "grace is invited")
    hs.member(ALICE, room, "kick", GRACE, reason="invite rescinded")
    hs.member(ALICE, room, "kick", DAVE, reason="bye dave")
    hs.chat(room, (ALICE, EVE), 5, "dave kicked")
    hs.power_levels(ALICE, room, lambda pl: pl["users"].__setitem__(EVE, 50))
    hs.redact(EVE, room, doomed[1], reason="moderated")  # a moderator redacts another's message
    own = hs.say(ALICE, room, "a message alice regrets")
    hs.redact(ALICE, room, own)
    topic = hs.state(ALICE, room, "m.room.topic", {"topic": "a topic to redact"})
    hs.chat(room, (ALICE, EVE), 3, "topic set")
    hs.redact(ALICE, room, topic, reason="state redacted")  # a state event's redaction
    first = hs.redact(ALICE, room, doomed[3])
    hs.redact(ALICE, room, first, reason="redacting a redaction")
    hs.member(ALICE, room, "ban", EVE, reason="banned")
    hs.chat(room, (ALICE,), 4, "eve banned")
    hs.member(ALICE, room, "unban", EVE)
    hs.say(ALICE, room, "eve unbanned")
    hs.member(ALICE, room, "invite", EVE)
    hs.member(EVE, room, "join")
    hs.chat(room, (ALICE, EVE), 5, "eve is back")
    hs.visibility(ALICE, room, "shared")
    hs.member(ALICE, room, "invite", BOB)
    hs.member(BOB, room, "join")
    hs.chat(room, (ALICE, BOB, EVE), 4, "bob is back")
    # a profile change: Synapse sends Bob's join again (join -> join) in every room he is in (only this one)
    hs.request("PUT", f"/_matrix/client/v3/profile/{_q(BOB)}/displayname", {"displayname": "Bobby"}, user=BOB)
    hs.chat(room, (ALICE, BOB, EVE), 4, "bob is bobby")
    hs.state(ALICE, room, "m.room.name", {"name": "shared, renamed"})
    hs.visibility(ALICE, room, "world_readable")
    hs.chat(room, (ALICE, BOB, EVE), 10, "world readable")
    hs.power_levels(ALICE, room, lambda pl: pl.__setitem__("events_default", 10))
    hs.chat(room, (ALICE, EVE), 4, "the end")
    return "shared-v10", room


def room_invited(hs: Synapse) -> tuple[str, str]:
    """Room version 11, created ``invited``; goes ``joined`` while Dave is invited (not yet joined) and
    back. Carol is invited, stays invited through messages, joins, is kicked; Eve rejects her invite;
    Dave is banned and unbanned; Frank joins and leaves; Grace is invited and never joins; a message
    and a power-levels event are redacted; for a while the visibility is a value Synapse does not know."""
    room = hs.create_room(ALICE, preset="private_chat", room_version="11", name="invited", history_visibility="invited")
    hs.chat(room, (ALICE,), 5, "alone")
    hs.member(ALICE, room, "invite", BOB)
    hs.chat(room, (ALICE,), 3, "bob invited")
    hs.member(BOB, room, "join")
    hs.chat(room, (ALICE, BOB), 6, "bob joined")
    hs.member(ALICE, room, "invite", CAROL)
    hs.chat(room, (ALICE, BOB), 7, "carol invited")
    hs.member(CAROL, room, "join")
    hs.chat(room, (ALICE, BOB, CAROL), 6, "carol joined")
    hs.member(ALICE, room, "invite", DAVE)
    hs.say(ALICE, room, "dave invited")
    hs.visibility(ALICE, room, "joined")  # while Dave is invited, not joined
    hs.chat(room, (ALICE, BOB), 5, "joined only, dave invited")
    hs.member(DAVE, room, "join")
    hs.chat(room, (ALICE, DAVE), 5, "dave joined")
    hs.visibility(ALICE, room, "invited")
    hs.member(ALICE, room, "invite", EVE)
    hs.chat(room, (ALICE, CAROL), 4, "eve invited")
    hs.member(EVE, room, "leave")  # rejects
    hs.chat(room, (ALICE, BOB), 4, "eve rejected")
    pl = hs.power_levels(ALICE, room, lambda pl: pl["users"].__setitem__(BOB, 100))
    hs.member(BOB, room, "kick", CAROL, reason="kicked by bob")
    hs.chat(room, (ALICE, BOB, DAVE), 6, "carol kicked")
    hs.member(ALICE, room, "ban", DAVE)
    hs.chat(room, (ALICE, BOB), 4, "dave banned")
    hs.member(ALICE, room, "unban", DAVE)
    hs.chat(room, (ALICE, BOB), 3, "dave unbanned")
    hs.member(ALICE, room, "invite", DAVE)
    hs.member(DAVE, room, "join")
    joined = hs.chat(room, (ALICE, BOB, DAVE), 6, "dave is back")
    hs.redact(ALICE, room, pl, reason="a power-levels redaction")
    hs.redact(BOB, room, joined[2])
    hs.state(ALICE, room, "m.room.topic", {"topic": "invited room"})
    hs.visibility(ALICE, room, "not-a-visibility")  # Synapse takes any value; an unknown one reads as shared
    hs.chat(room, (ALICE, BOB), 3, "unknown visibility")
    hs.visibility(ALICE, room, "invited")
    hs.member(ALICE, room, "invite", FRANK)
    hs.chat(room, (ALICE, BOB, DAVE), 6, "frank invited")
    hs.member(FRANK, room, "join")
    hs.member(ALICE, room, "invite", GRACE)  # Grace never joins
    hs.chat(room, (ALICE, FRANK), 5, "frank joined")
    hs.member(FRANK, room, "leave")
    hs.chat(room, (ALICE, BOB, DAVE), 6, "frank left")
    return "invited-v11", room


def room_public(hs: Synapse) -> tuple[str, str]:
    """Room version 10, public and ``world_readable`` from the start, then ``shared``, ``joined`` and
    ``world_readable`` again, ``shared`` and finally ``world_readable``. Users join by themselves; Dave
    leaves; Eve, who joined under ``joined``, is banned; Frank never joins (he peeks); Carol leaves
    and re-joins."""
    room = hs.create_room(
        ALICE, preset="public_chat", name="public", room_version="10", history_visibility="world_readable"
    )
    hs.chat(room, (ALICE,), 6, "readable by the world")
    for user in (BOB, CAROL, DAVE):
        hs.member(user, room, "join")
        hs.say(user, room, "hello")
    hs.chat(room, (ALICE, BOB, CAROL, DAVE), 8, "four of us")
    hs.member(DAVE, room, "leave")
    hs.visibility(ALICE, room, "shared")
    hs.chat(room, (ALICE, BOB, CAROL), 10, "shared now")
    hs.visibility(ALICE, room, "joined")
    hs.chat(room, (ALICE, BOB), 6, "joined now")
    hs.member(EVE, room, "join")
    hs.chat(room, (ALICE, EVE), 6, "eve joined")
    hs.member(CAROL, room, "leave")
    hs.chat(room, (ALICE, BOB, EVE), 6, "carol left")
    hs.visibility(ALICE, room, "world_readable")
    hs.chat(room, (ALICE, BOB, EVE), 6, "readable again")
    hs.member(ALICE, room, "ban", EVE, reason="spam")
    hs.chat(room, (ALICE, BOB), 6, "eve banned")
    hs.member(CAROL, room, "join")
    hs.chat(room, (ALICE, BOB, CAROL), 6, "carol is back")
    hs.state(ALICE, room, "m.room.topic", {"topic": "public room"})
    hs.visibility(ALICE, room, "shared")
    hs.chat(room, (ALICE, BOB, CAROL), 6, "shared again")
    hs.visibility(ALICE, room, "world_readable")
    hs.chat(room, (ALICE, BOB, CAROL), 4, "world readable at the end")
    return "public-v10", room


def room_churn(hs: Synapse) -> tuple[str, str]:
    """Room version 10, public join rule and ``joined`` visibility from the start: users come and go
    (leave, re-join, kicked, banned, unbanned), so each sees only the stretches they were in; a member
    event is redacted; a burst of concurrent requests; Frank, who left, is banned at the end; then the
    join rule becomes ``knock`` and Grace knocks."""
    room = hs.create_room(ALICE, preset="public_chat", name="churn", room_version="10", history_visibility="joined")
    hs.chat(room, (ALICE,), 4, "empty room")
    steps: list[tuple[str, str, str | None]] = [
        (BOB, "join", None), (CAROL, "join", None), (BOB, "leave", None), (DAVE, "join", None),
        (BOB, "join", None), (CAROL, "leave", None), (EVE, "join", None), (ALICE, "kick", DAVE),
        (CAROL, "join", None), (DAVE, "join", None), (BOB, "leave", None), (ALICE, "ban", EVE),
        (FRANK, "join", None), (ALICE, "unban", EVE), (EVE, "join", None), (FRANK, "leave", None),
        (BOB, "join", None), (DAVE, "leave", None),
    ]  # fmt: skip
    present = {ALICE}
    for i, (actor, action, target) in enumerate(steps):
        hs.member(actor, room, action, target)
        who = target or actor
        if action == "join":
            present.add(who)
        else:
            present.discard(who)
        hs.chat(room, tuple(sorted(present)), 5, f"step {i}")
    # redact a member event: Carol's current one (a join), found through the room's messages
    answer = hs.request(
        "GET", f"/_matrix/client/v3/rooms/{_q(room)}/messages", user=ALICE, query={"dir": "b", "limit": 200}
    )
    carol_join = next(
        e["event_id"]
        for e in answer["chunk"]
        if e["type"] == "m.room.member" and e["state_key"] == CAROL and e["content"].get("membership") == "join"
    )
    hs.redact(ALICE, room, carol_join, reason="a member event's redaction")
    hs.chat(room, tuple(sorted(present)), 5, "nearly the end")
    # a burst of concurrent joins and messages (membership changes are not serialised per room the
    # way messages are, so this may fork the DAG: events with several prev_events)
    hs.member(DAVE, room, "join")
    hs.member(FRANK, room, "join")
    burst: list[Callable[[], object]] = [
        lambda: hs.member(DAVE, room, "leave"),
        lambda: hs.member(FRANK, room, "leave"),
        lambda: hs.say(ALICE, room, "burst alice"),
        lambda: hs.say(BOB, room, "burst bob"),
        lambda: hs.member(CAROL, room, "leave"),
    ]
    threads = [threading.Thread(target=f) for f in burst]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    hs.chat(room, (ALICE, BOB, EVE), 4, "after the burst")
    hs.member(ALICE, room, "ban", FRANK, reason="banned after leaving")
    hs.chat(room, (ALICE, BOB, EVE), 3, "frank banned")
    hs.state(ALICE, room, "m.room.join_rules", {"join_rule": "knock"})
    hs.request("POST", f"/_matrix/client/v3/knock/{_q(room)}", {"reason": "let me in"}, user=GRACE)
    hs.chat(room, (ALICE, BOB, EVE), 3, "the end")
    return "churn-v10", room


ROOMS = (room_shared, room_invited, room_public, room_churn)


# -- reading Synapse's database ----------------------------------------------------------------------------


def read_rooms(db: Path, rooms: list[tuple[str, str, dict[str, Any]]]) -> list[dict[str, Any]]:
    conn = sqlite3.connect(db)
    out = []
    for name, room_id, messages in rooms:
        rows = conn.execute(
            "SELECT e.event_id, e.outlier, j.json, s.state_group, r.event_id IS NOT NULL"
            " FROM events e JOIN event_json j ON j.event_id = e.event_id"
            " LEFT JOIN event_to_state_groups s ON s.event_id = e.event_id"
            " LEFT JOIN rejections r ON r.event_id = e.event_id"
            " WHERE e.room_id = ? ORDER BY e.stream_ordering",
            (room_id,),
        ).fetchall()
        ids = [r[0] for r in rows]
        index = {e: i for i, e in enumerate(ids)}
        if any(r[1] or r[4] for r in rows):
            raise RuntimeError(f"room {name} has outliers or rejected events; the test expects none")
        version = json.loads(rows[0][2])["content"].get("room_version", "1")
        state_after = []
        for event_id, _, _, group, _ in rows:
            if group is None:
                raise RuntimeError(f"event {event_id} has no state group")
            state = state_of_group(conn, group)
            state_after.append(sorted(index[e] for e in state.values()))
        for user, record in messages.items():
            for page in record.get("pages", []):
                page["chunk"] = [index[e] for e in page["chunk"]]
            messages[user] = record
        out.append(
            {
                "name": name,
                "room_id": room_id,
                "room_version": version,
                "event_ids": ids,
                "events": [r[2] for r in rows],
                "state_after": state_after,
                "messages": messages,
            }
        )
    conn.close()
    return out


def state_of_group(conn: sqlite3.Connection, group: int) -> dict[tuple[str, str], str]:
    """A state group's full state: its entries over those of its ancestors (Synapse's deltas only add or
    replace keys)."""
    state: dict[tuple[str, str], str] = {}
    current: int | None = group
    while current is not None:
        for event_type, state_key, event_id in conn.execute(
            "SELECT type, state_key, event_id FROM state_groups_state WHERE state_group = ?", (current,)
        ):
            state.setdefault((event_type, state_key), event_id)
        prev = conn.execute(
            "SELECT prev_state_group FROM state_group_edges WHERE state_group = ?", (current,)
        ).fetchall()
        current = prev[0][0] if prev else None
    return state


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--venv", type=Path, default=Path("/tmp/synapse-venv"))
    parser.add_argument("--out", type=Path, default=HERE / "histories.json")
    parser.add_argument("--keep", action="store_true", help="keep the temporary directory (Synapse's DB and logs)")
    args = parser.parse_args()
    if not (args.venv / "bin" / "python").exists():
        sys.exit(f"no Synapse venv at {args.venv}: see this script's docstring")
    workdir = Path(tempfile.mkdtemp(prefix="synapse-record-", dir="/tmp"))
    hs = Synapse(args.venv, workdir)
    try:
        hs.configure()
        hs.start()
        for name in NAMES:
            hs.register(name)
        built = [make(hs) for make in ROOMS]
        recorded = []
        for name, room in built:
            messages = {user: hs.paginate(user, room) for user in USERS}
            recorded.append((name, room, messages))
        hs.stop()
        rooms = read_rooms(workdir / "homeserver.db", recorded)
        document = {
            "synapse": hs.version(),
            "server_name": SERVER,
            "page_size": PAGE,
            "users": list(USERS),
            "rooms": rooms,
        }
        text = json.dumps(document, indent=None, separators=(",", ":"), ensure_ascii=False)
        # one room field per line, so that a re-recording diffs readably
        text = text.replace(',"rooms":[{', ',\n"rooms":[\n{').replace('},{"name"', '},\n{"name"')
        args.out.write_text(text + "\n")
        total = sum(len(r["event_ids"]) for r in rooms)
        print(f"{len(rooms)} rooms, {total} events, {len(USERS)} users -> {args.out} ({len(text) // 1024} KiB)")
    finally:
        hs.stop()
        if args.keep:
            print(f"kept {workdir}")
        else:
            shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
