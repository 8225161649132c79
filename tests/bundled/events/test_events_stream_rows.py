"""The events stream's wire rows and its update function (docs/plugins/events.md, Streams).

The rows' JSON is exactly the reference's: ``["ev", [9 fields]]``, ``["state", [4 fields]]``,
``["state-all", [room_id]]``, and the backfill stream's ``[6 fields]``, as the core's codec writes them
in an ``RDATA`` line and reads them back into the typed rows. The update function splits a range as the
reference's does: half the target for ``ev`` rows, ``state`` rows cut back to whole IDs, one oversized
ID returned whole, 150 or more ``state`` rows of a room at one ID collapsed into ``state-all``,
ex-outliers at their new IDs; and paging a range with any target gives the rows of one read.
"""

from __future__ import annotations

import asyncio
import itertools
from typing import Any

from factstream_events.shared.rows import (
    EV,
    STATE,
    STATE_ALL,
    BackfillRow,
    EventRowData,
    EventsRow,
    StateRowData,
    ev_row,
    event_data,
    state_all_row,
    state_data,
    state_row,
)
from factstream_events.store import RemoteEvent
from factstream_events.updates import events_updates
from factstream_events.write.create import Draft, LocalWrite
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from factstream.host.app import Host
from factstream.replication.wire.command import encode_line
from factstream.replication.wire.parse import parse_command
from factstream.replication.wire.rdata import RdataCommand
from tests.bundled.events.conftest import USERS, store_of
from tests.bundled.events.remote_history import ROOM_VERSION, RemoteRoom

ALICE = USERS[0]


def wire(host: Host, stream: str, token: int, row: Any) -> bytes:
    """``row`` in an RDATA line from main, as the core's codec writes it."""
    return encode_line(RdataCommand(stream, "main", token, host.streams[stream].encode_row(row)))


def parsed(host: Host, line: bytes) -> Any:
    """The typed row of an RDATA line, as a reader parses it."""
    command = parse_command(line.rstrip(b"\n"))
    assert isinstance(command, RdataCommand)
    return host.streams[command.stream_name].parse_row(command.row)


# -- the JSON of each row kind ------------------------------------------------------------------------------


async def test_each_row_kind_is_the_references_json_in_an_rdata_line(main: Host) -> None:
    member = EventRowData("$m", "!r:hs", "m.room.member", "@u:hs", None, None, "join", False, False)
    redaction = EventRowData("$x", "!r:hs", "m.room.redaction", None, "$m", None, None, False, True)
    reply = EventRowData("$y", "!r:hs", "m.room.message", None, None, "$m", None, False, False)
    cases = [
        (ev_row(member), b'["ev",["$m","!r:hs","m.room.member","@u:hs",null,null,"join",false,false]]'),
        (ev_row(redaction), b'["ev",["$x","!r:hs","m.room.redaction",null,"$m",null,null,false,true]]'),
        (ev_row(reply), b'["ev",["$y","!r:hs","m.room.message",null,null,"$m",null,false,false]]'),
        (state_row(StateRowData("!r:hs", "m.room.topic", "", "$t")), b'["state",["!r:hs","m.room.topic","","$t"]]'),
        (state_row(StateRowData("!r:hs", "m.test", "k", None)), b'["state",["!r:hs","m.test","k",null]]'),
        (state_all_row("!r:hs"), b'["state-all",["!r:hs"]]'),
    ]
    for row, json in cases:
        line = wire(main, "events", 42, row)
        assert line == b"RDATA events main 42 " + json + b"\n"
        back = parsed(main, line)
        assert back == row
        if back.kind == EV:
            assert event_data(back) in (member, redaction, reply)
        elif back.kind == STATE:
            assert state_data(back).room_id == "!r:hs"
    backfill = BackfillRow("$b", "!r:hs", "m.room.name", "", None, None)
    line = wire(main, "backfill", 7, backfill)
    assert line == b'RDATA backfill main 7 ["$b","!r:hs","m.room.name","",null,null]\n'
    assert parsed(main, line) == backfill


async def test_the_rows_of_real_writes_parse_back_into_their_typed_rows(main: Host) -> None:
    store = store_of(main)
    room = await store.create_room(ALICE, preset="public_chat")
    low = main.id_generator("events").get_current_token()
    joined = await store.change_membership(room, USERS[1], USERS[1], "join")
    high = main.id_generator("events").get_current_token()
    rows, _, _ = await events_updates(main.database(), "main", low, high, 100)
    lines = [wire(main, "events", token, row) for token, row in rows]
    assert lines == [
        f'RDATA events main {high} ["ev",["{joined}","{room}","m.room.member","{USERS[1]}",'
        f'null,null,"join",false,false]]\n'.encode(),
        f'RDATA events main {high} ["state",["{room}","m.room.member","{USERS[1]}","{joined}"]]\n'.encode(),
    ]
    assert [parsed(main, line) for line in lines] == [row for _, row in rows]


ids = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), min_size=1, max_size=8)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    st.builds(
        EventRowData,
        ids,
        ids,
        ids,
        st.none() | ids,
        st.none() | ids,
        st.none() | ids,
        st.none() | ids,
        st.booleans(),
        st.booleans(),
    )
)
def test_any_ev_row_round_trips_through_an_rdata_line(main: Host, data: EventRowData) -> None:
    line = wire(main, "events", 1, ev_row(data))
    assert event_data(parsed(main, line)) == data


# -- the update function's split ------------------------------------------------------------------------------


def position(host: Host) -> int:
    return host.id_generator("events").get_current_token_for_writer("main")


async def state_batch(host: Host, room: str, n: int, prefix: str) -> int:
    """One batch of ``n`` new state events (``n`` state rows at its first ID); that ID."""
    low = position(host)
    await store_of(host)._local(room, LocalWrite(tuple(Draft("m.test", ALICE, {}, f"{prefix}{i}") for i in range(n))))
    return low + 1


async def test_ev_rows_take_half_the_target(main: Host) -> None:
    store = store_of(main)
    room = await store.create_room(ALICE, preset="public_chat")
    low = position(main)
    for i in range(10):
        await store.send(room, ALICE, "m.room.message", {"msgtype": "m.text", "body": str(i)})
    rows, upto, limited = await events_updates(main.database(), "main", low, position(main), 8)
    assert [row.kind for _, row in rows] == [EV] * 4
    assert limited and upto == rows[-1][0] == low + 4


async def test_state_rows_are_cut_back_to_whole_ids(main: Host) -> None:
    room = await store_of(main).create_room(ALICE, preset="public_chat")
    low = position(main)
    first = await state_batch(main, room, 3, "a")
    second = await state_batch(main, room, 3, "b")
    assert second == first + 3
    rows, upto, limited = await events_updates(main.database(), "main", low, position(main), 10)
    # five ev rows reach the second batch's ID, whose three state rows would pass the limit of six:
    # the page ends at the first batch's ID, with all its rows
    assert limited and upto == first
    assert [(token, row.kind) for token, row in rows] == [(first, EV)] + [(first, STATE)] * 3


async def test_one_oversized_id_is_returned_whole(main: Host) -> None:
    room = await store_of(main).create_room(ALICE, preset="public_chat")
    low = position(main)
    at = await state_batch(main, room, 40, "k")
    rows, upto, limited = await events_updates(main.database(), "main", low, position(main), 4)
    assert limited and upto == at
    assert [row.kind for _, row in rows] == [EV] + [STATE] * 40
    assert {token for token, _ in rows} == {at}


async def test_150_state_rows_of_a_room_at_one_id_become_one_state_all(main: Host) -> None:
    store = store_of(main)
    big, small = [await store.create_room(ALICE, preset="public_chat") for _ in range(2)]
    low = position(main)
    at = await state_batch(main, big, 150, "k")
    below = await state_batch(main, small, 149, "k")
    rows, upto, limited = await events_updates(main.database(), "main", low, position(main), 100_000)
    assert not limited and upto == position(main)
    at_big = [row for token, row in rows if token == at]
    assert [row.kind for row in at_big] == [EV, STATE_ALL] and at_big[1].data == (big,)
    assert [row.kind for token, row in rows if token == below] == [EV] + [STATE] * 149
    assert all(row.kind == EV for token, row in rows if token not in (at, below))


async def test_an_ex_outlier_comes_as_an_ev_row_at_its_new_id(main: Host) -> None:
    store = store_of(main)
    room = RemoteRoom("!out:elsewhere")
    room.create("@zed:elsewhere")
    await store.persist_remote(room.room_id, [RemoteEvent(b.raw) for b in room.events], room_version=ROOM_VERSION)
    message = room.add("m.room.message", "@zed:elsewhere", {"body": "late"})
    await store.persist_remote(room.room_id, [RemoteEvent(message.raw, outlier=True)])
    was = position(main)
    await store.persist_remote(room.room_id, [RemoteEvent(message.raw)])
    now = position(main)
    assert now > was
    rows, _, _ = await events_updates(main.database(), "main", was, now, 100)
    assert rows == [(now, ev_row(event_data(rows[0][1])))]
    data = event_data(rows[0][1])
    assert (data.event_id, data.room_id, data.outlier) == (message.event_id, room.room_id, False)


async def test_paging_with_any_target_gives_the_rows_of_one_read(main: Host) -> None:
    store = store_of(main)
    room, other = [await store.create_room(ALICE, preset="public_chat") for _ in range(2)]
    for n in (1, 7, 40, 160, 3):
        await state_batch(main, room if n % 2 else other, n, f"s{n}-")
        await store.send(room, ALICE, "m.room.message", {"msgtype": "m.text", "body": str(n)})
        await main.database().fetchall("SELECT nextval('events_stream_seq') FROM generate_series(1, 5)")
    high = position(main)
    whole, upto, limited = await events_updates(main.database(), "main", 0, high, 10**9)
    assert upto == high and not limited and any(row.kind == STATE_ALL for _, row in whole)
    loop = asyncio.get_running_loop()

    async def pages(target: int) -> list[list[tuple[int, EventsRow]]]:
        low, out = 0, []
        while low < high:
            rows, upto, limited = await events_updates(main.database(), "main", low, high, target)
            assert low < upto <= high and all(low < token <= upto for token, _ in rows)
            out.append(rows)
            low = upto
            if not limited:
                break
        assert low == high
        return out

    @settings(max_examples=40, deadline=None, suppress_health_check=list(HealthCheck))
    @given(st.integers(1, 400))
    def paged(target: int) -> None:
        got = asyncio.run_coroutine_threadsafe(pages(target), loop).result(60)
        assert [row for page in got for row in page] == whole
        full = [page for page in got if page]
        assert all(a[-1][0] < b[0][0] for a, b in itertools.pairwise(full)), f"an ID split at target {target}"

    await asyncio.to_thread(paged)
