"""The ``events`` stream's update function read a page at a time, as a reader catching up reads it.

Paged with any target, it must give the rows one unbounded read gives, in the same order, never
splitting the rows of one stream ID between pages, each page reading a bounded slice of the range.
"""

from __future__ import annotations

import itertools
from typing import Any

from factstream_events.updates import PAGE_SPAN, events_updates

from factstream.host.app import Host

from .conftest import USERS, store_of


async def build_room(host: Host) -> None:
    """Messages, joins (state rows at their IDs) and a name change, with a room creation (a batch of
    state events: several IDs of state rows) first; between them, runs of IDs this writer did not
    write (as another writer's, or rolled back)."""
    store = store_of(host)
    alice = USERS[0]

    async def gap() -> None:
        await host.database().fetchall("SELECT nextval('events_stream_seq') FROM generate_series(1, 30)")

    room = await store.create_room(alice, preset="public_chat", name="paging")
    for i, user in enumerate(USERS[1:]):
        await gap()
        await store.change_membership(room, user, user, "join")
        await gap()
        await store.send(room, user, "m.room.message", {"msgtype": "m.text", "body": f"hello {i}"})
    await store.send(room, alice, "m.room.name", {"name": "paged"}, state_key="")
    await store.change_membership(room, USERS[1], USERS[1], "leave")


async def read_pages(host: Host, high: int, target: int) -> list[list[tuple[int, Any]]]:
    db = host.database()
    low, pages = 0, []
    while low < high:
        rows, upto, limited = await events_updates(db, "main", low, high, target)
        assert low < upto <= high
        assert upto <= low + PAGE_SPAN * target, "a page reads past its bounded slice of the range"
        assert all(low < token <= upto for token, _ in rows)
        pages.append(rows)
        low = upto
        if not limited:
            break
    assert low == high, "the pages stop before the end of the range"
    return pages


async def test_pages_of_any_target_give_what_one_read_gives(main: Host) -> None:
    await build_room(main)
    high = main.id_generator("events").get_current_token_for_writer("main")
    (whole,) = await read_pages(main, high, 100_000)
    assert len({token for token, _ in whole}) >= 10 and any(row.kind == "state" for _, row in whole)
    for target in range(1, 13):
        pages = await read_pages(main, high, target)
        assert [row for page in pages for row in page] == whole, f"target {target}"
        full = [page for page in pages if page]
        assert all(a[-1][0] < b[0][0] for a, b in itertools.pairwise(full)), f"an ID split (target {target})"
