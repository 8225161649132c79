"""Input PostgreSQL cannot store is refused at the HTTP edge, on core and plugin routes alike.

NUL (no ``text`` value holds it), lone UTF-16 surrogates (not encodable for the database) and
integers outside ``bigint`` are answered with a 400 naming the field, before the token lookup and
before the endpoint runs, so nothing reaches the database and nothing is a 500. The tests run a real
host with every installed plugin (the bundled ones and the ``inbox`` test plugin) on a real
PostgreSQL (fixtures in ``tests/host/conftest.py``); ``test_http_fuzz.py`` fuzzes every route.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import pytest

from factstream.host.storable import MAX_BODY_BYTES
from tests.host.conftest import ALICE_USER, WRITER_USER, stored

NUL_MESSAGE = "contains a NUL character"


def refused(response: httpx.Response, status: int = 400) -> str:
    """The message of a refusal with ``status``."""
    assert response.status_code == status, (response.status_code, response.text)
    message: str = response.json()["error"]
    return message


# -- the cases of issue 15, each a 500 before ------------------------------------------------------------


async def test_a_nul_in_a_device_id_path_segment_is_400_naming_the_parameter(full_host, full_client):
    before = await stored(full_host)
    response = await full_client("alice-token").put("/devices/DE%00V", json={})
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
async def test_a_nul_in_an_event_type_or_txn_id_is_400(full_host, full_client, path, parameter):
    before = await stored(full_host)
    body = {"messages": {ALICE_USER: {"DEV": {"hello": "world"}}}}
    response = await full_client("writer-token").put(path, json=body)
    assert refused(response) == f"path parameter '{parameter}' {NUL_MESSAGE}"
    assert response.json()["errcode"] == "M_INVALID_PARAM"
    assert await stored(full_host) == before


@pytest.mark.parametrize(
    ("path", "parameter"),
    [
        (f"/user/{WRITER_USER}/account_data/m.ty%00pe", "type"),
        (f"/user/{WRITER_USER}/rooms/!ro%00om:hs/account_data/m.type", "room_id"),
        (f"/user/{WRITER_USER}/rooms/!room:hs/account_data/m.ty%00pe", "type"),
    ],
)
async def test_a_nul_in_an_account_data_type_or_room_id_is_400_for_reads_and_writes(
    full_host, full_client, path, parameter
):
    before = await stored(full_host)
    writer = full_client("writer-token")
    for response in (await writer.put(path, json={"a": 1}), await writer.get(path)):
        assert refused(response) == f"path parameter '{parameter}' {NUL_MESSAGE}"
    assert await stored(full_host) == before


@pytest.mark.parametrize("where", ["user", "device"])
async def test_a_nul_in_a_user_id_or_device_id_of_a_to_device_body_is_400_naming_the_field(
    full_host, full_client, where
):
    before = await stored(full_host)
    user, device = ("@bob:hs\u0000", "DEV") if where == "user" else ("@bob:hs", "D\u0000EV")
    body = {"messages": {user: {device: {"hello": "world"}}}}
    response = await full_client("writer-token").put("/sendToDevice/m.test/txn1", json=body)
    field = "messages.@bob:hs\\x00" if where == "user" else "messages.@bob:hs.D\\x00EV"
    assert refused(response) == f"body field name '{field}' {NUL_MESSAGE}"
    assert response.json()["errcode"] == "M_BAD_JSON"
    assert await stored(full_host) == before
    # Without the NUL the same request is served (the body reached the plugin whole).
    body = {"messages": {"@bob:hs": {"DEV": {"n": 2**62, "text": "\u00e9\U0001f600"}}}}
    sent = await full_client("writer-token").put("/sendToDevice/m.test/txn1", json=body)
    assert sent.status_code == 200, sent.text


async def test_sync_with_a_nul_device_is_400(full_host, full_client):
    response = await full_client("alice-token").get("/sync?device=%00")
    assert response.json() == {"errcode": "M_INVALID_PARAM", "error": f"query parameter 'device' {NUL_MESSAGE}"}
    assert response.status_code == 400


async def test_a_nul_in_the_bearer_token_is_400_before_any_token_lookup(full_host, full_client):
    response = await full_client().get("/sync", headers={"Authorization": "Bearer alice\u0000token"})
    assert refused(response) == f"header 'authorization' {NUL_MESSAGE}"
    assert response.json()["errcode"] == "M_INVALID_PARAM"


# -- the rule, field by field ----------------------------------------------------------------------------


async def test_core_routes_answer_in_the_same_shape_as_plugin_routes(full_host, full_client):
    response = await full_client("alice-token").get("/streams/in%00box/positions")
    assert response.json() == {"errcode": "M_INVALID_PARAM", "error": f"path parameter 'name' {NUL_MESSAGE}"}
    assert response.status_code == 400


async def test_a_nul_in_a_query_parameter_name_is_400(full_host, full_client):
    response = await full_client("alice-token").get("/sync?dev%00ice=D")
    assert refused(response) == f"query parameter name 'dev\\x00ice' {NUL_MESSAGE}"


async def test_a_lone_surrogate_in_a_json_body_is_400_and_nothing_is_stored(full_host, full_client):
    before = await stored(full_host)
    writer = full_client("writer-token")
    content = b'{"text": "half an emoji \\ud83d"}'
    response = await writer.put(f"/user/{WRITER_USER}/account_data/m.type", content=content)
    assert refused(response) == (
        "body field 'text' contains a lone UTF-16 surrogate (\\ud83d), which is not valid Unicode text"
    )
    assert response.json()["errcode"] == "M_BAD_JSON"
    # The same bytes with the pair complete are stored.
    whole = await writer.put(f"/user/{WRITER_USER}/account_data/m.type", content=b'{"text": "\\ud83d\\ude00"}')
    assert whole.status_code == 200, whole.text
    assert await stored(full_host) != before


async def test_surrogate_bytes_that_json_loads_would_accept_are_400(full_host, full_client):
    # b"\xed\xa0\x80" is not UTF-8, but json.loads(bytes) (Starlette's request.json()) decodes it with
    # surrogatepass into "\ud800".
    writer = full_client("writer-token")
    response = await writer.post("/inbox/messages", content=b'{"user_id": "@a:hs", "body": "\xed\xa0\x80"}')
    assert "body field 'body' contains a lone UTF-16 surrogate (\\ud800)" in refused(response)
    # A body that is not JSON at all is left to the endpoint, which refuses it in its own words.
    response = await writer.put(f"/user/{WRITER_USER}/account_data/m.type", content=b"\x00\xed\xa0\x80 binary")
    assert response.json()["errcode"] == "M_NOT_JSON"


@pytest.mark.parametrize(
    "number", [str(2**63), str(-(2**63) - 1), "1" + "0" * 5000], ids=["2**63", "-2**63-1", "10**5000"]
)
async def test_an_integer_outside_bigint_in_a_json_body_is_400(full_host, full_client, number):
    before = await stored(full_host)
    content = f'{{"a": {{"b": [1, {number}]}}}}'.encode()
    response = await full_client("writer-token").put(f"/user/{WRITER_USER}/account_data/m.type", content=content)
    assert refused(response).startswith("body field 'a.b[1]' is an integer outside the range PostgreSQL stores")
    assert await stored(full_host) == before
    # The ends of the range are fine, and so is a long run of digits in a string.
    content = f'{{"low": {-(2**63)}, "high": {2**63 - 1}, "id": "{"9" * 40}"}}'.encode()
    response = await full_client("writer-token").put(f"/user/{WRITER_USER}/account_data/m.type", content=content)
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


async def test_a_body_over_the_hosts_limit_is_413(full_host, full_client):
    response = await full_client("writer-token").put(
        f"/user/{WRITER_USER}/account_data/m.type", content=b" " * (MAX_BODY_BYTES + 1)
    )
    assert "the host's limit" in refused(response, 413)
    assert response.json()["errcode"] == "M_TOO_LARGE"


@pytest.mark.parametrize("timeout", ["9999999999", "1" + "0" * 5000, "000000000000000000001"])
async def test_a_large_sync_timeout_is_capped_not_refused(full_host, full_client, timeout):
    alice = full_client("alice-token")
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
