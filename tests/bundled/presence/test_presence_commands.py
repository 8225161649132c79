"""``USER_SYNC`` / ``CLEAR_USER_SYNC`` between two in-process hosts over TCP (docs/plugins/presence.md,
The inputs): ``main`` writes presence, ``worker1`` serves ``/sync``. A long poll on the worker makes its
user syncing there on main (the reporter); the worker stopping clears it (the user goes offline after the
fast timeout); a worker that reconnects sends its syncing users again."""

from __future__ import annotations

import asyncio

from factstream_presence import PresenceWriter

from factstream.testing import HostCluster
from tests.bundled.events.conftest import TOKENS, token_of
from tests.bundled.presence.conftest import FAST, shared_room, sync

ALICE, BOB = "@alice:hs", "@bob:hs"


async def until(check: object, timeout: float = 10.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not check():  # type: ignore[operator]
        assert loop.time() < deadline, "timed out"
        await asyncio.sleep(0.05)


async def test_a_worker_reports_syncing_forgets_on_stop_and_resends_on_reconnect(host_cluster: HostCluster) -> None:
    host_cluster.configure(http={"tokens": TOKENS}, plugins={"presence": FAST})
    main = await host_cluster("main")
    worker = await host_cluster("worker1")
    await host_cluster.following(worker, "presence")
    await shared_room(main, ALICE, BOB)
    writer = main.api.state(PresenceWriter)
    bob = host_cluster.client(worker, token_of(BOB), timeout=10)
    since = (await sync(bob))["next_batch"]
    poll = asyncio.create_task(sync(bob, since, timeout=6_000))
    await until(lambda: BOB in writer.syncing.get("worker1", set()))
    assert writer.users[BOB].state == "online"
    # the link drops: main forgets worker1 at once; the link comes back: worker1 sends bob again
    await worker.disconnect_replication()
    await until(lambda: not writer.syncing.get("worker1"))
    await worker.connect_replication()
    await until(lambda: BOB in writer.syncing.get("worker1", set()))
    await poll
    await worker.stop()  # CLEAR_USER_SYNC (or the link's loss): bob syncs nowhere, offline after the timeout
    await until(lambda: not writer.syncing.get("worker1"))
    await until(lambda: writer.users[BOB].state == "offline", 5)
