"""The likes plugin on two in-process hosts: main writes the stream, worker1 reads it over TCP."""

import logging

import httpx
import pytest

import factstream

TOKENS = {
    "service-token": {"user": "@likes:hs", "write": True},
    "alice-token": {"user": "@alice:hs", "write": False},
    "bob-token": {"user": "@bob:hs", "write": False},
}


@pytest.fixture
async def http():
    """``http(host, token)``: a client of a host's HTTP API (its ASGI app, no socket)."""
    clients = []

    def client(host, token):
        transport = httpx.ASGITransport(app=host.app)
        headers = {"Authorization": f"Bearer {token}"}
        clients.append(httpx.AsyncClient(transport=transport, base_url="http://test", headers=headers))
        return clients[-1]

    yield client
    for c in clients:
        await c.aclose()


@pytest.fixture
async def hosts(host_cluster):
    """main writes the likes stream; worker1 follows it."""
    host_cluster.configure(stream_writers={"likes": ["main"]}, http={"tokens": TOKENS})
    main = await host_cluster("main")
    worker = await host_cluster("worker1")
    await host_cluster.following(worker, "likes")
    return main, worker


async def test_a_like_is_counted_seen_and_synced_everywhere(hosts, http, caplog):
    main, worker = hosts
    caplog.set_level(logging.INFO, logger="factstream_likes")
    service, bob, alice = http(main, "service-token"), http(main, "bob-token"), http(worker, "alice-token")
    # Both hosts read, and cache, a count of 0.
    assert (await bob.get("/likes/post:1")).json() == {"target": "post:1", "count": 0}
    assert (await alice.get("/likes/post:1")).json() == {"target": "post:1", "count": 0}

    response = await service.post("/likes", json={"user_id": "@alice:hs", "target": "post:1"})
    assert response.status_code == 200, response.text
    assert response.json() == {"stream_id": 2, "instance": "main"}

    # main forgot its entry when the transaction committed: it reads its own write at once.
    assert (await bob.get("/likes/post:1")).json()["count"] == 1
    # worker1 forgets it before its position passes the like: wait for that position, then read.
    assert await worker.api.wait_for_stream_position("main", "likes", 2)
    assert (await alice.get("/likes/post:1")).json()["count"] == 1

    # the rows handler ran on both hosts, and with local=True only on main, which alone logged the like.
    seen = {"stream_id": 2, "instance": "main", "user_id": "@alice:hs", "target": "post:1"}
    assert (await bob.get("/likes")).json() == {"instance": "main", "likes": [seen]}
    assert (await alice.get("/likes")).json() == {"instance": "worker1", "likes": [seen]}
    logged = [r.getMessage() for r in caplog.records if r.name == "factstream_likes"]
    assert logged == ["main: @alice:hs likes post:1 (stream ID 2)"]

    # /sync shows the like to its user, and to nobody else.
    assert (await alice.get("/sync")).json()["streams"]["likes"] == [seen]
    assert "likes" not in (await http(worker, "bob-token").get("/sync")).json()["streams"]


async def test_a_write_sent_to_a_reader_is_misdirected(hosts, http):
    _, worker = hosts
    response = await http(worker, "service-token").post("/likes", json={"user_id": "@alice:hs", "target": "post:1"})
    assert response.status_code == 421
    assert response.json() == {
        "errcode": "M_MISDIRECTED",
        "error": "instance worker1 does not write the likes stream; send writes to: main",
    }


async def test_the_settings_limit_targets(host_cluster, http):
    # plugins={"likes": {"max_target_length": 6}} would do the same, as in the configuration file.
    environ = {"FACTSTREAM_PLUGINS__LIKES__MAX_TARGET_LENGTH": "6"}
    main = await host_cluster("main", http={"tokens": TOKENS}, environ=environ)
    response = await http(main, "service-token").post("/likes", json={"user_id": "@alice:hs", "target": "post:10"})
    assert response.status_code == 400
    assert response.json() == {"errcode": "M_INVALID_PARAM", "error": "the target must be 1 to 6 characters long"}


async def test_a_bad_setting_stops_start_up(host_cluster):
    with pytest.raises(factstream.ConfigError) as stopped:
        await host_cluster("main", plugins={"likes": {"max_target_length": 0}})
    assert str(stopped.value).startswith("invalid settings of plugin 'likes': plugins.likes.max_target_length")
