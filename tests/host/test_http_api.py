"""The host's HTTP API: bearer tokens and access levels, core routes, plugin routes, JSON errors
(``{"errcode", "error"}`` everywhere)."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from factstream.errors import PluginError
from factstream.testing import free_port
from factstream.tokens import TokenStore, token_hash
from tests.host.conftest import post_messages


async def test_no_token_is_401_with_a_json_message(inbox_cluster, client):
    host = await inbox_cluster()
    anonymous = client(host)
    for path in ("/sync", "/streams", "/streams/inbox/positions", "/inbox/whoami"):
        response = await anonymous.get(path)
        assert response.status_code == 401, path
        assert response.headers["www-authenticate"] == "Bearer"
        assert response.json()["errcode"] == "M_MISSING_TOKEN"
        assert "missing access token" in response.json()["error"]


@pytest.mark.parametrize(
    ("header", "errcode", "message"),
    [
        ("Bearer nope", "M_UNKNOWN_TOKEN", "unknown access token"),
        ("Basic YWxpY2U6cHc=", "M_MISSING_TOKEN", "malformed Authorization header"),
        ("Bearer", "M_MISSING_TOKEN", "malformed Authorization header"),
        ("Bearer a b", "M_MISSING_TOKEN", "malformed Authorization header"),
    ],
)
async def test_a_bad_token_is_401(inbox_cluster, client, header, errcode, message):
    host = await inbox_cluster()
    response = await client(host).get("/inbox/whoami", headers={"Authorization": header})
    assert response.status_code == 401
    assert response.json()["errcode"] == errcode
    assert message in response.json()["error"]


async def test_a_configured_token_acts_as_its_user(inbox_cluster, client):
    host = await inbox_cluster()
    response = await client(host, "alice-token").get("/inbox/whoami")
    assert response.status_code == 200
    assert response.json() == {"user": "@alice:hs"}


async def test_public_routes_need_no_token_and_see_no_user(inbox_cluster, client):
    host = await inbox_cluster()
    anonymous = client(host)
    assert (await anonymous.get("/inbox/ping")).json() == {"pong": True, "user": None}
    # A token on a public route changes nothing: public means anonymous.
    assert (await client(host, "alice-token").get("/inbox/ping")).json()["user"] is None
    health = await anonymous.get("/health")
    assert health.status_code == 200
    assert health.json()["status"] == "ok"
    assert health.json()["instance"] == "main"
    assert health.json()["replication"]["transport"] == "tcp"


async def test_a_write_route_needs_a_token_that_may_write(inbox_cluster, client):
    host = await inbox_cluster()
    body = [{"user_id": "@alice:hs", "body": "hi"}]
    assert (await client(host).post("/inbox/messages", json=body)).status_code == 401
    forbidden = await client(host, "alice-token").post("/inbox/messages", json=body)
    assert forbidden.status_code == 403
    assert forbidden.json() == {
        "errcode": "M_FORBIDDEN",
        "error": "user @alice:hs may not write: this token has no write permission",
    }
    allowed = await client(host, "writer-token").post("/inbox/messages", json=body)
    assert allowed.status_code == 200
    assert len(allowed.json()["stream_ids"]) == 1


async def test_tokens_from_the_access_tokens_table(inbox_cluster, client):
    host = await inbox_cluster()
    db = host.database()
    async with db.transaction() as txn:
        await txn.execute(
            "INSERT INTO access_tokens (token_hash, user_id, can_write) VALUES (%(carol)s, '@carol:hs', false), "
            "(%(dave)s, '@dave:hs', true)",
            {"carol": token_hash("t-carol"), "dave": token_hash("t-dave")},
        )
    assert (await client(host, "t-carol").get("/inbox/whoami")).json() == {"user": "@carol:hs"}
    body = {"user_id": "@carol:hs", "body": "x"}
    assert (await client(host, "t-carol").post("/inbox/messages", json=body)).status_code == 403
    assert (await client(host, "t-dave").post("/inbox/messages", json=body)).status_code == 200


async def test_a_token_issued_like_factstream_tokens_works_until_revoked(inbox_cluster, client):
    host = await inbox_cluster(http={"token_cache_seconds": 0})
    store = TokenStore(inbox_cluster.database_url)
    writer, info = await asyncio.to_thread(store.create, "@frank:hs", can_write=True)
    body = {"user_id": "@frank:hs", "body": "x"}

    assert (await client(host, writer).get("/inbox/whoami")).json() == {"user": "@frank:hs"}
    assert (await client(host, writer).post("/inbox/messages", json=body)).status_code == 200
    await asyncio.to_thread(store.revoke, info.id)
    assert (await client(host, writer).get("/inbox/whoami")).status_code == 401


async def test_the_token_table_can_be_turned_off(inbox_cluster, client):
    host = await inbox_cluster(http={"token_table": False})
    async with host.database().transaction() as txn:
        await txn.execute(
            "INSERT INTO access_tokens (token_hash, user_id) VALUES (%(erin)s, '@erin:hs')",
            {"erin": token_hash("t-erin")},
        )
    assert (await client(host, "t-erin").get("/inbox/whoami")).status_code == 401
    assert (await client(host, "alice-token").get("/inbox/whoami")).status_code == 200


async def test_a_body_that_is_not_json_is_400_not_500(inbox_cluster, client):
    host = await inbox_cluster()
    writer = client(host, "writer-token")
    response = await writer.post("/inbox/messages", content=b"{not json")
    assert response.status_code == 400
    assert response.json()["errcode"] == "M_NOT_JSON"
    assert "not valid JSON" in response.json()["error"]
    response = await writer.post("/inbox/messages", json={"user_id": 5})
    assert response.status_code == 400
    assert response.json()["errcode"] == "M_BAD_JSON"
    assert "invalid request" in response.json()["error"]


async def test_unknown_paths_and_methods_are_json_errors(inbox_cluster, client):
    host = await inbox_cluster()
    alice = client(host, "alice-token")
    missing = await alice.get("/no/such/route")
    assert missing.status_code == 404
    assert missing.json() == {"errcode": "M_NOT_FOUND", "error": "Not Found"}
    wrong_method = await alice.delete("/sync")
    assert wrong_method.status_code == 405
    assert wrong_method.json() == {"errcode": "M_UNRECOGNIZED", "error": "Method Not Allowed"}


async def test_streams_lists_every_stream_with_its_plugin_writers_sync_key_and_positions(inbox_cluster, client):
    host = await inbox_cluster()
    ids = await post_messages(host, client, ("@alice:hs", "one"), ("@bob:hs", "two"))
    response = await client(host, "alice-token").get("/streams")
    assert response.status_code == 200
    body = response.json()
    assert body["instance"] == "main"
    inbox = next(s for s in body["streams"] if s["name"] == "inbox")
    assert inbox["plugin"] == "inbox"
    assert inbox["writers"] == ["main"]
    assert inbox["is_writer"] is True
    assert inbox["sync_key"] == "inbox_key"
    assert inbox["current_token"] == max(ids)
    assert inbox["positions"]["main"] == max(ids)


async def test_positions_of_one_stream_and_404_for_an_unknown_one(inbox_cluster, client):
    host = await inbox_cluster()
    ids = await post_messages(host, client, ("@alice:hs", "one"))
    alice = client(host, "alice-token")
    body = (await alice.get("/streams/inbox/positions")).json()
    assert body == {
        "instance": "main",
        "stream": "inbox",
        "positions": {"main": ids[0]},
        "current_token": ids[0],
        "persisted_upto": ids[0],
    }
    missing = await alice.get("/streams/nope/positions")
    assert missing.status_code == 404
    assert missing.json()["errcode"] == "M_NOT_FOUND"
    assert "unknown stream 'nope'" in missing.json()["error"]


async def test_metrics_are_prometheus_text(inbox_cluster, client):
    host = await inbox_cluster()
    response = await client(host).get("/metrics")
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/plain")
    assert "factstream_sync_open_waits" in response.text


async def test_openapi_describes_core_and_plugin_routes_with_their_access(inbox_cluster, client):
    host = await inbox_cluster()
    schema = (await client(host).get("/openapi.json")).json()
    assert schema["openapi"].startswith("3.")
    paths = schema["paths"]
    for path in ("/sync", "/streams", "/streams/{name}/positions", "/health", "/metrics", "/inbox/messages"):
        assert path in paths, path
    sync = paths["/sync"]["get"]
    assert {p["name"] for p in sync["parameters"]} == {"since", "timeout", "device", "filter"}
    assert sync["security"] == [{"bearer": []}]
    assert sync["tags"] == ["factstream"]
    post = paths["/inbox/messages"]["post"]
    assert post["tags"] == ["inbox"]
    assert post["x-factstream-access"] == "writer"
    assert "403" in post["responses"]
    assert post["summary"] == "Append messages to the inbox stream."
    assert paths["/inbox/ping"]["get"]["security"] == []
    positions = paths["/streams/{name}/positions"]["get"]
    assert positions["parameters"][0] == {"name": "name", "in": "path", "required": True, "schema": {"type": "string"}}
    error = {"$ref": "#/components/schemas/Error"}
    assert positions["responses"]["404"]["content"]["application/json"]["schema"] == error
    assert post["responses"]["403"]["content"]["application/json"]["schema"] == error
    assert schema["components"]["schemas"]["Error"]["required"] == ["errcode", "error"]
    assert set(schema["components"]["schemas"]["Error"]["properties"]) == {"errcode", "error"}


async def test_a_plugin_route_raising_http_error_answers_its_status_and_errcode(
    plugin_installer, inbox_cluster, client
):
    plugin_installer.from_source(
        "teapot",
        """
        import factstream
        from factstream import HttpError, RouteSpec, calling_user

        async def brew(request, host):
            raise HttpError(418, "M_TEAPOT", f"{calling_user(request)}: I am a teapot")

        async def crash(request, host):
            raise RuntimeError("boom")

        @factstream.hookimpl
        def register_routes(register):
            register(RouteSpec("/teapot", brew, access="user"))
            register(RouteSpec("/crash", crash, access="public"))
        """,
    )
    host = await inbox_cluster()
    response = await client(host, "alice-token").get("/teapot")
    assert response.status_code == 418
    assert response.json() == {"errcode": "M_TEAPOT", "error": "@alice:hs: I am a teapot"}
    crashed = await client(host).get("/crash")
    assert (crashed.status_code, crashed.json()) == (500, {"errcode": "M_UNKNOWN", "error": "internal error"})


async def test_a_plugin_route_shadowing_a_core_route_fails_the_start_naming_both(plugin_installer, inbox_cluster):
    plugin_installer.from_source(
        "shadow",
        """
        import factstream
        from factstream import RouteSpec

        async def mine(request):
            return {}

        @factstream.hookimpl
        def register_routes(register):
            register(RouteSpec("/sync", mine))
        """,
    )
    with pytest.raises(PluginError, match=r"duplicate route 'GET /sync': registered by both 'factstream' and 'shadow'"):
        await inbox_cluster()


async def test_the_host_serves_http_on_its_port_and_stops_cleanly(inbox_cluster):
    port = free_port()
    host = await inbox_cluster(http={"port": port})
    assert host.http is not None
    assert host.http.url == f"http://127.0.0.1:{port}"
    async with httpx.AsyncClient(base_url=host.http.url) as http:
        health = await http.get("/health")
        assert health.status_code == 200
        # A long poll open while the host stops does not keep it from stopping.
        first = await http.get("/sync", headers={"Authorization": "Bearer alice-token"})
        assert first.status_code == 200
        task = asyncio.ensure_future(
            http.get(
                "/sync",
                params={"timeout": 20000, "since": first.json()["next_batch"]},
                headers={"Authorization": "Bearer alice-token"},
            )
        )
        await asyncio.sleep(0.2)
        loop = asyncio.get_running_loop()
        started = loop.time()
        await host.stop()
        assert loop.time() - started < 8
        # The poll was answered (nothing new, its token back), not cut off.
        answered = await task
        assert answered.status_code == 200
        assert answered.json() == {"next_batch": first.json()["next_batch"], "streams": {}}


async def test_a_port_in_use_fails_the_start_with_the_address(inbox_cluster):
    import socket

    from factstream.errors import ConfigError

    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen(1)
        port = busy.getsockname()[1]
        with pytest.raises(ConfigError, match=f"cannot listen for HTTP on 127.0.0.1:{port}"):
            await inbox_cluster(http={"port": port})
