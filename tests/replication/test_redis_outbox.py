"""While Redis cannot be published to, commands wait in a bounded outbox; past its bound they are
dropped, and so is everything after them until publishing works again, when the positions go out
first: readers catch up from the database and lose nothing. (The first version re-announced later,
after the commands queued behind the drop: a reader accepted those rows across the gap and lost the
dropped ones; this test found it.)"""

from __future__ import annotations

import logging

import pytest

from factstream.replication import redis as redis_transport
from factstream.replication.resp import RespClient, RespError
from factstream.testing import until
from tests.replication.test_replication import append_notes, received

pytestmark = pytest.mark.redis


async def test_commands_dropped_while_redis_is_unreachable_are_caught_up(host_cluster, monkeypatch, caplog):
    host_cluster.configure(transport="redis", deployment="outbox")
    main = await host_cluster("main")
    worker = await host_cluster("worker1")
    await host_cluster.following(worker, "notes")
    before = await append_notes(main, 5)
    await until(lambda: len(received("worker1")) == 5)

    # The publishing connection breaks and cannot come back for now; the subscription stays up,
    # so the streamer keeps sending and commands pile up in the outbox.
    monkeypatch.setattr(redis_transport, "MAX_OUTBOX", 50)
    real_open = RespClient.open
    blocked = True

    async def open_unless_blocked(address, **kwargs):
        if blocked:
            raise RespError("publishing is blocked by the test")
        return await real_open(address, **kwargs)

    monkeypatch.setattr(redis_transport.RespClient, "open", open_unless_blocked)
    main.transport._publisher.close()
    with caplog.at_level(logging.WARNING, logger="factstream.replication.redis"):
        during = await append_notes(main, 120, author="cut")
        await until(lambda: "dropping" in caplog.text, timeout=5)
    assert len(received("worker1")) < 125, "nothing should have reached the worker while publishing was blocked"

    blocked = False
    after = await append_notes(main, 5, author="after")

    ids = before + during + after
    await until(lambda: [t for _, _, t, _ in received("worker1")] == ids, timeout=20)
    assert [r.author for *_, r in received("worker1")][5:125] == [f"cut{i}" for i in range(120)]
