"""The to_device plugin against real PostgreSQL and real hosts (main and worker1 over TCP), through the
hosts' HTTP API."""

from __future__ import annotations

import json

import pytest

from factstream.errors import ConfigError
from factstream.host.app import Host
from factstream.testing import HostCluster
from tests.bundled.account_data_to_device.conftest import positions
from tests.bundled.account_data_to_device.support import TOKENS, sync

ALICE = "@alice:hs"
BOB = "@bob:hs"
SEND = "/sendToDevice/{type}/{txn}"


@pytest.fixture
def host_cluster(host_cluster: HostCluster) -> HostCluster:
    """Hosts that accept the bearer tokens ``client_for`` uses."""
    return host_cluster.configure(http={"tokens": TOKENS})


async def send(client, txn: str, messages: dict, event_type: str = "m.test") -> dict:
    response = await client.put(SEND.format(type=event_type, txn=txn), json={"messages": messages})
    assert response.status_code == 200, response.text
    return response.json()


async def inbox(host: Host, user: str, device: str) -> list[str]:
    rows = await host.database().fetchall(
        "SELECT content FROM device_inbox WHERE entity = %(u)s AND device_id = %(d)s ORDER BY stream_id",
        {"u": user, "d": device},
    )
    return [r[0] for r in rows]


def contents(items: list[dict]) -> list[dict]:
    return [json.loads(bytes(i["content"])) for i in items]


async def test_a_device_receives_its_messages_in_order_and_they_are_deleted_only_when_acknowledged(
    host_cluster, client_for
):
    main = await host_cluster("main")
    alice = client_for(main, ALICE)
    for n in range(3):
        await send(alice, f"t{n}", {BOB: {"PHONE": {"n": n}, "LAPTOP": {"other": n}}})

    first, token = await sync(main, "to_device", BOB, {}, device="PHONE")
    assert contents(first) == [{"n": 0}, {"n": 1}, {"n": 2}]
    assert {(i["sender"], i["type"]) for i in first} == {(ALICE, "m.test")}

    # The response is lost: the client syncs again with its old token and gets the same messages.
    again, token = await sync(main, "to_device", BOB, {}, device="PHONE")
    assert contents(again) == contents(first)
    assert len(await inbox(main, BOB, "PHONE")) == 3

    # It syncs with the new token: that acknowledges them; they are gone, the laptop's are not.
    after, _ = await sync(main, "to_device", BOB, token, device="PHONE")
    assert after == []
    assert await inbox(main, BOB, "PHONE") == []
    assert len(await inbox(main, BOB, "LAPTOP")) == 3


async def test_content_is_kept_byte_for_byte(host_cluster, client_for):
    main = await host_cluster("main")
    body = b'{"messages": {"@bob:hs": {"D": { "z" : 1.10, "a": 1e400, "a": 1234567890.12345678901234567890 }}}}'
    response = await client_for(main, ALICE).put(SEND.format(type="m.raw", txn="t"), content=body)
    assert response.status_code == 200, response.text
    exact = b'{"messages": {"@bob:hs": {"D": { "z" : 1.10, "a": 2, "a": 1234567890.12345678901234567890 }}}}'
    response = await client_for(main, ALICE).put(SEND.format(type="m.raw", txn="t2"), content=exact)
    assert response.status_code == 200, response.text

    items, _ = await sync(main, "to_device", BOB, {}, device="D")

    assert bytes(items[1]["content"]) == b'{ "z" : 1.10, "a": 2, "a": 1234567890.12345678901234567890 }'
    assert json.loads(bytes(items[0]["content"]))["z"] == 1.1  # 1e400 cannot be sliced raw; still stored


async def test_a_transaction_id_replayed_with_the_same_body_stores_nothing_new_and_a_different_body_is_409(
    host_cluster, client_for
):
    main = await host_cluster("main")
    alice = client_for(main, ALICE)
    messages = {BOB: {"D1": {"a": 1}, "D2": {"b": 2}}}
    first = await send(alice, "txn1", messages)
    position = positions(main, "to_device")

    path = SEND.format(type="m.test", txn="txn1")
    replay = await alice.put(path, content=json.dumps({"messages": messages}, indent=2))
    conflict = await alice.put(path, json={"messages": {BOB: {"D1": {"a": 2}}}})
    other_type = await alice.put(SEND.format(type="m.other", txn="txn1"), json={"messages": messages})
    other_sender = await client_for(main, "@carol:hs").put(path, json={"messages": messages})

    assert first == {"stored": 2}
    assert (replay.status_code, replay.json()) == (200, first)
    assert conflict.status_code == 409
    assert conflict.json() == {
        "errcode": "M_TXN_CONFLICT",
        "error": "transaction ID 'txn1' was already used by @alice:hs for a different request",
    }
    assert other_type.status_code == 409
    assert other_sender.status_code == 200, "transaction IDs are per sender"
    assert await inbox(main, BOB, "D1") == ['{"a":1}', '{"a":1}']
    assert positions(main, "to_device")["main"] == position["main"] + 2


async def test_star_reaches_every_known_device_and_devices_become_known_by_syncing_or_registering(
    host_cluster, client_for
):
    main = await host_cluster("main")
    await sync(main, "to_device", BOB, {}, device="SYNCED")
    registered = await client_for(main, BOB).put("/devices/REGISTERED")
    assert (registered.status_code, registered.json()) == (200, {})

    assert await send(client_for(main, ALICE), "t", {BOB: {"*": {"hello": True}}, "@nobody:hs": {"*": {}}}) == {
        "stored": 2
    }

    assert await inbox(main, BOB, "SYNCED") == ['{"hello":true}']
    assert await inbox(main, BOB, "REGISTERED") == ['{"hello":true}']


async def test_a_response_cut_by_the_limit_never_loses_the_rest_whatever_token_comes_next(host_cluster, client_for):
    main = await host_cluster("main")
    alice = client_for(main, ALICE)
    for n in range(5):
        await send(alice, f"t{n}", {BOB: {"D": {"n": n}}})

    first, token = await sync(main, "to_device", BOB, {}, device="D", limit=2)
    # The client's next token covers all five messages, but only two were sent.
    second, token = await sync(main, "to_device", BOB, token, device="D", limit=2)
    third, token = await sync(main, "to_device", BOB, token, device="D", limit=2)
    rest, token = await sync(main, "to_device", BOB, token, device="D", limit=2)

    assert [c["n"] for c in contents(first + second + third)] == [0, 1, 2, 3, 4]
    assert rest == []
    assert await inbox(main, BOB, "D") == []


async def test_bad_requests_are_refused_with_a_message_and_store_nothing(host_cluster, client_for):
    limit = {"to_device": {"max_body_bytes": 200}}
    main = await host_cluster("main", plugins=limit)
    worker = await host_cluster("worker1", plugins=limit)
    alice = client_for(main, ALICE)
    path = SEND.format(type="m.test", txn="bad")
    before = positions(main, "to_device")

    cases = [
        ({"messages": {BOB: {"D": [1]}}}, 400, "messages['@bob:hs']['D'] must be a JSON object"),
        ({"messages": {BOB: {"D": "text"}}}, 400, "must be a JSON object"),
        ({"messages": {BOB: ["D"]}}, 400, "must be an object of device IDs"),
        ({"messages": {"bob": {"D": {}}}}, 400, "'bob' is not a user ID"),
        ({"messages": {BOB: {"": {}}}}, 400, "device IDs must be 1 to 255 characters"),
        ({"messages": []}, 400, "must have a 'messages' object"),
        ({}, 400, "must have a 'messages' object"),
        ({"messages": {BOB: {"D": {"x": "y" * 300}}}}, 413, "the limit is 200 bytes"),
    ]
    # A valid message next to a bad one: nothing of the request is stored.
    for body, status, message in cases:
        mixed = body
        if isinstance(body.get("messages"), dict):
            mixed = {"messages": {"@ok:hs": {"D": {"fine": 1}}, **body["messages"]}}
        response = await alice.put(path, json=mixed)
        assert response.status_code == status, response.text
        assert message in response.json()["error"]
        assert response.json()["errcode"] in {"M_BAD_JSON", "M_INVALID_PARAM", "M_TOO_LARGE"}
    raw = await alice.put(path, content=b"[]")
    assert raw.status_code == 400 and "must be a JSON object, not an array" in raw.json()["error"]
    assert raw.json()["errcode"] == "M_BAD_JSON"
    not_json = await alice.put(path, content=b"{nope")
    assert (not_json.status_code, not_json.json()["errcode"]) == (400, "M_NOT_JSON")
    misdirected = await client_for(worker, ALICE).put(path, json={"messages": {}})
    assert misdirected.status_code == 421
    assert misdirected.json() == {
        "errcode": "M_MISDIRECTED",
        "error": "instance worker1 does not write the to_device stream; send writes to: main",
    }

    assert await main.database().fetchall("SELECT count(*) FROM device_inbox") == [(0,)]
    assert await main.database().fetchall("SELECT count(*) FROM to_device_txns") == [(0,)]
    assert positions(main, "to_device") == before
    # The transaction ID was not used up by the refused requests.
    assert await send(alice, "bad", {BOB: {"D": {"ok": 1}}}) == {"stored": 1}


@pytest.mark.slow
async def test_101_messages_written_while_the_worker_is_disconnected_arrive_in_order_once(
    host_cluster, client_for, row_recorder
):
    main = await host_cluster("main")
    worker = await host_cluster("worker1")
    await host_cluster.following(worker, "to_device")
    alice = client_for(main, ALICE)
    await send(alice, "warm", {BOB: {"D": {"warm": True}}})
    warm = positions(main, "to_device")["main"]
    assert await worker.wait_for_stream_position("main", "to_device", warm)
    await worker.disconnect_replication()

    for n in range(101):
        await send(alice, f"m{n}", {BOB if n % 2 else "@carol:hs": {"D": {"n": n}}})
    last = positions(main, "to_device")["main"]
    await worker.connect_replication()

    assert await worker.wait_for_stream_position("main", "to_device", last, timeout=20)
    got = [(r.token, r.row.entity) for r in row_recorder.rows("worker1", "to_device") if r.token > warm]
    assert [t for t, _ in got] == list(range(warm + 1, last + 1))
    assert len(got) == 101
    assert [e for _, e in got] == [BOB if n % 2 else "@carol:hs" for n in range(101)]

    # Bob's device, syncing through the worker, receives his 51 messages (and the warm-up) in order.
    items, _ = await sync(worker, "to_device", BOB, {}, device="D")
    assert [c.get("n") for c in contents(items)] == [None, *range(1, 101, 2)]


async def test_the_body_limit_is_a_setting_and_a_bad_one_stops_the_start_naming_plugin_and_key(
    host_cluster, client_for
):
    with pytest.raises(ConfigError) as bad:
        await host_cluster("main", plugins={"to_device": {"max_body_bytes": -5}})
    assert "invalid settings of plugin 'to_device'" in str(bad.value)
    assert "plugins.to_device.max_body_bytes" in str(bad.value)
    with pytest.raises(ConfigError, match=r"plugins\.to_device\.max_body_bytes \(env FACTSTREAM_PLUGINS__TO_DEVICE"):
        await host_cluster("main", environ={"FACTSTREAM_PLUGINS__TO_DEVICE__MAX_BODY_BYTES": "64k"})
    with pytest.raises(ConfigError, match=r"plugins\.to_device\.limit.*unknown key"):
        await host_cluster("main", plugins={"to_device": {"limit": 10}})

    main = await host_cluster("main", environ={"FACTSTREAM_PLUGINS__TO_DEVICE__MAX_BODY_BYTES": "100"})
    alice = client_for(main, ALICE)
    assert await send(alice, "small", {BOB: {"D": {}}}) == {"stored": 1}
    large = await alice.put(SEND.format(type="m.test", txn="large"), json={"messages": {BOB: {"D": {"x": "y" * 100}}}})
    assert (large.status_code, large.json()["errcode"]) == (413, "M_TOO_LARGE")
    assert "the limit is 100 bytes" in large.json()["error"]
