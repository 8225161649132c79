"""The account_data plugin against real PostgreSQL and real hosts (main and worker1 over TCP), through
the hosts' HTTP API."""

from __future__ import annotations

from typing import Any

import pytest

from factstream.errors import ConfigError
from factstream.host.app import Host
from factstream.testing import HostCluster
from tests.bundled.account_data_to_device.conftest import positions, writing
from tests.bundled.account_data_to_device.support import TOKENS, sync

ALICE = "@alice:hs"
BOB = "@bob:hs"
GLOBAL_PATH = "/user/{user}/account_data/{type}"
ROOM_PATH = "/user/{user}/rooms/{room}/account_data/{type}"


@pytest.fixture
def host_cluster(host_cluster: HostCluster) -> HostCluster:
    """Hosts that accept the bearer tokens ``client_for`` uses."""
    return host_cluster.configure(http={"tokens": TOKENS})


def store(host: Host) -> Any:
    from factstream_account_data import AccountDataStore

    return host.api.state(AccountDataStore)


async def pair(host_cluster) -> tuple[Host, Host]:
    main = await host_cluster("main")
    worker = await host_cluster("worker1")
    await host_cluster.following(worker, "account_data")
    return main, worker


async def test_put_then_get_returns_the_object_byte_for_byte(host_cluster, client_for):
    main = await host_cluster("main")
    client = client_for(main, ALICE)
    body = b'{ "z": 1.10, "a": 123456789012345678901234567890, "a": [true, null], "\\u00e9": "\xc3\xa9" }'

    put = await client.put(GLOBAL_PATH.format(user=ALICE, type="m.weird"), content=body)
    got = await client.get(GLOBAL_PATH.format(user=ALICE, type="m.weird"))

    assert put.status_code == 200, put.text
    assert got.status_code == 200
    assert got.headers["content-type"] == "application/json"
    assert got.content == body


async def test_global_and_per_room_data_of_one_type_are_separate(host_cluster, client_for):
    main = await host_cluster("main")
    client = client_for(main, ALICE)
    await client.put(GLOBAL_PATH.format(user=ALICE, type="m.t"), json={"where": "global"})
    await client.put(ROOM_PATH.format(user=ALICE, room="!r1:hs", type="m.t"), json={"where": "r1"})

    assert (await client.get(GLOBAL_PATH.format(user=ALICE, type="m.t"))).json() == {"where": "global"}
    assert (await client.get(ROOM_PATH.format(user=ALICE, room="!r1:hs", type="m.t"))).json() == {"where": "r1"}
    missing = await client.get(ROOM_PATH.format(user=ALICE, room="!r2:hs", type="m.t"))
    assert missing.status_code == 404
    assert "no account data of type m.t in room !r2:hs" in missing.json()["error"]


async def test_a_value_cached_on_the_worker_is_replaced_once_the_change_is_replicated(host_cluster):
    main, worker = await pair(host_cluster)
    first = await store(main).put(ALICE, None, "m.t", '{"v": 1}')
    assert await worker.wait_for_stream_position("main", "account_data", first)
    assert await store(worker).get_content(ALICE, "", "m.t") == '{"v": 1}'
    assert (ALICE, "", "m.t") in worker.caches.get("account_data_latest")

    second = await store(main).put(ALICE, None, "m.t", '{"v": 2}')

    assert await worker.wait_for_stream_position("main", "account_data", second)
    assert (ALICE, "", "m.t") not in worker.caches.get("account_data_latest")
    assert await store(worker).get_content(ALICE, "", "m.t") == '{"v": 2}'
    # The writer forgot its own cached value after its commit.
    assert await store(main).get_content(ALICE, "", "m.t") == '{"v": 2}'


async def test_sync_returns_each_changed_type_once_with_its_latest_content_and_only_the_users_own(host_cluster):
    main = await host_cluster("main")
    s = store(main)
    await s.put(ALICE, None, "m.old", '{"v": 0}')
    _, token = await sync(main, "account_data", ALICE, {})
    await s.put(ALICE, None, "m.a", '{"v": 1}')
    await s.put(ALICE, "!r:hs", "m.a", '{"room": 1}')
    await s.put(ALICE, None, "m.a", '{"v": 2}')
    await s.put(BOB, None, "m.a", '{"bob": 1}')

    items, upto = await sync(main, "account_data", ALICE, token)

    assert [(i["room_id"], i["type"], bytes(i["content"])) for i in items] == [
        ("!r:hs", "m.a", b'{"room": 1}'),
        (None, "m.a", b'{"v": 2}'),
    ]
    assert all(i["instance"] == "main" for i in items)
    assert (await sync(main, "account_data", ALICE, upto))[0] == []
    assert [bytes(i["content"]) for i in (await sync(main, "account_data", BOB, token))[0]] == [b'{"bob": 1}']


async def test_with_two_writers_the_latest_value_is_the_highest_stream_id_whatever_the_sync_order(host_cluster):
    main = await host_cluster("main", stream_writers=writing("main", "worker1"))
    worker = await host_cluster("worker1", stream_writers=writing("main", "worker1"))
    await host_cluster.following(worker, "account_data")
    older = await store(worker).put(ALICE, None, "m.t", '{"from": "worker1"}')
    newer = await store(main).put(ALICE, None, "m.t", '{"from": "main"}')
    assert older < newer
    assert await main.wait_for_stream_position("worker1", "account_data", older)

    # A client whose token already covers main's change but not worker1's older one.
    since = {"main": newer, "worker1": older - 1}
    items, _ = await sync(main, "account_data", ALICE, since)

    assert [bytes(i["content"]) for i in items] == [b'{"from": "main"}'], "an older change must not win"


async def test_bad_requests_are_refused_with_a_message_and_store_nothing(host_cluster, client_for):
    limit = {"account_data": {"max_body_bytes": 100}}
    main = await host_cluster("main", plugins=limit)
    worker = await host_cluster("worker1", plugins=limit)
    await host_cluster.following(worker, "account_data")
    client = client_for(main, ALICE)
    path = GLOBAL_PATH.format(user=ALICE, type="m.t")
    before = positions(main, "account_data")

    async def chunked():  # no Content-Length: the limit applies while reading
        for _ in range(20):
            yield b"          "

    cases = [
        (client.put(path, content=b"[1, 2]"), 400, "must be a JSON object, not an array"),
        (client.put(path, content=b'"text"'), 400, "must be a JSON object, not a string"),
        (client.put(path, content=b"{not json"), 400, "not valid JSON"),
        (client.put(path, content=b'{"a": NaN}'), 400, "not valid JSON"),
        (client.put(path, content=b"{}" + b" " * 200), 413, "the limit is 100 bytes"),
        (client.put(path, content=chunked()), 413, "the limit is 100 bytes"),
        (client.put(GLOBAL_PATH.format(user=BOB, type="m.t"), json={}), 403, "@alice:hs cannot access"),
        (client.get(GLOBAL_PATH.format(user=BOB, type="m.t")), 403, "account data of @bob:hs"),
        (client.put(GLOBAL_PATH.format(user=ALICE, type="t" * 256), json={}), 400, "1 to 255 characters"),
        (client_for(worker, ALICE).put(path, json={}), 421, "send writes to: main"),
    ]
    errcodes = {400: {"M_NOT_JSON", "M_BAD_JSON", "M_INVALID_PARAM"}, 403: {"M_FORBIDDEN"}, 413: {"M_TOO_LARGE"}}
    for request, status, message in cases:
        response = await request
        assert response.status_code == status, response.text
        assert set(response.json()) == {"errcode", "error"}
        assert message in response.json()["error"]
        assert response.json()["errcode"] in errcodes.get(status, {"M_MISDIRECTED"})

    rows = await main.database().fetchall("SELECT count(*) FROM account_data_stream")
    latest = await main.database().fetchall("SELECT count(*) FROM account_data_latest")
    assert (rows[0][0], latest[0][0]) == (0, 0)
    assert positions(main, "account_data") == before


@pytest.mark.slow
async def test_105_changes_written_while_the_worker_is_disconnected_arrive_in_order_once(host_cluster, row_recorder):
    main, worker = await pair(host_cluster)
    before = await store(main).put(BOB, None, "m.warm", "{}")
    assert await worker.wait_for_stream_position("main", "account_data", before)
    await worker.disconnect_replication()

    written = []
    for i in range(105):
        room = None if i % 3 else f"!r{i % 5}:hs"
        written.append(await store(main).put(ALICE, room, f"m.t{i % 7}", f'{{"i": {i}}}'))
    await worker.connect_replication()

    assert await worker.wait_for_stream_position("main", "account_data", written[-1], timeout=20)
    got = [(r.token, r.row) for r in row_recorder.rows("worker1", "account_data") if r.token > before]
    assert [t for t, _ in got] == written
    assert [(r.room_id, r.data_type) for _, r in got] == [
        (None if i % 3 else f"!r{i % 5}:hs", f"m.t{i % 7}") for i in range(105)
    ]
    assert await store(worker).get_content(ALICE, "", "m.t6") == '{"i": 104}'


async def test_the_body_limit_is_a_setting_and_a_bad_one_stops_the_start_naming_plugin_and_key(
    host_cluster, client_for
):
    with pytest.raises(ConfigError) as bad:
        await host_cluster("main", plugins={"account_data": {"max_body_bytes": 0}})
    assert "plugins.account_data.max_body_bytes" in str(bad.value)
    assert "FACTSTREAM_PLUGINS__ACCOUNT_DATA__MAX_BODY_BYTES" in str(bad.value)
    with pytest.raises(ConfigError, match=r"plugins\.account_data\.max_body_size.*unknown key"):
        await host_cluster("main", plugins={"account_data": {"max_body_size": 10}})
    with pytest.raises(ConfigError, match=r"plugins\.account_data\.max_body_bytes"):
        await host_cluster("main", environ={"FACTSTREAM_PLUGINS__ACCOUNT_DATA__MAX_BODY_BYTES": "lots"})

    main = await host_cluster("main", environ={"FACTSTREAM_PLUGINS__ACCOUNT_DATA__MAX_BODY_BYTES": "20"})
    client = client_for(main, ALICE)
    path = GLOBAL_PATH.format(user=ALICE, type="m.t")
    assert (await client.put(path, json={"a": 1})).status_code == 200
    too_large = await client.put(path, json={"a": "x" * 20})
    assert too_large.status_code == 413
    assert too_large.json() == {
        "errcode": "M_TOO_LARGE",
        "error": f"the request body is {len(too_large.request.content)} bytes; the limit is 20 bytes",
    }
