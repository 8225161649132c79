"""``/sync`` long-poll outcomes (immediate, woken, timed out) and each stream's minimum position across
its writers, as ``/metrics`` shows them."""

from __future__ import annotations

import asyncio

from prometheus_client import REGISTRY

from tests.host.conftest import post_messages


def long_polls(outcome: str, instance: str = "main") -> float:
    labels = {"outcome": outcome, "instance": instance}
    return REGISTRY.get_sample_value("factstream_sync_long_polls_total", labels) or 0.0


def outcomes() -> dict[str, float]:
    return {outcome: long_polls(outcome) for outcome in ("immediate", "woken", "timed_out")}


def min_position(stream: str, instance: str) -> float | None:
    return REGISTRY.get_sample_value("factstream_stream_min_position", {"stream": stream, "instance": instance})


async def test_each_long_poll_is_counted_once_under_how_it_ended(inbox_cluster, client):
    host = await inbox_cluster()
    alice = client(host, "alice-token")
    await post_messages(host, client, ("@alice:hs", "old"))
    start = outcomes()

    since = (await alice.get("/sync")).json()["next_batch"]
    assert outcomes() == {**start, "immediate": start["immediate"] + 1}

    empty = await alice.get("/sync", params={"since": since, "timeout": 50})
    assert empty.json()["streams"] == {}
    assert outcomes() == {**start, "immediate": start["immediate"] + 1, "timed_out": start["timed_out"] + 1}

    poll = asyncio.ensure_future(alice.get("/sync", params={"since": since, "timeout": 20000}))
    await asyncio.sleep(0.2)
    await post_messages(host, client, ("@alice:hs", "new"))
    assert [item["body"] for item in (await poll).json()["streams"]["inbox"]] == ["new"]
    assert outcomes() == {
        "immediate": start["immediate"] + 1,
        "timed_out": start["timed_out"] + 1,
        "woken": start["woken"] + 1,
    }


async def test_every_outcome_shows_at_zero_before_any_sync(inbox_cluster, client):
    host = await inbox_cluster()
    text = (await client(host).get("/metrics")).text
    for outcome in ("immediate", "woken", "timed_out"):
        assert f'factstream_sync_long_polls_total{{instance="main",outcome="{outcome}"}}' in text


async def test_the_min_position_is_the_slowest_writer_as_this_instance_sees_it(inbox_cluster, client):
    writers = ["main", "worker1"]
    main = await inbox_cluster("main", stream_writers={"inbox": writers})
    worker = await inbox_cluster("worker1", stream_writers={"inbox": writers})
    await post_messages(worker, client, ("@alice:hs", "w"))
    gen = main.id_generator("inbox")
    # Cut off from worker1, main hears nothing more of it while it writes on.
    await main.disconnect_replication()
    await post_messages(main, client, ("@alice:hs", "a"), ("@alice:hs", "b"), ("@alice:hs", "c"))

    positions = {writer: gen.get_current_token_for_writer(writer) for writer in writers}
    assert positions["worker1"] < positions["main"], positions
    assert min_position("inbox", "main") == positions["worker1"]


async def test_a_single_writer_stream_has_the_writers_position_as_its_minimum(inbox_cluster, client):
    host = await inbox_cluster()
    await post_messages(host, client, ("@alice:hs", "a"), ("@alice:hs", "b"))

    assert min_position("inbox", "main") == host.id_generator("inbox").get_current_token_for_writer("main")
