"""``/sync`` across instances (in-process hosts over TCP replication): wake-ups from replicated rows,
tokens minted by one instance used on another, and the bounded wait for a token this instance has not
reached yet."""

from __future__ import annotations

import asyncio

import pytest

from factstream.testing import until
from tests.host.conftest import post_messages


def bodies(response) -> list[str]:
    return [item["body"] for item in response.json()["streams"].get("inbox", [])]


@pytest.mark.serial  # asserts a time bound: run alone
async def test_a_worker_long_poll_wakes_on_a_write_on_main_with_exactly_the_new_rows(inbox_cluster, client):
    main = await inbox_cluster("main")
    worker = await inbox_cluster("worker1")
    ids = await post_messages(main, client, ("@alice:hs", "before"))
    await until(lambda: worker.id_generator("inbox").get_current_token() >= ids[-1])
    alice = client(worker, "alice-token")
    first = await alice.get("/sync")
    assert bodies(first) == ["before"]
    since = first.json()["next_batch"]
    poll = asyncio.ensure_future(alice.get("/sync", params={"since": since, "timeout": 20000}))
    await asyncio.sleep(0.2)
    loop = asyncio.get_running_loop()
    written = loop.time()
    await post_messages(main, client, ("@bob:hs", "for bob"), ("@alice:hs", "after"))
    response = await asyncio.wait_for(poll, 5)
    assert loop.time() - written < 1.0
    assert bodies(response) == ["after"]
    next_batch = response.json()["next_batch"]
    quiet = await alice.get("/sync", params={"since": next_batch, "timeout": 300})
    assert quiet.json() == {"next_batch": next_batch, "streams": {}}
    await post_messages(main, client, ("@alice:hs", "later"))
    assert bodies(await alice.get("/sync", params={"since": next_batch, "timeout": 5000})) == ["later"]


async def test_tokens_from_one_instance_work_on_the_other_with_two_writers(inbox_cluster, client):
    writers = ("main", "worker1")
    main = await inbox_cluster("main", stream_writers={"inbox": list(writers)})
    worker = await inbox_cluster("worker1", stream_writers={"inbox": list(writers)})
    await post_messages(main, client, ("@alice:hs", "m1"))
    await post_messages(worker, client, ("@alice:hs", "w1"), ("@alice:hs", "w2"))
    await post_messages(main, client, ("@alice:hs", "m2"))

    def caught_up(a, b) -> bool:
        return a.id_generator("inbox").get_positions() == b.id_generator("inbox").get_positions()

    await until(lambda: caught_up(main, worker))
    on_main, on_worker = client(main, "alice-token"), client(worker, "alice-token")
    from_main = await on_main.get("/sync")
    from_worker = await on_worker.get("/sync")
    assert sorted(bodies(from_main)) == sorted(bodies(from_worker)) == ["m1", "m2", "w1", "w2"]
    # A worker's token on main and main's token on the worker: nothing new, and no error.
    for instance, token in ((on_main, from_worker.json()["next_batch"]), (on_worker, from_main.json()["next_batch"])):
        response = await instance.get("/sync", params={"since": token, "timeout": 200})
        assert response.status_code == 200
        assert response.json()["streams"] == {}
    # New facts from both writers reach a token minted elsewhere, exactly once.
    since = from_worker.json()["next_batch"]
    await post_messages(worker, client, ("@alice:hs", "w3"))
    await post_messages(main, client, ("@alice:hs", "m3"))
    await until(lambda: caught_up(main, worker))
    got = bodies(await on_main.get("/sync", params={"since": since, "timeout": 2000}))
    assert sorted(got) == ["m3", "w3"]


@pytest.mark.serial  # asserts a time bound: run alone
async def test_a_token_this_instance_has_not_reached_gets_an_empty_answer_after_a_bounded_wait(inbox_cluster, client):
    main = await inbox_cluster("main")
    worker = await inbox_cluster("worker1", http={"catch_up_timeout_seconds": 0.5})
    ids = await post_messages(main, client, ("@alice:hs", "a"))
    await until(lambda: worker.id_generator("inbox").get_current_token() >= ids[-1])
    await worker.disconnect_replication()
    await post_messages(main, client, ("@alice:hs", "b"))
    ahead = (await client(main, "alice-token").get("/sync")).json()["next_batch"]
    loop = asyncio.get_running_loop()
    started = loop.time()
    response = await client(worker, "alice-token").get("/sync", params={"since": ahead, "timeout": 10000})
    assert 0.4 < loop.time() - started < 3
    assert response.status_code == 200
    assert response.json() == {"next_batch": ahead, "streams": {}}
    # Once the worker catches up, the same token works there.
    await worker.connect_replication()
    await until(lambda: worker.id_generator("inbox").get_current_token() >= ids[-1] + 1)
    poll = asyncio.ensure_future(client(worker, "alice-token").get("/sync", params={"since": ahead, "timeout": 5000}))
    await asyncio.sleep(0.2)
    await post_messages(main, client, ("@alice:hs", "c"))
    assert bodies(await asyncio.wait_for(poll, 5)) == ["c"]
