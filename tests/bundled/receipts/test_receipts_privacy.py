"""Privacy is correctness (docs/plugins/receipts.md, Privacy): a receipt goes only to the room's joined
members, and an ``m.read.private`` receipt only to its owner, in ``/sync`` (initial and incremental) and
in wake-ups.

Each rule is checked against one small model, :func:`may_see`: first over generated receipts and viewers
(hypothesis) against the plugin's pure functions, then over every case of (who asks: the owner, another
member, an invited user, a user who left, a banned user, a stranger) by (receipt type) on a real host,
through HTTP.
"""

from __future__ import annotations

import asyncio
import time
from typing import Any

from factstream_receipts.rows import READ, READ_PRIVATE, ReceiptsRow, wake
from factstream_receipts.sync import rooms_section
from hypothesis import given
from hypothesis import strategies as st

from factstream import Wake
from factstream.host.app import Host
from tests.bundled.events.conftest import store_of
from tests.bundled.receipts.conftest import FRANK, Clients, seen, send_receipt, sync

ALICE, BOB, CAROL, DAVE, EVE = "@alice:hs", "@bob:hs", "@carol:hs", "@dave:hs", "@eve:hs"
#: Who asks, by their membership of the room when the receipt is sent (bob owns the receipt).
ASKERS = {BOB: "join", CAROL: "join", DAVE: "invite", EVE: "leave", ALICE: "join", FRANK: "never"}
BANNED = "@banned:hs"


def may_see(viewer: str, viewer_membership: str, owner: str, receipt_type: str) -> bool:
    """The model: joined members see public receipts; a private receipt only its owner."""
    if viewer_membership != "join":
        return False
    return receipt_type != READ_PRIVATE or viewer == owner


# -- the model against the plugin's functions, over generated receipts -----------------------------------

users = st.sampled_from(["@a:hs", "@b:hs", "@c:hs"])
rows = st.builds(
    ReceiptsRow,
    room_id=st.sampled_from(["!r1:hs", "!r2:hs"]),
    receipt_type=st.sampled_from([READ, READ_PRIVATE]),
    user_id=users,
    event_id=st.sampled_from(["$e1", "$e2"]),
    thread_id=st.none(),
    data=st.fixed_dictionaries({"ts": st.integers(0, 10**12)}),
)


@given(st.lists(rows, max_size=12), users, st.sets(st.sampled_from(["!r1:hs", "!r2:hs"])))
def test_sync_shows_exactly_what_the_model_allows(receipts: list[ReceiptsRow], viewer: str, joined: set[str]) -> None:
    # what the host reads: the receipts of the viewer's joined rooms only
    by_room: dict[str, list[ReceiptsRow]] = {}
    for row in receipts:
        if row.room_id in joined:
            by_room.setdefault(row.room_id, []).append(row)
    section = rooms_section(by_room, viewer)
    shown = {
        (room_id, event_id, receipt_type, user)
        for room_id, room in section.get("join", {}).items()
        for event in room["ephemeral"]["events"]
        for event_id, types in event["content"].items()
        for receipt_type, by_user in types.items()
        for user in by_user
    }
    expected = {
        (r.room_id, r.event_id, r.receipt_type, r.user_id)
        for r in receipts
        if may_see(viewer, "join" if r.room_id in joined else "leave", r.user_id, r.receipt_type)
    }
    assert shown == expected


@given(rows)
def test_a_private_receipt_wakes_its_owner_and_a_public_one_the_room(row: ReceiptsRow) -> None:
    expected = (
        Wake(users=(row.user_id,)) if row.receipt_type == READ_PRIVATE else Wake(rooms=(f"receipts|{row.room_id}",))
    )
    assert wake(row) == expected


# -- the model against a real host, every case ------------------------------------------------------------


async def room_of_every_membership(main: Host) -> tuple[str, str]:
    """A room with bob and carol joined, dave invited, eve left, ``BANNED`` banned and frank a
    stranger (alice created it); and a message in it."""
    store = store_of(main)
    room = await store.create_room(ALICE, preset="public_chat")
    for user in (BOB, CAROL, EVE, BANNED):
        await store.change_membership(room, user, user, "join")
    await store.change_membership(room, ALICE, DAVE, "invite")
    await store.change_membership(room, EVE, EVE, "leave")
    await store.change_membership(room, ALICE, BANNED, "ban")
    message = await store.send(room, ALICE, "m.room.message", {"msgtype": "m.text", "body": "hi"})
    return room, message


async def timed_poll(http: Any, since: str, timeout_ms: int) -> tuple[dict[str, Any], float]:
    started = time.monotonic()
    body = await sync(http, since, timeout=timeout_ms)
    return body, time.monotonic() - started


async def test_every_asker_and_receipt_type_sees_and_wakes_as_the_model_says(main: Host, client: Clients) -> None:
    askers = {**ASKERS, BANNED: "ban"}
    clients = {user: client(user) for user in askers if user != BANNED}
    for receipt_type in (READ, READ_PRIVATE):
        room, message = await room_of_every_membership(main)
        since = {user: (await sync(http))["next_batch"] for user, http in clients.items()}
        polls = {user: asyncio.create_task(timed_poll(http, since[user], 2_000)) for user, http in clients.items()}
        await asyncio.sleep(0.5)
        assert not any(p.done() for p in polls.values()), "nothing happened yet: every long poll must wait"
        assert (await send_receipt(clients[BOB], room, message, receipt_type)).status_code == 200
        receipt = (room, message, receipt_type, BOB)
        for user, poll in polls.items():
            body, took = await poll
            allowed = may_see(user, askers[user], BOB, receipt_type)
            case = f"{receipt_type} of bob, asked by {user} ({askers[user]})"
            assert (receipt in seen(body)) == allowed, case
            assert seen(body) <= {receipt}, case
            # a woken poll answers at once; one that is not woken waits for its whole timeout
            assert (took < 1.4) == allowed, f"{case}: answered after {took:.2f} s"
        # alice's public receipt moves every member's stream past bob's: whatever the wake-ups did,
        # the range read now holds bob's receipt, which only those the model allows may see
        assert (await send_receipt(clients[ALICE], room, message, READ)).status_code == 200
        public = (room, message, READ, ALICE)
        for user, http in clients.items():
            case = f"{receipt_type} of bob, then alice's m.read, asked by {user} ({askers[user]})"
            allowed = {r for r in (receipt, public) if may_see(user, askers[user], r[3], r[2])}
            for answer in (await sync(http), await sync(http, since[user])):
                assert {r for r in seen(answer) if r[0] == room} == allowed, case
