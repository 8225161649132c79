"""Every route of a real host, fuzzed: never a 500, and a refused request stores nothing.

The routes come from the host's own ``/openapi.json`` (core routes, the bundled plugins' and the
``inbox`` test plugin's), so a new route is fuzzed without touching this test. Each request is
well-formed except in at most one place, a path parameter, a query parameter (declared or not, name
or value), a header (the bearer token among them) or the body, where it holds NUL, lone surrogates,
random text or integers outside ``bigint``; the well-formed rest gets requests past the endpoints' own
checks, so that the fuzzing reaches the database too.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Callable
from typing import Any
from urllib.parse import quote

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.host.conftest import ALICE_USER, WRITER_USER, stored

#: Values that get a request past the endpoints' own checks (the writer's user, a device ...).
_GOOD = [
    WRITER_USER,
    ALICE_USER,
    "@bob:hs",
    "DEV",
    "m.test",
    "m.read",
    "!room:hs",
    "$event:hs",
    "inbox",
    "txn1",
    "*",
    "0",
]
_NASTY = ["\u0000", "a\u0000b", "\ud800", "x\udfffy", "\ud83d", "\udc00\ud800", "%00", " ", "/", "\\"]
_HUGE = st.one_of(
    st.sampled_from([2**63, -(2**63) - 1, 10**30, -(10**30), 10**400]),
    st.integers(min_value=2**63, max_value=2**80),
    st.integers(min_value=-(2**80), max_value=-(2**63) - 1),
)
_NUMBERS = st.one_of(
    st.sampled_from([2**63 - 1, -(2**63), -1, 0]), st.integers(min_value=-(2**63), max_value=2**63 - 1)
)
_NASTY_TEXT = st.one_of(
    st.sampled_from(_NASTY),
    st.text(st.characters(exclude_categories=()), min_size=1, max_size=8),  # surrogates and controls included
    _HUGE.map(str),
    st.tuples(st.sampled_from(_GOOD), st.sampled_from(_NASTY), st.sampled_from(_GOOD)).map("".join),
)
_CLEAN_TEXT = st.one_of(st.sampled_from(_GOOD), st.text(st.characters(exclude_categories=("Cs", "Cc")), max_size=8))


def _json(text: st.SearchStrategy[str], numbers: st.SearchStrategy[int]) -> st.SearchStrategy[Any]:
    """JSON values with ``text`` for strings and keys and ``numbers`` for integers."""
    return st.recursive(
        st.one_of(st.none(), st.booleans(), numbers, st.floats(allow_nan=False), text),
        lambda children: st.one_of(st.lists(children, max_size=3), st.dictionaries(text, children, max_size=3)),
        max_leaves=6,
    )


def _bodies(text: st.SearchStrategy[str], numbers: st.SearchStrategy[int]) -> st.SearchStrategy[Any]:
    """Bodies shaped like what the routes take (an object; to-device messages; inbox messages; a
    membership change naming a user; a batch of remote events; typing; presence), and any JSON value."""
    value = _json(text, numbers)
    obj = st.dictionaries(text, value, max_size=3)
    user = st.one_of(st.sampled_from([WRITER_USER, ALICE_USER, "@bob:hs"]), text)
    return st.one_of(
        obj,
        st.fixed_dictionaries({"messages": st.dictionaries(user, st.dictionaries(text, obj, max_size=2), max_size=2)}),
        st.lists(st.fixed_dictionaries({"user_id": text, "body": text}), min_size=1, max_size=2),
        st.fixed_dictionaries({"user_id": user}, optional={"reason": text}),
        st.fixed_dictionaries({"events": st.lists(obj, max_size=2)}),
        st.fixed_dictionaries({"typing": st.booleans()}, optional={"timeout": numbers}),
        st.fixed_dictionaries(
            {"presence": st.sampled_from(["online", "unavailable", "offline"])}, optional={"status_msg": text}
        ),
        value,
    )


_CLEAN_BODY = _bodies(_CLEAN_TEXT, _NUMBERS)
_NASTY_BODY = st.one_of(
    _bodies(st.one_of(_CLEAN_TEXT, _NASTY_TEXT), st.one_of(_NUMBERS, _HUGE)),
    st.binary(min_size=1, max_size=12),
)


def _encode(value: str) -> str:
    """``value`` as a URL component, the bytes of a surrogate included (as a broken client would)."""
    return quote(value.encode("utf-8", "surrogatepass"), safe="") or "x"


def _body(value: Any) -> bytes | None:
    """JSON text of ``value`` with non-ASCII escaped, so lone surrogates travel as ``\\udXXX``."""
    if value is None or isinstance(value, bytes):
        return value
    return json.dumps(value).encode("ascii")


#: ``(method, url, headers, body)``
FuzzedRequest = tuple[str, str, list[tuple[bytes, bytes]], bytes | None]
#: Where a request is broken: nowhere (it should get past the checks), or in one place.
_SPOTS = ["nowhere", "path", "query", "header", "body"]


@st.composite
def requests_to(draw: st.DrawFn, method: str, template: str, operation: dict[str, Any]) -> FuzzedRequest:
    """A request to one operation of the OpenAPI schema, well-formed except in one place (or none):
    a path parameter, a query parameter (declared or not, name or value), a header (the bearer token
    among them) or the body (any field, at any depth)."""
    path_names = [p["name"] for p in operation["parameters"] if p["in"] == "path"]
    query_names = [p["name"] for p in operation["parameters"] if p["in"] == "query"]
    writer = operation["x-factstream-access"] == "writer"
    caller = WRITER_USER if writer else ALICE_USER
    # A parameter named user_id is the caller's own (else the plugins answer 403 before anything else).
    path = {n: caller if n == "user_id" else draw(st.sampled_from(_GOOD)) for n in path_names}
    query = [(n, draw(_CLEAN_TEXT)) for n in query_names if draw(st.booleans())]
    headers = [(b"authorization", b"Bearer writer-token" if writer else b"Bearer alice-token")]
    has_body = method in ("PUT", "POST", "PATCH")
    body = _body(draw(_CLEAN_BODY)) if has_body else None
    spot = draw(st.sampled_from(_SPOTS))
    if spot == "path" and path_names:
        path[draw(st.sampled_from(path_names))] = draw(_NASTY_TEXT)
    elif spot == "query":
        name = draw(st.one_of(st.sampled_from([*query_names, "x"]), _NASTY_TEXT))
        query.append((name, draw(st.one_of(_NASTY_TEXT, _CLEAN_TEXT))))
    elif spot == "header":
        fuzz = draw(st.text(st.characters(exclude_categories=()), max_size=6)).encode("utf-8", "surrogatepass")
        headers = draw(
            st.sampled_from(
                [
                    [(b"authorization", b"Bearer alice\x00token")],
                    [(b"authorization", b"Bearer " + fuzz)],
                    [*headers, (b"x-fuzz", fuzz + b"\x00")],
                    [],
                ]
            )
        )
    elif spot in ("path", "body"):  # a route without path parameters gets a bad body instead (GET too)
        body = _body(draw(_NASTY_BODY))
    url = template
    for name, value in path.items():
        url = url.replace("{" + name + "}", _encode(value))
    if query:
        url += "?" + "&".join(f"{_encode(k)}={_encode(v)}" for k, v in query)
    return method, url, headers, body


async def test_every_route_fuzzed_is_never_a_500_and_a_refusal_stores_nothing(full_host, full_client):
    openapi = (await full_client().get("/openapi.json")).json()
    operations = [(m.upper(), path, op) for path, methods in openapi["paths"].items() for m, op in methods.items()]
    # These must be among the routes fuzzed; every other route the host lists is fuzzed too.
    assert {
        ("GET", "/sync"),
        ("GET", "/streams/{name}/positions"),
        ("PUT", "/devices/{device_id}"),
        ("PUT", "/sendToDevice/{event_type}/{txn_id}"),
        ("PUT", "/user/{user_id}/account_data/{type}"),
        ("PUT", "/user/{user_id}/rooms/{room_id}/account_data/{type}"),
        ("GET", "/user/{user_id}/account_data/{type}"),
        ("POST", "/inbox/messages"),
    } <= {(m, p) for m, p, _ in operations}
    client = full_client()
    loop = asyncio.get_running_loop()
    initial = await stored(full_host)
    before = [initial]
    statuses: dict[str, set[int]] = {}

    async def one(request: FuzzedRequest) -> int:
        method, url, headers, body = request
        response = await client.request(method, url, headers=headers, content=body)
        seen = (method, url, headers, body, response.status_code, response.text[:300])
        assert response.status_code < 500, seen
        after = await stored(full_host)
        if response.status_code >= 400:
            assert set(response.json()) == {"errcode", "error"}, seen
            assert response.json()["errcode"].startswith("M_"), seen
            assert after == before[0], seen
        before[0] = after
        return response.status_code

    def fuzzer(route: str, requests: st.SearchStrategy[FuzzedRequest]) -> Callable[[], None]:
        @settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
        @given(requests)
        def fuzz(request: FuzzedRequest) -> None:
            # hypothesis runs the test body synchronously; run each example on this test's loop.
            status = asyncio.run_coroutine_threadsafe(one(request), loop).result(30)
            statuses.setdefault(route, set()).add(status)

        return fuzz

    for method, template, operation in operations:
        await asyncio.to_thread(fuzzer(f"{method} {template}", requests_to(method, template, operation)))
    assert set(statuses) == {f"{method} {template}" for method, template, _ in operations}
    # The fuzzing got past the checks too: every route answered something besides a refusal (its
    # data, or a 404 for data that is not there), and some requests wrote.
    assert {r: c for r, c in statuses.items() if not c - {400, 401, 403, 413}} == {}
    assert await stored(full_host) != initial
