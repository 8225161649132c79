"""What a writer keeps in memory per room stays bounded: room views (least recently written dropped
past ``max_views``, read again when the room is next written) and room locks (dropped once no write
holds or waits for them). A writer that has written a million rooms must not hold a million of each."""

from __future__ import annotations

import asyncio
import json

from tests.bundled.events.conftest import reads_of, store_of


async def test_room_views_and_locks_stay_bounded_and_evicted_rooms_still_write_right(main):
    store = store_of(main)
    persister = store.persister
    persister.max_views = 5
    rooms = [await store.create_room("@alice:hs") for _ in range(12)]
    for room in rooms:
        await store.send(room, "@alice:hs", "m.room.message", {"msgtype": "m.text", "body": "one"})
    assert persister.rooms_in_memory == (5, 0)

    # the first room's view was dropped: its next write reads the extremities again and chains on
    first = rooms[0]
    before = await reads_of(main).state_ids(first)
    sent = await store.send(first, "@alice:hs", "m.room.message", {"msgtype": "m.text", "body": "two"})
    page = await reads_of(main).messages("@alice:hs", first, direction="b", limit=3)
    bodies = [json.loads(e)["content"].get("body") for e in page.chunk][:2]
    assert bodies == ["two", "one"]
    rows = await main.api.database().fetchall(
        "SELECT event_id FROM event_forward_extremities WHERE room_id = %(r)s", {"r": first}
    )
    assert [r[0] for r in rows] == [sent]
    assert await reads_of(main).state_ids(first) == before

    # many writes to one room at once queue on its lock; the lock is gone once they are done
    sends = [
        store.send(first, "@alice:hs", "m.room.message", {"msgtype": "m.text", "body": f"n{i}"}) for i in range(10)
    ]
    done = await asyncio.gather(*sends)
    assert len(set(done)) == 10
    assert persister.rooms_in_memory[1] == 0
    assert persister.rooms_in_memory[0] <= 5
