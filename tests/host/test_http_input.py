"""Input PostgreSQL cannot store is refused at the HTTP edge, on core and plugin routes alike.

NUL (no ``text`` value holds it), lone UTF-16 surrogates (not encodable for the database) and
integers outside ``bigint`` are answered with a 400 naming the field, before the token lookup and
before the endpoint runs, so nothing reaches the database and nothing is a 500. The tests run a real
host with every installed plugin (the bundled ones and the ``inbox`` test plugin) on a real
PostgreSQL; the property test at the end fuzzes every route the host lists in ``/openapi.json``.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable
from typing import Any
from urllib.parse import quote

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from factstream.config import load_config
from factstream.host.app import Host
from factstream.host.storable import MAX_BODY_BYTES
from factstream.migrate import Migrator
from factstream.plugins import load_plugins
from tests.host.conftest import INBOX_PROJECT, TOKENS, free_port

WRITER = "@service:hs"  # the user of writer-token
ALICE = "@alice:hs"  # the user of alice-token
NUL_MESSAGE = "contains a NUL character"


@pytest.fixture
async def full_host(plugin_installer, fresh_database, tmp_path) -> AsyncIterator[Host]:
    """A started host with every installed plugin, the ``inbox`` test plugin among them.

    Long polls are capped at 0.2 s so that fuzzed ``timeout`` values cannot stall a test.
    """
    plugin_installer.from_project(INBOX_PROJECT)
    plugins = load_plugins()
    if not {"account_data", "to_device"} <= set(plugins.registry.streams.names()):
        pytest.skip("the bundled account_data and to_device plugins are not installed (uv sync --all-packages)")
    migrator = Migrator(fresh_database, plugins)
    migrator.upgrade()
    migrator.close()
    settings = load_config(
        environ={},
        deployment="inputtest",
        instance_name="main",
        state_dir=str(tmp_path / "state"),
        database={"url": fresh_database},
        instance_map={"main": {"host": "127.0.0.1", "replication_port": free_port()}},
        stream_writers={"inbox": ["main"], "account_data": ["main"], "to_device": ["main"]},
        http={
            "tokens": TOKENS,
            "port": free_port(),
            "sync_timeout_max_seconds": 0.2,
            "catch_up_timeout_seconds": 0.2,
        },
    )
    host = Host(settings, plugins)
    await host.start()
    yield host
    await host.stop()


@pytest.fixture
async def http(full_host: Host) -> AsyncIterator[Callable[..., httpx.AsyncClient]]:
    """``http(token=None)`` -> an httpx client on the host's ASGI app."""
    clients: list[httpx.AsyncClient] = []

    def make(token: str | None = None) -> httpx.AsyncClient:
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        c = httpx.AsyncClient(transport=httpx.ASGITransport(app=full_host.app), base_url="http://test", headers=headers)
        clients.append(c)
        return c

    yield make
    for c in clients:
        await c.aclose()


async def stored(host: Host) -> dict[str, tuple[int, Any]]:
    """Row count and highest stream ID of every stream's backing tables, and row counts of every
    other table of the database (a device registered, a transaction remembered ...)."""
    db = host.database()
    out: dict[str, tuple[int, Any]] = {}
    for reg in host.plugins.registry.streams:
        for table in reg.spec.tables:
            rows = await db.fetchall(f"SELECT count(*), max({table.id_column}) FROM {table.table}")
            out[table.table] = (rows[0][0], rows[0][1])
    names = await db.fetchall("SELECT tablename FROM pg_tables WHERE schemaname = current_schema()")
    for (name,) in names:
        if name not in out:
            rows = await db.fetchall(f'SELECT count(*) FROM "{name}"')
            out[name] = (rows[0][0], None)
    return out


def refused(response: httpx.Response, status: int = 400) -> str:
    """The message of a refusal with ``status``."""
    assert response.status_code == status, (response.status_code, response.text)
    message: str = response.json()["error"]
    return message


# -- the cases of issue 15, each a 500 before ------------------------------------------------------------


async def test_a_nul_in_a_device_id_path_segment_is_400_naming_the_parameter(full_host, http):
    before = await stored(full_host)
    response = await http("alice-token").put("/devices/DE%00V", json={})
    assert response.json() == {
        "errcode": "M_INVALID_PARAM",
        "error": "path parameter 'device_id' contains a NUL character",
    }
    assert response.status_code == 400
    assert await stored(full_host) == before


@pytest.mark.parametrize(
    ("path", "parameter"),
    [
        ("/sendToDevice/m.te%00st/txn1", "event_type"),
        ("/sendToDevice/m.test/tx%00n1", "txn_id"),
    ],
)
async def test_a_nul_in_an_event_type_or_txn_id_is_400(full_host, http, path, parameter):
    before = await stored(full_host)
    body = {"messages": {ALICE: {"DEV": {"hello": "world"}}}}
    response = await http("writer-token").put(path, json=body)
    assert refused(response) == f"path parameter '{parameter}' {NUL_MESSAGE}"
    assert response.json()["errcode"] == "M_INVALID_PARAM"
    assert await stored(full_host) == before


@pytest.mark.parametrize(
    ("path", "parameter"),
    [
        (f"/user/{WRITER}/account_data/m.ty%00pe", "type"),
        (f"/user/{WRITER}/rooms/!ro%00om:hs/account_data/m.type", "room_id"),
        (f"/user/{WRITER}/rooms/!room:hs/account_data/m.ty%00pe", "type"),
    ],
)
async def test_a_nul_in_an_account_data_type_or_room_id_is_400_for_reads_and_writes(full_host, http, path, parameter):
    before = await stored(full_host)
    writer = http("writer-token")
    for response in (await writer.put(path, json={"a": 1}), await writer.get(path)):
        assert refused(response) == f"path parameter '{parameter}' {NUL_MESSAGE}"
    assert await stored(full_host) == before


@pytest.mark.parametrize("where", ["user", "device"])
async def test_a_nul_in_a_user_id_or_device_id_of_a_to_device_body_is_400_naming_the_field(full_host, http, where):
    before = await stored(full_host)
    user, device = ("@bob:hs\u0000", "DEV") if where == "user" else ("@bob:hs", "D\u0000EV")
    body = {"messages": {user: {device: {"hello": "world"}}}}
    response = await http("writer-token").put("/sendToDevice/m.test/txn1", json=body)
    field = "messages.@bob:hs\\x00" if where == "user" else "messages.@bob:hs.D\\x00EV"
    assert refused(response) == f"body field name '{field}' {NUL_MESSAGE}"
    assert response.json()["errcode"] == "M_BAD_JSON"
    assert await stored(full_host) == before
    # Without the NUL the same request is served (the body reached the plugin whole).
    body = {"messages": {"@bob:hs": {"DEV": {"n": 2**62, "text": "\u00e9\U0001f600"}}}}
    sent = await http("writer-token").put("/sendToDevice/m.test/txn1", json=body)
    assert sent.status_code == 200, sent.text


async def test_sync_with_a_nul_device_is_400(full_host, http):
    response = await http("alice-token").get("/sync?device=%00")
    assert response.json() == {"error": f"query parameter 'device' {NUL_MESSAGE}"}
    assert response.status_code == 400


async def test_a_nul_in_the_bearer_token_is_400_before_any_token_lookup(full_host, http):
    response = await http().get("/sync", headers={"Authorization": "Bearer alice\u0000token"})
    assert refused(response) == f"header 'authorization' {NUL_MESSAGE}"


# -- the rule, field by field ----------------------------------------------------------------------------


async def test_core_routes_answer_in_the_core_shape(full_host, http):
    response = await http("alice-token").get("/streams/in%00box/positions")
    assert response.json() == {"error": f"path parameter 'name' {NUL_MESSAGE}"}
    assert response.status_code == 400


async def test_a_nul_in_a_query_parameter_name_is_400(full_host, http):
    response = await http("alice-token").get("/sync?dev%00ice=D")
    assert refused(response) == f"query parameter name 'dev\\x00ice' {NUL_MESSAGE}"


async def test_a_lone_surrogate_in_a_json_body_is_400_and_nothing_is_stored(full_host, http):
    before = await stored(full_host)
    writer = http("writer-token")
    content = b'{"text": "half an emoji \\ud83d"}'
    response = await writer.put(f"/user/{WRITER}/account_data/m.type", content=content)
    assert refused(response) == (
        "body field 'text' contains a lone UTF-16 surrogate (\\ud83d), which is not valid Unicode text"
    )
    assert response.json()["errcode"] == "M_BAD_JSON"
    # The same bytes with the pair complete are stored.
    whole = await writer.put(f"/user/{WRITER}/account_data/m.type", content=b'{"text": "\\ud83d\\ude00"}')
    assert whole.status_code == 200, whole.text
    assert await stored(full_host) != before


async def test_surrogate_bytes_that_json_loads_would_accept_are_400(full_host, http):
    # b"\xed\xa0\x80" is not UTF-8, but json.loads(bytes) (Starlette's request.json()) decodes it with
    # surrogatepass into "\ud800".
    writer = http("writer-token")
    response = await writer.post("/inbox/messages", content=b'{"user_id": "@a:hs", "body": "\xed\xa0\x80"}')
    assert "body field 'body' contains a lone UTF-16 surrogate (\\ud800)" in refused(response)
    # A body that is not JSON at all is left to the endpoint, which refuses it in its own words.
    response = await writer.put(f"/user/{WRITER}/account_data/m.type", content=b"\x00\xed\xa0\x80 binary")
    assert response.json()["errcode"] == "M_NOT_JSON"


@pytest.mark.parametrize(
    "number", [str(2**63), str(-(2**63) - 1), "1" + "0" * 5000], ids=["2**63", "-2**63-1", "10**5000"]
)
async def test_an_integer_outside_bigint_in_a_json_body_is_400(full_host, http, number):
    before = await stored(full_host)
    content = f'{{"a": {{"b": [1, {number}]}}}}'.encode()
    response = await http("writer-token").put(f"/user/{WRITER}/account_data/m.type", content=content)
    assert refused(response).startswith("body field 'a.b[1]' is an integer outside the range PostgreSQL stores")
    assert await stored(full_host) == before
    # The ends of the range are fine, and so is a long run of digits in a string.
    content = f'{{"low": {-(2**63)}, "high": {2**63 - 1}, "id": "{"9" * 40}"}}'.encode()
    response = await http("writer-token").put(f"/user/{WRITER}/account_data/m.type", content=content)
    assert response.status_code == 200, response.text


async def test_a_surrogate_in_a_path_parameter_is_400_whatever_the_server_decodes(full_host):
    # uvicorn and httpx decode %ED%A0%80 to U+FFFD; an ASGI server that kept the surrogate must not get
    # it past the host either.
    scope = {
        "type": "http",
        "asgi": {"version": "3.0"},
        "http_version": "1.1",
        "method": "PUT",
        "scheme": "http",
        "path": "/devices/D\udc80V",
        "raw_path": b"/devices/D%ED%B2%80V",
        "query_string": b"",
        "root_path": "",
        "headers": [(b"authorization", b"Bearer alice-token"), (b"content-length", b"2")],
        "client": ("127.0.0.1", 1),
        "server": ("test", 80),
    }
    messages: list[dict[str, Any]] = []
    incoming = [{"type": "http.request", "body": b"{}", "more_body": False}]

    async def receive() -> dict[str, Any]:
        return incoming.pop(0) if incoming else {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        messages.append(message)

    await full_host.app(scope, receive, send)
    assert messages[0]["status"] == 400
    assert json.loads(messages[1]["body"])["error"] == (
        "path parameter 'device_id' contains a lone UTF-16 surrogate (\\udc80), which is not valid Unicode text"
    )


async def test_a_body_over_the_hosts_limit_is_413(full_host, http):
    response = await http("writer-token").put(
        f"/user/{WRITER}/account_data/m.type", content=b" " * (MAX_BODY_BYTES + 1)
    )
    assert "the host's limit" in refused(response, 413)
    assert response.json()["errcode"] == "M_TOO_LARGE"


@pytest.mark.parametrize("timeout", ["9999999999", "1" + "0" * 5000, "000000000000000000001"])
async def test_a_large_sync_timeout_is_capped_not_refused(full_host, http, timeout):
    alice = http("alice-token")
    first = await alice.get("/sync")
    loop = asyncio.get_running_loop()
    started = loop.time()
    response = await alice.get("/sync", params={"since": first.json()["next_batch"], "timeout": timeout})
    assert response.status_code == 200, response.text
    assert loop.time() - started < 5  # the cap of this host is 0.2 s


async def test_through_the_real_server_nul_and_surrogate_bytes_are_never_a_500(full_host):
    assert full_host.http is not None
    host, port = full_host.http.url.removeprefix("http://").split(":")
    answers = []
    for path, extra in (
        ("/devices/DE%00V", b""),
        ("/devices/D%ED%A0%80V", b""),  # the server decodes the bytes to U+FFFD: storable
        ("/devices/DEV", b"X-Fuzz: a\x00b\r\n"),
    ):
        reader, writer = await asyncio.open_connection(host, int(port))
        writer.write(
            f"PUT {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer alice-token\r\n".encode()
            + extra
            + b"Content-Length: 2\r\nConnection: close\r\n\r\n{}"
        )
        status_line = await reader.readline()
        await reader.read()
        writer.close()
        answers.append(int(status_line.split()[1]))
    assert answers == [400, 200, 400]


# -- every route, fuzzed ---------------------------------------------------------------------------------

#: Values that get a request past the endpoints' own checks (the writer's user, a device ...).
_GOOD = [WRITER, ALICE, "@bob:hs", "DEV", "m.test", "!room:hs", "inbox", "txn1", "*", "0"]
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
    """Bodies shaped like what the routes take (an object; to-device messages; inbox messages), and
    any JSON value at all."""
    value = _json(text, numbers)
    obj = st.dictionaries(text, value, max_size=3)
    user = st.one_of(st.sampled_from([WRITER, ALICE, "@bob:hs"]), text)
    return st.one_of(
        obj,
        st.fixed_dictionaries({"messages": st.dictionaries(user, st.dictionaries(text, obj, max_size=2), max_size=2)}),
        st.lists(st.fixed_dictionaries({"user_id": text, "body": text}), min_size=1, max_size=2),
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
    caller = WRITER if writer else ALICE
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
    elif spot == "body" or (spot == "path" and not has_body):
        body = _body(draw(_NASTY_BODY))
    url = template
    for name, value in path.items():
        url = url.replace("{" + name + "}", _encode(value))
    if query:
        url += "?" + "&".join(f"{_encode(k)}={_encode(v)}" for k, v in query)
    return method, url, headers, body


async def test_every_route_fuzzed_is_never_a_500_and_a_refusal_stores_nothing(full_host, http):
    openapi = (await http().get("/openapi.json")).json()
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
    client = http()
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
            assert "error" in response.json(), seen
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
