"""``POST /rooms/{room_id}/receipt/{receipt_type}/{event_id}`` and the receipts in ``/sync``, over HTTP
on a real host (docs/plugins/receipts.md): what is stored and shown, every refusal a 4xx with the API's
error shape and nothing written, idempotence, receipts that would move backwards, threads."""

from __future__ import annotations

from factstream.host.app import Host
from tests.bundled.events.conftest import USERS, store_of
from tests.bundled.receipts.conftest import Clients, receipts_in, send_receipt, sync

ALICE, BOB, CAROL = USERS[:3]


def text(body: str) -> dict[str, str]:
    return {"msgtype": "m.text", "body": body}


async def stored(main: Host) -> list[tuple[object, ...]]:
    sql = "SELECT room_id, receipt_type, user_id, event_id, thread_id FROM receipts_linearized ORDER BY stream_id"
    return [tuple(r) for r in await main.database().fetchall(sql, {})]


async def room_with_messages(main: Host, n: int = 2) -> tuple[str, list[str]]:
    store = store_of(main)
    room = await store.create_room(ALICE, preset="public_chat")
    await store.change_membership(room, BOB, BOB, "join")
    return room, [await store.send(room, ALICE, "m.room.message", text(f"m{i}")) for i in range(n)]


async def test_a_receipt_is_stored_and_reaches_the_rooms_members_in_sync(main: Host, client: Clients) -> None:
    room, (first, _) = await room_with_messages(main)
    bob, alice = client(BOB), client(ALICE)
    since = (await sync(alice))["next_batch"]
    response = await send_receipt(bob, room, first)
    assert response.status_code == 200 and response.json() == {}
    body = await sync(alice, since)
    content = receipts_in(body)[room]
    assert list(content) == [first]
    data = content[first]["m.read"][BOB]
    assert set(data) == {"ts"} and isinstance(data["ts"], int)
    # the room has new events too: both plugins' parts of the room are there, merged
    assert "timeline" in (await sync(alice))["rooms"]["join"][room]
    initial = await sync(bob)
    assert receipts_in(initial)[room] == content
    assert "timeline" in initial["rooms"]["join"][room]
    assert await stored(main) == [(room, "m.read", BOB, first, None)]


async def test_each_refusal_is_a_4xx_with_the_error_shape_and_stores_nothing(main: Host, client: Clients) -> None:
    room, (first, _) = await room_with_messages(main)
    other = await store_of(main).create_room(CAROL, preset="public_chat")
    elsewhere = await store_of(main).send(other, CAROL, "m.room.message", text("x"))
    bob, carol = client(BOB), client(CAROL)
    cases = [
        (bob, "!nocolon", first, "m.read", None, 400, "M_INVALID_PARAM"),
        (bob, room, "not-an-event", "m.read", None, 400, "M_INVALID_PARAM"),
        (bob, room, first, "m.fully_read", None, 400, "M_INVALID_PARAM"),
        (bob, room, first, "m.something", None, 400, "M_INVALID_PARAM"),
        (bob, room, first, "m.read", {"thread_id": ""}, 400, "M_INVALID_PARAM"),
        (bob, room, first, "m.read", {"thread_id": 7}, 400, "M_INVALID_PARAM"),
        (bob, room, first, "m.read", {"thread_id": "thread"}, 400, "M_INVALID_PARAM"),
        (bob, room, first, "m.read", {"thread_id": first}, 400, "M_INVALID_PARAM"),  # not that thread's event
        (bob, room, first, "m.read", ["a list"], 400, "M_BAD_JSON"),
        (carol, room, first, "m.read", None, 403, "M_FORBIDDEN"),  # not joined
        (bob, room, "$unknown", "m.read", None, 404, "M_NOT_FOUND"),
        (bob, room, elsewhere, "m.read", None, 404, "M_NOT_FOUND"),  # an event of another room
    ]
    for http, room_id, event_id, receipt_type, body, status, errcode in cases:
        response = await send_receipt(http, room_id, event_id, receipt_type, body)
        assert response.status_code == status, (room_id, event_id, receipt_type, body, response.text)
        assert response.json()["errcode"] == errcode and response.json()["error"], response.text
    response = await bob.post(f"/rooms/{room}/receipt/m.read/{first}", content=b"{not json")
    assert response.status_code == 400 and response.json()["errcode"] == "M_NOT_JSON"
    assert await stored(main) == []
    assert (await send_receipt(bob, room, first, "m.read", {"thread_id": "main"})).status_code == 200
    assert await stored(main) == [(room, "m.read", BOB, first, "main")]


async def test_a_receipt_again_or_for_an_older_event_changes_nothing(main: Host, client: Clients) -> None:
    room, (first, second) = await room_with_messages(main)
    bob = client(BOB)
    assert (await send_receipt(bob, room, second)).status_code == 200
    position = main.id_generator("receipts").get_current_token()
    for event_id in (second, first):  # the same receipt again, then one that would move back
        response = await send_receipt(bob, room, event_id)
        assert response.status_code == 200 and response.json() == {}
    assert main.id_generator("receipts").get_current_token() == position  # no new fact
    assert await stored(main) == [(room, "m.read", BOB, second, None)]
    third = await store_of(main).send(room, ALICE, "m.room.message", text("m3"))
    assert (await send_receipt(bob, room, third)).status_code == 200
    # the newer receipt replaced the row of its key; other types and threads are keys of their own
    assert (await send_receipt(bob, room, first, "m.read.private")).status_code == 200
    assert (await send_receipt(bob, room, first, "m.read", {"thread_id": "main"})).status_code == 200
    assert await stored(main) == [
        (room, "m.read", BOB, third, None),
        (room, "m.read.private", BOB, first, None),
        (room, "m.read", BOB, first, "main"),
    ]


async def test_threaded_receipts_follow_the_references_thread_rules(main: Host, client: Clients) -> None:
    room, (root, _) = await room_with_messages(main)
    store = store_of(main)
    in_thread = await store.send(
        room, ALICE, "m.room.message", {**text("reply"), "m.relates_to": {"rel_type": "m.thread", "event_id": root}}
    )
    reaction = await store.send(
        room, ALICE, "m.reaction", {"m.relates_to": {"rel_type": "m.annotation", "event_id": in_thread, "key": "+"}}
    )
    bob, alice = client(BOB), client(ALICE)
    for event_id, thread_id, status in [
        (root, root, 200),  # a thread's root is in its thread
        (in_thread, root, 200),
        (reaction, root, 200),  # related to an event of the thread
        (root, "main", 200),
        (in_thread, "main", 400),  # in a thread, so not on the main timeline
        (root, in_thread, 400),
    ]:
        response = await send_receipt(bob, room, event_id, "m.read", {"thread_id": thread_id})
        assert response.status_code == status, (event_id, thread_id, response.text)
    content = receipts_in(await sync(alice))[room]
    assert content[reaction]["m.read"][BOB]["thread_id"] == root
    assert content[root]["m.read"][BOB]["thread_id"] == "main"


async def test_an_unthreaded_receipt_hides_a_threaded_one_on_the_same_event(main: Host, client: Clients) -> None:
    room, (first, _) = await room_with_messages(main)
    bob, alice = client(BOB), client(ALICE)
    assert (await send_receipt(bob, room, first, "m.read", {"thread_id": "main"})).status_code == 200
    assert receipts_in(await sync(alice))[room][first]["m.read"][BOB]["thread_id"] == "main"
    assert (await send_receipt(bob, room, first)).status_code == 200
    assert "thread_id" not in receipts_in(await sync(alice))[room][first]["m.read"][BOB]
