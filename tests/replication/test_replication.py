"""Replication between real hosts (in one event loop) over TCP and Redis."""

from __future__ import annotations

import asyncio

import pytest

from factstream.host.app import Host


async def append_notes(host: Host, n: int, author: str = "ada") -> list[int]:
    gen = host.id_generator("notes")
    ids = []
    for i in range(n):
        async with host.database().transaction() as txn:
            ids.append(await gen.append_txn(txn, "notes", {"author": f"{author}{i}", "body": "x"}))
    return ids


async def until(predicate, timeout: float = 10.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not predicate():
        if loop.time() > deadline:
            raise AssertionError("condition not reached in time")
        await asyncio.sleep(0.01)


def received(name: str) -> list[tuple]:
    import factstream_recorder

    return factstream_recorder.received.get(name, [])


@pytest.fixture(params=["tcp", "redis"])
def transport(request):
    if request.param == "redis":
        return request.getfixturevalue("redis_url")
    return None


async def test_worker_receives_every_fact_in_order(make_hosts, transport):
    main = await make_hosts("main", redis_url=transport)
    worker = await make_hosts("worker1", redis_url=transport)
    await worker.handler.wait_for_stream_position("main", "notes", 1, timeout=5)
    await until(lambda: "notes" in next(iter(worker.handler._connected.values()), set()))

    ids = await append_notes(main, 50)

    await until(lambda: len(received("worker1")) == 50)
    got = received("worker1")
    assert [t for _, _, t, _ in got] == ids
    assert [r.author for *_, r in got] == [f"ada{i}" for i in range(50)]
    assert {(s, i) for s, i, _, _ in got} == {("notes", "main")}
    assert await worker.wait_for_stream_position("main", "notes", ids[-1], timeout=5)
    assert worker.id_generator("notes").get_current_token() == ids[-1]
