"""Streams that share a ``/sync`` section (``StreamSpec.sync_section``): their parts are merged, so a
plugin adds to another plugin's section (a room's ``ephemeral`` events beside its ``timeline``) without
either knowing of the other. First the merge rule itself (``factstream.sync.sections``), over generated
parts, then two streams of a real host answering one ``/sync`` together, and a long poll woken by the
second alone.
"""

from __future__ import annotations

import asyncio
import copy
from collections.abc import Callable
from typing import Any

import httpx
import psycopg
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from factstream import PluginError
from factstream.db.engine import libpq_url
from factstream.sync.sections import SectionParts
from factstream.testing import PluginInstaller

# -- the merge rule -----------------------------------------------------------------------------------

Part = dict[str, Any]


class Disagree(Exception):
    pass


def model(have: Any, new: Any) -> Any:
    """The rule, stated plainly: mappings by key, lists one after the other, anything else equal."""
    if isinstance(have, dict) and isinstance(new, dict):
        return {
            k: model(have[k], new[k]) if k in have and k in new else have.get(k, new.get(k)) for k in {**have, **new}
        }
    if isinstance(have, list) and isinstance(new, list):
        return have + new
    if type(have) is type(new) and have == new:
        return have
    raise Disagree


_keys = st.sampled_from(["join", "!a", "!b", "timeline", "ephemeral", "events", "limited"])
_parts: st.SearchStrategy[Part] = st.recursive(
    st.dictionaries(_keys, st.integers(0, 2) | st.booleans() | st.lists(st.integers(0, 9), max_size=3), max_size=3),
    lambda inner: st.dictionaries(_keys, inner, max_size=3),
    max_leaves=12,
)


@settings(max_examples=500, deadline=None)
@given(st.lists(_parts, min_size=1, max_size=4))
def test_parts_merge_as_the_rule_says_or_are_refused_where_they_disagree(parts: list[Part]) -> None:
    originals = copy.deepcopy(parts)
    merged = SectionParts()
    expected: Any = None
    for n, part in enumerate(parts):
        try:
            expected = part if expected is None else model(expected, part)
        except Disagree:
            with pytest.raises(PluginError, match="the streams sharing a section must agree"):
                merged.add("rooms", f"s{n}", part)
            break
        merged.add("rooms", f"s{n}", part)
        assert merged.sections["rooms"] == expected
    assert parts == originals, "a part was changed by the merge"


def test_a_disagreement_names_the_streams_and_the_place() -> None:
    parts = SectionParts()
    parts.add("rooms", "events", {"join": {"!a": {"timeline": {"limited": True}}}})
    parts.add("rooms", "typing", {"join": {"!a": {"ephemeral": {"events": [1]}}}})
    with pytest.raises(PluginError) as refused:
        parts.add("rooms", "receipts", {"join": {"!a": {"timeline": {"limited": False}}}})
    assert str(refused.value) == (
        "/sync section 'rooms': stream 'receipts' sets rooms.join.!a.timeline.limited to False, where an earlier"
        " stream ('events', 'typing') set True: the streams sharing a section must agree"
    )


# -- two streams of one host --------------------------------------------------------------------------

ROOM_PARTS = """
import msgspec
import factstream
from factstream import StreamSpec, StreamTable, Wake

class Said(msgspec.Struct, frozen=True):
    room: str
    text: str

class Typing(msgspec.Struct, frozen=True):
    room: str
    user_id: str

async def rows(request, table, columns):
    return await request.host.database().fetchall(
        f"SELECT {columns} FROM {table} WHERE stream_id > %(low)s AND stream_id <= %(high)s ORDER BY stream_id",
        {"low": request.since.get("main", 0), "high": request.upto.get("main", 0)},
    )

async def said(request):
    joined = {}
    for room, text in await rows(request, "said", "room, text"):
        joined.setdefault(room, {"timeline": {"events": []}})["timeline"]["events"].append(text)
    return {"join": joined} if joined else {}

async def typing(request):
    joined = {}
    for room, user in await rows(request, "typing", "room, user_id"):
        joined[room] = {"ephemeral": {"events": [{"type": "m.typing", "content": {"user_ids": [user]}}]}}
    return {"join": joined} if joined else {}

@factstream.hookimpl
def register_streams(register):
    for name, row_type, function in (("said", Said, said), ("typing", Typing, typing)):
        register(StreamSpec(
            name=name, row_type=row_type, tables=(StreamTable(name, "instance_name", "stream_id"),),
            sync_key=f"{name}_key", sync_rows=function, sync_section="rooms",
            wake=lambda row: Wake(rooms=(row.room,)),
        ))
"""


async def test_two_streams_fill_one_room_of_the_rooms_section_and_either_wakes_a_long_poll(
    plugin_installer: PluginInstaller,
    inbox_db: str,
    inbox_cluster: Callable[..., Any],
    client: Callable[..., httpx.AsyncClient],
) -> None:
    with psycopg.connect(libpq_url(inbox_db), autocommit=True) as conn:
        key = "stream_id BIGINT UNIQUE NOT NULL, instance_name TEXT NOT NULL"
        conn.execute(f"CREATE TABLE said ({key}, room TEXT, text TEXT)")
        conn.execute(f"CREATE TABLE typing ({key}, room TEXT, user_id TEXT)")
        conn.execute("CREATE SEQUENCE said_seq; SELECT nextval('said_seq')")
        conn.execute("CREATE SEQUENCE typing_seq; SELECT nextval('typing_seq')")
    plugin_installer.from_source("roomparts", ROOM_PARTS)
    host = await inbox_cluster(stream_writers={"inbox": ["main"], "said": ["main"], "typing": ["main"]})
    import factstream_roomparts as plugin

    host.sync.notifier.set_user_rooms("@alice:hs", ["!lobby"])

    async def write(stream: str, row: Any) -> None:
        async with host.database().transaction() as txn:
            await host.api.stream(stream, type(row)).append(txn, row)

    alice = client(host, "alice-token")
    since = (await alice.get("/sync")).json()["next_batch"]
    await write("said", plugin.Said("!lobby", "hello"))
    await write("typing", plugin.Typing("!lobby", "@bob:hs"))
    body = (await alice.get("/sync", params={"since": since})).json()
    assert body["rooms"] == {
        "join": {
            "!lobby": {
                "timeline": {"events": ["hello"]},
                "ephemeral": {"events": [{"type": "m.typing", "content": {"user_ids": ["@bob:hs"]}}]},
            }
        }
    }
    poll = asyncio.ensure_future(alice.get("/sync", params={"since": body["next_batch"], "timeout": 5000}))
    await asyncio.sleep(0.2)
    assert not poll.done()
    await write("typing", plugin.Typing("!lobby", "@carol:hs"))
    woken = (await asyncio.wait_for(poll, 3)).json()
    assert woken["rooms"] == {
        "join": {"!lobby": {"ephemeral": {"events": [{"type": "m.typing", "content": {"user_ids": ["@carol:hs"]}}]}}}
    }
