"""Every route of the events plugin, fed hostile input: never a 500, every refusal a 4xx that names the
problem, and a refused request stores nothing.

Each route starts from a well-formed request (a real room, real events, a user who may act) that gets
past the checks; then one place of it is made hostile: a path parameter, a query parameter (declared
or not), one field of the JSON body at any depth (its value replaced, the key removed, or an odd key
added beside it), or the whole body. The hostile values are NUL characters, lone surrogates (escaped as
``\\ud800`` in JSON, raw bytes in URLs), 1,000-deep nesting, strings and bodies past every size limit,
the wrong JSON type (number, float, list, object, null, boolean, empty string), negative and huge
integers, and malformed IDs.

``test_every_place_of_every_route_with_every_kind_of_hostile_value`` sweeps every route, place and
kind of value; ``test_hostile_requests_drawn_at_random`` lets hypothesis draw the value (any text,
surrogates and controls included, any JSON, integers past ``bigint``) and the place.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import re
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote

import httpx
import pytest
from factstream_events.routes import ROUTES
from factstream_events.rules.contentrules import LEVELS
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from factstream.host.app import Host
from tests.bundled.events import scenario
from tests.bundled.events.scenario import ALICE, BOB, CAROL, DAVE, EVE, MEMBER, Clients, remote_event, table_counts

REMOTE = "!fuzzed:elsewhere"
ZED = "@zed:elsewhere"
_fresh = itertools.count()


class Deep:
    """Stands for a value nested ``depth`` lists deep (written as text: the encoder would recurse)."""

    def __init__(self, depth: int) -> None:
        self.text = "[" * depth + "]" * depth


#: One value of each hostile kind for a JSON field.
FIELD_VALUES: dict[str, Any] = {
    "nul": "a\x00b",
    "surrogate": "x\ud800y",
    "deep": Deep(1_000),
    "nearly too deep": Deep(900),
    "half as deep": Deep(500),
    "huge string": "h" * 70_000,
    "number": 5,
    "float": 1.5,
    "negative": -1,
    "past bigint": 2**64,
    "huge integer": 10**30,
    "list": ["@alice:hs"],
    "object": {"a": 1},
    "null": None,
    "boolean": True,
    "empty": "",
    "bad ID": "not-an-id",
    "sigil only": "@",
}
#: One value of each hostile kind for a path or query parameter.
PARAM_VALUES: dict[str, str] = {
    "nul": "a\x00b",
    "surrogate": "x\ud800y",
    "huge string": "h" * 10_000,
    "number": "5",
    "float": "1.5",
    "negative": "-1",
    "huge integer": "9" * 30,
    "unicode digit": "\u00b2",
    "list": "[1]",
    "empty": "",
    "bad ID": "not-an-id",
    "sigil only": "$",
    "token-like": "t5--3",
}
#: Whole bodies: not JSON, not UTF-8, not an object, nested too deeply, over the request limit.
WHOLE_BODIES: dict[str, bytes] = {
    "cut short": b'{"a": ',
    "not UTF-8": b'{"a": "\xff"}',
    "a list": b"[1]",
    "a string": b'"text"',
    "a number": b"5",
    "null": b"null",
    "deep object": b'{"a":' * 1_000 + b"1" + b"}" * 1_000,
    "deep list": b"[" * 100_000 + b"]" * 100_000,
    "duplicate key": b'{"a": 1, "a": 2}',
    "NaN": b'{"a": NaN}',
    "escaped surrogate": b'{"a": "\\udc00"}',
    "raw NUL": b'{"a": "\x00"}',
    "over 1 MiB": b'{"a": "' + b"x" * 1_100_000 + b'"}',
}
#: Words that name a problem of the request as a whole, whatever the field it was found in.
PROBLEM_WORDS: dict[str, tuple[str, ...]] = {
    "nul": ("NUL",),
    "surrogate": ("surrogate",),
    "deep": ("nested",),
    "nearly too deep": ("nested",),
    "half as deep": ("nested",),
    "huge string": ("bytes", "characters"),
}


@dataclass
class Context:
    """What the well-formed requests name: the local room (recreated when a hostile request changed
    it), its events, and the held remote room's latest event."""

    client: Clients
    room_id: str = ""
    message: str = ""
    remote_join: str = ""
    remote_message: dict[str, Any] = field(default_factory=dict)

    async def new_room(self) -> None:
        """A public room of alice (power 100); bob joined and has said something; eve invited."""
        r = await self.client(ALICE).post("/createRoom", json={"preset": "public_chat", "name": "fuzz"})
        assert r.status_code == 200, r.text
        self.room_id = r.json()["room_id"]
        assert (await self.client(BOB).post(f"/rooms/{self.room_id}/join")).status_code == 200
        said = await self.client(BOB).put(
            f"/rooms/{self.room_id}/send/m.room.message/f{next(_fresh)}", json={"msgtype": "m.text", "body": "hi"}
        )
        self.message = said.json()["event_id"]
        await self.client(ALICE).post(f"/rooms/{self.room_id}/invite", json={"user_id": EVE})

    async def remote_room(self) -> None:
        create, c = remote_event(REMOTE, "m.room.create", ZED, {"room_version": "10"}, [], 1, state_key="")
        join, self.remote_join = remote_event(REMOTE, MEMBER, ZED, {"membership": "join"}, [c], 2, state_key=ZED)
        await scenario.post_remote(self.client, REMOTE, [create, join])
        self.remote_message, _ = remote_event(REMOTE, "m.room.message", ZED, {"body": "hi"}, [self.remote_join], 3)


Setup = Callable[[Context], Awaitable[Any]]


async def _nothing(ctx: Context) -> None:
    return None


@dataclass(frozen=True)
class Call:
    """A well-formed request to one route, its values filled in from the context when made."""

    method: str
    template: str
    user: str
    path: Callable[[Context], dict[str, str]]
    query: Callable[[Context], dict[str, str]] = lambda ctx: {}
    declared: tuple[str, ...] = ()  # the route's query parameters, fuzzed when absent too
    body: Callable[[Context], Any] | None = None
    #: before the route's requests (and again after a hostile one succeeded): what makes the
    #: well-formed request succeed
    setup: Setup = _nothing
    #: whether a hostile request that succeeded may have changed the room for the next ones
    changes_room: bool = False


def _room(ctx: Context) -> dict[str, str]:
    return {"room_id": ctx.room_id}


def _fresh_txn(ctx: Context) -> str:
    return f"f{next(_fresh)}"


async def _tolerant(request: Awaitable[httpx.Response]) -> None:
    """A setup step that may already hold (an invite of someone invited)."""
    assert (await request).status_code < 500


def _membership(verb: str, user: str, target: str | None, setup: Setup = _nothing) -> Call:
    body = {"reason": "because"} | ({"user_id": target} if target else {})
    return Call(
        "POST", f"/rooms/{{room_id}}/{verb}", user, _room, body=lambda ctx: body, setup=setup, changes_room=True
    )


#: Every field of power levels (each level 50; alice keeps her 100).
POWER_LEVELS = {
    "users": {ALICE: 100},
    "events": {"m.room.name": 50},
    "notifications": {"room": 50},
    **dict.fromkeys(LEVELS, 50),
}


def calls() -> list[Call]:
    """A well-formed request to each route of the plugin."""
    return [
        Call(
            "POST",
            "/createRoom",
            ALICE,
            lambda ctx: {},
            body=lambda ctx: {
                "preset": "public_chat",
                "history_visibility": "shared",
                "name": "n",
                "topic": "t",
                "room_version": "10",
                "initial_state": [
                    {"type": "org.example.x", "state_key": "", "content": {"k": "v"}},
                    {"type": "m.room.join_rules", "state_key": "", "content": {"join_rule": "public"}},
                ],
                "invite": [CAROL],
            },
        ),
        Call(
            "PUT",
            "/rooms/{room_id}/send/{event_type}/{txn_id}",
            ALICE,
            lambda ctx: {"room_id": ctx.room_id, "event_type": "m.room.message", "txn_id": _fresh_txn(ctx)},
            body=lambda ctx: {"msgtype": "m.text", "body": "hello", "m.relates_to": {"event_id": ctx.message}},
        ),
        Call(
            "PUT",
            "/rooms/{room_id}/state/{event_type}",
            ALICE,
            lambda ctx: {"room_id": ctx.room_id, "event_type": "m.room.power_levels"},
            body=lambda ctx: POWER_LEVELS,
            changes_room=True,
        ),
        Call(
            "PUT",
            "/rooms/{room_id}/state/{event_type}/{state_key}",
            ALICE,
            lambda ctx: {"room_id": ctx.room_id, "event_type": MEMBER, "state_key": ALICE},
            body=lambda ctx: {"membership": "join", "displayname": "Alice", "reason": "r"},
            changes_room=True,
        ),
        _membership("join", DAVE, None),
        _membership("leave", DAVE, None, setup=lambda ctx: ctx.client(DAVE).post(f"/rooms/{ctx.room_id}/join")),
        _membership("invite", ALICE, CAROL),
        _membership("kick", ALICE, EVE, setup=_invite_eve),
        _membership("ban", ALICE, EVE),
        _membership("unban", ALICE, EVE, setup=_ban_eve),
        Call(
            "PUT",
            "/rooms/{room_id}/redact/{event_id}/{txn_id}",
            ALICE,
            lambda ctx: {"room_id": ctx.room_id, "event_id": ctx.message, "txn_id": _fresh_txn(ctx)},
            body=lambda ctx: {"reason": "spam"},
        ),
        Call(
            "POST",
            "/rooms/{room_id}/remote_events",
            "server",
            lambda ctx: {"room_id": REMOTE},
            body=lambda ctx: {
                "events": [ctx.remote_message],
                "event_ids": [None],
                "outlier": False,
                "backfill": False,
                "room_version": "10",
            },
        ),
        Call(
            "GET",
            "/rooms/{room_id}/event/{event_id}",
            ALICE,
            lambda ctx: {"room_id": ctx.room_id, "event_id": ctx.message},
            declared=("raw",),
        ),
        Call("GET", "/rooms/{room_id}/state", ALICE, _room, lambda ctx: {"at": ctx.message}, declared=("at",)),
        Call(
            "GET",
            "/rooms/{room_id}/messages",
            ALICE,
            _room,
            lambda ctx: {"dir": "b", "limit": "5", "from": "t9-9"},
            declared=("from", "to", "dir", "limit"),
        ),
        Call(
            "GET",
            "/rooms/{room_id}/backfill",
            "server",
            lambda ctx: {"room_id": REMOTE},
            lambda ctx: {"v": ctx.remote_join, "limit": "10"},
            declared=("v", "limit"),
        ),
        Call("GET", "/events", ALICE, lambda ctx: {}, lambda ctx: {"limit": "5"}, declared=("from", "limit")),
        Call(
            "GET",
            "/recent",
            ALICE,
            lambda ctx: {},
            lambda ctx: {"rooms": "5", "limit": "5"},
            declared=("rooms", "limit"),
        ),
    ]


async def _invite_eve(ctx: Context) -> None:
    await _tolerant(ctx.client(ALICE).post(f"/rooms/{ctx.room_id}/unban", json={"user_id": EVE}))
    await _tolerant(ctx.client(ALICE).post(f"/rooms/{ctx.room_id}/invite", json={"user_id": EVE}))


async def _ban_eve(ctx: Context) -> None:
    await _tolerant(ctx.client(ALICE).post(f"/rooms/{ctx.room_id}/ban", json={"user_id": EVE}))


# -- places and requests ------------------------------------------------------------------------------------

#: Where a request is made hostile: ("path", name), ("query", name), ("value" | "missing" | "odd key",
#: path into the body), ("body",) for the whole body, or ("nowhere",).
Place = tuple[Any, ...]


def _paths(value: Any, prefix: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    """The path of every value inside ``value`` (not ``value`` itself)."""
    children = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    for key, child in children:
        yield (*prefix, key)
        yield from _paths(child, (*prefix, key))


def places(call: Call, ctx: Context) -> list[Place]:
    out: list[Place] = [("nowhere",)]
    out += [("path", n) for n in re.findall(r"{(\w+)}", call.template)]
    out += [("query", n) for n in (*call.declared, "x")]
    if call.body is not None:
        body = call.body(ctx)
        out.append(("body",))
        out += [("odd key", ())] + [("odd key", p) for p in _paths(body) if isinstance(_at(body, p), dict)]
        for path in _paths(body):
            out += [("value", path)] + ([("missing", path)] if isinstance(path[-1], str) else [])
    return out


def _at(value: Any, path: tuple[Any, ...]) -> Any:
    for key in path:
        value = value[key]
    return value


def _mutated(body: Any, place: Place, value: Any) -> Any:
    """A deep copy of ``body`` made hostile at ``place``."""
    body = json.loads(json.dumps(body))
    kind, path = place
    parent = _at(body, path[:-1]) if path else None
    if kind == "value":
        parent[path[-1]] = value
    elif kind == "missing":
        del parent[path[-1]]
    else:  # an odd key beside the others
        _at(body, path)[value] = "odd"
    return body


def _encoded(body: Any) -> bytes:
    """JSON text, non-ASCII escaped (so a lone surrogate travels as ``\\udXXX``), :class:`Deep` written out."""
    deep: list[str] = []

    def default(value: Any) -> str:
        deep.append(value.text)
        return f"__deep{len(deep) - 1}__"

    text = json.dumps(body, default=default)
    for i, nested in enumerate(deep):
        text = text.replace(f'"__deep{i}__"', nested)
    return text.encode("ascii")


def _url_part(value: str) -> str:
    """``value`` percent-encoded, the bytes of a lone surrogate included (as a broken client sends)."""
    return quote(value.encode("utf-8", "surrogatepass"), safe="")


@dataclass(frozen=True)
class Request:
    method: str
    url: str
    user: str
    body: bytes | None
    place: Place
    kind: str


def make(call: Call, ctx: Context, place: Place, kind: str = "", value: Any = None) -> Request:
    path, query = call.path(ctx), call.query(ctx)
    body = call.body(ctx) if call.body is not None else None
    if place[0] == "path":
        path[place[1]] = value
    elif place[0] == "query":
        query[place[1]] = value
    elif place[0] in ("value", "missing", "odd key"):
        body = _mutated(body, place, value)
    raw = _encoded(body) if body is not None else None
    if place[0] == "body":
        raw = value
    url = call.template
    for name, part in path.items():
        url = url.replace("{" + name + "}", _url_part(part))
    if query:
        url += "?" + "&".join(f"{_url_part(k)}={_url_part(v)}" for k, v in query.items())
    return Request(call.method, url, call.user, raw, place, kind)


def sweep(call: Call, ctx: Context) -> Iterator[Request]:
    """The well-formed request, then each place of ``call`` with each kind of hostile value."""
    for place in places(call, ctx):
        if place[0] == "nowhere" or place[0] == "missing":
            yield make(call, ctx, place)
        elif place[0] in ("path", "query"):
            yield from (make(call, ctx, place, k, v) for k, v in PARAM_VALUES.items())
        elif place[0] == "body":
            yield from (make(call, ctx, place, k, v) for k, v in WHOLE_BODIES.items())
        elif place[0] == "odd key":
            yield from (
                make(call, ctx, place, k, v) for k, v in (("nul", "k\x00"), ("surrogate", "\udfff"), ("empty", ""))
            )
        else:
            yield from (make(call, ctx, place, k, v) for k, v in FIELD_VALUES.items())


# -- what every answer must be --------------------------------------------------------------------------------


def _field_names(place: Place) -> tuple[str, ...]:
    """The names a refusal of a request hostile at ``place`` may give: the parameter, or the body's
    field (its key, or the list's key for an item of a list)."""
    if place[0] in ("path", "query"):
        return (str(place[1]),)
    if place[0] in ("value", "missing", "odd key"):
        keys = [k for k in place[1] if isinstance(k, str)]
        return tuple(keys[-1:]) or ("body",)
    return ("body",)


def check_answer(
    request: Request, response: httpx.Response, stored_before: dict[str, int], stored_after: dict[str, int]
) -> None:
    seen = (request.method, request.url[:200], request.place, request.kind, (request.body or b"")[:200])
    assert response.status_code < 500, (response.status_code, response.text[:300], *seen)
    if response.status_code < 400:
        return
    body = response.json()
    assert set(body) == {"errcode", "error"} and body["errcode"].startswith("M_"), (*seen, body)
    assert stored_after == stored_before, (*seen, "a refused request stored something", body)
    if response.status_code != 400 or request.place[0] == "nowhere":
        return
    if request.kind == "drawn" and request.place[0] == "body":  # any body: a refusal names some field
        named = re.match(r"[^\s:][^:]*: \S", body["error"]) or re.match(r"(the request )?body", body["error"])
        assert named, (body["error"], "names no field", *seen)
        return
    drawn = request.kind == "drawn"
    problems = [w for ws in PROBLEM_WORDS.values() for w in ws] if drawn else PROBLEM_WORDS.get(request.kind, ())
    words = (*_field_names(request.place), *problems)
    assert any(w in body["error"] for w in words), (body["error"], f"names none of {words}", *seen)


class Fuzzer:
    """Makes requests one at a time, checking each answer; recreates the room where a hostile
    request that succeeded may have changed it."""

    def __init__(self, main: Host, ctx: Context) -> None:
        self.main, self.ctx = main, ctx
        self.statuses: dict[str, set[int]] = {}

    async def one(self, call: Call, request: Request) -> int:
        before = await table_counts(self.main)
        body = {"content": request.body} if request.body is not None else {}
        response = await self.ctx.client(request.user).request(request.method, request.url, **body)
        check_answer(request, response, before, await table_counts(self.main))
        self.statuses.setdefault(call.template + " " + call.method, set()).add(response.status_code)
        if response.status_code == 200 and request.place[0] != "nowhere" and call.changes_room:
            await self.ctx.new_room()
            await call.setup(self.ctx)
        return response.status_code


@pytest.fixture
async def fuzzer(main: Host, client: Clients) -> Fuzzer:
    ctx = Context(client)
    await ctx.new_room()
    await ctx.remote_room()
    return Fuzzer(main, ctx)


def test_the_fuzzed_routes_are_every_route_of_the_plugin() -> None:
    assert {(c.method, c.template) for c in calls()} == {(m, r.path) for r in ROUTES for m in r.methods}


async def test_every_place_of_every_route_with_every_kind_of_hostile_value(fuzzer: Fuzzer) -> None:
    for call in calls():
        await call.setup(fuzzer.ctx)
        first = True
        for request in sweep(call, fuzzer.ctx):
            status = await fuzzer.one(call, request)
            if first:  # the well-formed request gets past every check
                assert status == 200, (call.method, call.template, status)
                first = False
    # every route refused something, and let something through
    assert all(s & {200} and s - {200} for s in fuzzer.statuses.values()), fuzzer.statuses


_TEXT = st.one_of(
    st.sampled_from([*PARAM_VALUES.values()]),
    st.text(st.characters(exclude_categories=()), max_size=12),  # surrogates and controls included
)
_INTEGERS = st.one_of(st.integers(), st.integers(min_value=2**63 - 2, max_value=2**80), st.integers(max_value=-(2**63)))
_JSON = st.recursive(
    st.one_of(st.none(), st.booleans(), _INTEGERS, st.floats(allow_nan=False), _TEXT),
    lambda children: st.one_of(st.lists(children, max_size=3), st.dictionaries(_TEXT, children, max_size=3)),
    max_leaves=8,
)


async def test_hostile_requests_drawn_at_random(fuzzer: Fuzzer) -> None:
    loop = asyncio.get_running_loop()
    all_calls = calls()
    for call in all_calls:
        await call.setup(fuzzer.ctx)

    @st.composite
    def requests(draw: st.DrawFn) -> tuple[Call, Request]:
        call = draw(st.sampled_from(all_calls))
        place = draw(st.sampled_from(places(call, fuzzer.ctx)))
        if place[0] in ("path", "query"):
            return call, make(call, fuzzer.ctx, place, "drawn", draw(_TEXT))
        if place[0] == "body":
            return call, make(
                call, fuzzer.ctx, place, "drawn", draw(st.one_of(st.binary(max_size=16), _JSON.map(_encoded)))
            )
        if place[0] == "odd key":
            return call, make(call, fuzzer.ctx, place, "drawn", draw(_TEXT))
        return call, make(call, fuzzer.ctx, place, "drawn", draw(_JSON))

    @settings(max_examples=200, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
    @given(requests())
    def fuzz(drawn: tuple[Call, Request]) -> None:
        # hypothesis runs the test body synchronously; each example runs on this test's loop
        asyncio.run_coroutine_threadsafe(fuzzer.one(*drawn), loop).result(60)

    await asyncio.to_thread(fuzz)
