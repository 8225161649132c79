"""The typing writer restarts (docs/plugins/typing.md, When the writer restarts), in process and fast:
``main`` (the writer, serving HTTP on its ``instance_map`` port so that readers can ask it) and
``worker1`` over TCP. main types and the worker's view has it; main stops and a new ``main`` starts (a
new run, a new epoch above every position of the old one): the worker's ``TypingView`` is reset
(nobody types), a client token from before the restart gets every joined room with ``[]`` in
``/sync`` on the worker (nothing sticks), and typing on the new run reaches the worker (nothing is
skipped)."""

from __future__ import annotations

from factstream_typing import TypingView, TypingWriter

from factstream.testing import HostCluster
from factstream.testing.helpers import free_port, until
from tests.bundled.events.conftest import store_of, token_of
from tests.bundled.typing.conftest import ALICE, BOB, CAROL, TYPING_TOKENS, put_typing, sync, typing_of


async def test_a_new_run_of_the_writer_resets_the_worker_and_old_tokens_see_nobody_typing(
    host_cluster: HostCluster,
) -> None:
    host_cluster.configure(http={"tokens": TYPING_TOKENS}, instance_map={"main": {"http_port": free_port()}})
    main = await host_cluster("main")
    worker = await host_cluster("worker1")
    await host_cluster.following(worker, "events", "typing")
    store = store_of(main)
    room = await store.create_room(ALICE, preset="public_chat")
    quiet = await store.create_room(BOB, preset="public_chat")  # nobody ever types there
    await store.change_membership(room, BOB, BOB, "join")
    await store.create_room(CAROL, preset="public_chat")  # not bob's
    events = main.id_generator("events").get_current_token()
    assert await worker.api.wait_for_stream_position("main", "events", events, timeout=10)
    view = worker.api.state(TypingView)
    bob = host_cluster.client(worker, token_of(BOB))
    first = (await sync(bob))["next_batch"]

    assert (await put_typing(host_cluster.client(main, token_of(ALICE)), room, ALICE)).status_code == 200
    old_epoch = main.api.state(TypingWriter).stream.epoch
    position = main.api.state(TypingView).rooms[room].position
    assert await worker.api.wait_for_stream_position("main", "typing", position, timeout=10)
    assert view.rooms[room].users == (ALICE,)
    body = await sync(bob, first)
    assert typing_of(body) == {room: [ALICE]}
    before = body["next_batch"]

    await main.stop()
    main = await host_cluster("main")
    new_epoch = main.api.state(TypingWriter).stream.epoch
    assert new_epoch > position > old_epoch
    await until(lambda: view.epoch == new_epoch, 15, "the worker to reset its view to main's new run")
    assert view.rooms == {}
    for token in (before, first):  # tokens from before the restart: every joined room, nobody typing
        assert typing_of(await sync(bob, token)) == {room: [], quiet: []}, token
    assert typing_of(await sync(bob)) == {}
    after = (await sync(bob, before))["next_batch"]

    assert (await put_typing(host_cluster.client(main, token_of(BOB)), room, BOB)).status_code == 200
    position = main.api.state(TypingView).rooms[room].position
    assert await worker.api.wait_for_stream_position("main", "typing", position, timeout=10)
    assert view.rooms[room].users == (BOB,)
    body = await sync(bob, after)
    assert typing_of(body) == {room: [BOB]}
    assert typing_of(await sync(bob, body["next_batch"])) == {}  # the new run's tokens are not stale
