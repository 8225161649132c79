"""Room tokens with several writers, and reads by per-writer ranges (issue 35; docs/plugins/events.md,
"Tokens with several writers").

Two writers of ``events`` (``w1``, ``w2``) and a worker, in process, rooms sharded between the writers
by ``writer_for``. A writer is stalled inside an open transaction that holds a reserved stream ID
(tests/bundled/events/multiwriter.py): its position cannot pass that ID, and the other writer's events,
at higher IDs, must still reach ``/events``, ``/sync`` and ``/messages`` at once, while nothing is
skipped or delivered twice when the stalled one commits.

The model test drives random interleavings (hypothesis) of sends, stalls, releases and incremental
reads of ``/events`` and ``/sync`` on every host; each read chain's answers, concatenated, must be
exactly the messages sent, each once, in stream order per room; and each ``/events`` answer's token
must bound ``/messages`` exactly as the answers did.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import pytest
from factstream_events.rules.tokens import (
    MAX_TOKEN_LENGTH,
    MAX_WRITERS,
    Positions,
    RoomToken,
    TokenError,
    WriterRange,
    live_token,
    positions_of,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from factstream.testing import HostCluster
from tests.bundled.events.conftest import store_of, token_of
from tests.bundled.events.multiwriter import ALICE, BOB, WRITERS, Stall, caught_up, owned_rooms, two_writers

BIGINT_MAX = 2**63 - 1
FILTER = json.dumps({"room": {"timeline": {"limit": 100}}})

# -- the tokens ---------------------------------------------------------------------------------------


@st.composite
def multi_writer_tokens(draw: st.DrawFn) -> RoomToken:
    minimum = draw(st.integers(0, BIGINT_MAX - 1))
    ids = draw(st.lists(st.integers(0, BIGINT_MAX), min_size=1, max_size=8, unique=True))
    positions = [draw(st.integers(minimum + 1, BIGINT_MAX)) for _ in ids]
    return RoomToken(stream=minimum, writers=tuple(sorted(zip(ids, positions, strict=True))))


QUICK = settings(deadline=None, suppress_health_check=[HealthCheck.too_slow])


@QUICK
@given(multi_writer_tokens())
def test_a_multi_writer_token_round_trips_in_one_spelling(token: RoomToken) -> None:
    text = str(token)
    assert text.startswith("m")
    assert RoomToken.parse(text) == token
    assert len(text) <= MAX_TOKEN_LENGTH


@QUICK
@given(st.text(alphabet="m~.0123456789-+ s\x00", max_size=40) | st.text(max_size=40))
def test_garbage_is_a_token_error_or_the_one_spelling_of_a_token(text: str) -> None:
    try:
        token = RoomToken.parse(text)
    except TokenError as exc:
        assert str(exc).startswith("invalid room token ")
        return
    assert str(token) == text


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("m5", "lists at least one writer"),
        ("m5~", "lists at least one writer"),
        ("m5~1", "writer 1 is not '<instance id>.<position>'"),
        ("m5~1.5", "not ahead of the minimum 5"),
        ("m5~1.4", "not ahead of the minimum 5"),
        ("m5~2.7~1.8", "does not follow 2"),
        ("m5~1.7~1.8", "does not follow 1"),
        ("m05~1.7", "minimum stream position has a leading zero"),
        ("m5~01.7", "instance ID of writer 1 has a leading zero"),
        ("m5~1.07", "position of writer 1 has a leading zero"),
        ("m-5~1.7", "minimum stream position is negative"),
        ("m5~-1.7", "instance ID of writer 1 is negative"),
        ("m5~1.7~", "writer 2 is not '<instance id>.<position>'"),
        ("m5~1.7.8", "position of writer 1 has a character other than digits ('.')"),
        ("m5~1.7 ", "position of writer 1 has a character other than digits (' ')"),
        ("m" + "~".join(["0", *(f"{i}.9" for i in range(1, MAX_WRITERS + 2))]), f"more than {MAX_WRITERS} writers"),
    ],
)
def test_a_malformed_multi_writer_token_is_refused_naming_what_is_wrong(text: str, reason: str) -> None:
    with pytest.raises(TokenError, match="invalid room token") as caught:
        RoomToken.parse(text)
    assert reason in str(caught.value)


def test_the_longest_token_fits() -> None:
    token = RoomToken(0, writers=tuple((BIGINT_MAX - MAX_WRITERS + i, BIGINT_MAX) for i in range(MAX_WRITERS)))
    assert RoomToken.parse(str(token)) == token and len(str(token)) <= MAX_TOKEN_LENGTH


def test_a_token_states_per_writer_positions_and_all_equal_is_an_s_token() -> None:
    ahead = Positions(5, {"w1": 9, "w2": 5, "w3": 7})
    assert ahead.of("w1") == 9 and ahead.of("w2") == 5 and ahead.of("nobody") == 5
    assert str(live_token(ahead, {"w1": 2, "w3": 1})) == "m5~1.7~2.9"
    assert str(live_token(Positions(5, {"w1": 5}), {})) == "s5"
    assert positions_of(RoomToken.parse("m5~1.7~2.9"), {1: "w3", 2: "w1"}) == ahead
    with pytest.raises(TokenError, match="no writer has instance ID 2"):
        positions_of(RoomToken.parse("m5~1.7~2.9"), {1: "w3"})


@QUICK
@given(
    st.dictionaries(st.sampled_from(["a", "b", "c"]), st.integers(0, 20)),
    st.dictionaries(st.sampled_from(["a", "b", "c"]), st.integers(0, 20)),
    st.sampled_from(["a", "b", "c", "d"]),
    st.integers(0, 21),
)
def test_a_range_holds_an_event_iff_it_is_after_its_writers_low_and_at_most_its_high(
    low: dict[str, int], high: dict[str, int], writer: str, stream: int
) -> None:
    span = WriterRange(Positions.of_writers(low, minimum=0), Positions.of_writers(high, minimum=0))
    assert span.contains(writer, stream) == (low.get(writer, 0) < stream <= high.get(writer, 0))
    if span.empty:
        assert not any(span.contains(w, n) for w in "abcd" for n in range(22))


# -- reading past a stalled writer ----------------------------------------------------------------------


def text(body: str) -> dict[str, str]:
    return {"msgtype": "m.text", "body": body}


async def get(http: httpx.AsyncClient, path: str, **params: Any) -> dict[str, Any]:
    response = await http.get(path, params=params)
    assert response.status_code == 200, response.text
    return dict(response.json())


def new_messages(answer: dict[str, Any], kind: str) -> dict[str, list[str]]:
    """Room -> message IDs of an ``/events`` or ``/sync`` answer."""
    if kind == "events":
        rooms = {r: v["events"] for r, v in answer["rooms"].items()}
    else:
        rooms = {r: v["timeline"]["events"] for r, v in answer.get("rooms", {}).get("join", {}).items()}
    return {r: [e["event_id"] for e in events if e["type"] == "m.room.message"] for r, events in rooms.items()}


async def test_a_stalled_writer_holds_back_only_its_own_rooms_and_its_event_comes_once_after(
    host_cluster: HostCluster,
) -> None:
    hosts = await two_writers(host_cluster, "tcp")
    rooms = await owned_rooms(hosts, 1, BOB)
    slow_room, quick_room = rooms["w1"][0], rooms["w2"][0]
    await caught_up(hosts)
    readers = {name: host_cluster.client(host, token_of(BOB)) for name, host in hosts.items()}
    start = {name: (await get(http, "/events"))["next"] for name, http in readers.items()}
    sync_start = (await get(readers["worker1"], "/sync", filter=FILTER))["next_batch"]

    stall = Stall(host_cluster.database_url)
    await stall.start(hosts["w1"], slow_room, ALICE, "stalled", "slow")
    quick = await store_of(hosts["w2"]).send(quick_room, ALICE, "m.room.message", text("quick"))
    await caught_up(hosts)
    nexts = {}
    for name, http in readers.items():
        answer = await get(http, "/events", **{"from": start[name]})
        assert new_messages(answer, "events") == {quick_room: [quick]}, name
        nexts[name] = answer["next"]
        assert nexts[name].startswith("m"), f"{name}: w2 is ahead of w1, so the token says so: {nexts[name]}"
        # the token bounds /messages exactly as /events read: the quick message, not the stalled one
        page = await get(http, f"/rooms/{quick_room}/messages", **{"from": nexts[name], "dir": "b"})
        assert quick in [e["event_id"] for e in page["chunk"]]
        assert page["start"] == nexts[name]
    body = await get(readers["worker1"], "/sync", since=sync_start, filter=FILTER, timeout=0)
    assert new_messages(body, "sync") == {quick_room: [quick]}
    assert body["rooms"]["join"][quick_room]["timeline"]["prev_batch"].startswith("m")

    slow = await stall.release()
    await caught_up(hosts)
    for name, http in readers.items():
        answer = await get(http, "/events", **{"from": nexts[name]})
        assert new_messages(answer, "events") == {slow_room: [slow]}, name
        again = await get(http, "/events", **{"from": answer["next"]})
        assert new_messages(again, "events") == {}
        forward = await get(
            http, f"/rooms/{slow_room}/messages", **{"from": nexts[name], "to": answer["next"]}, dir="f"
        )
        assert [e["event_id"] for e in forward["chunk"] if e["type"] == "m.room.message"] == [slow]
    after = await get(readers["worker1"], "/sync", since=body["next_batch"], filter=FILTER, timeout=0)
    assert new_messages(after, "sync") == {slow_room: [slow]}
    for http in readers.values():
        await http.aclose()


async def test_old_s_and_t_tokens_keep_working_with_two_writers_on_every_route(host_cluster: HostCluster) -> None:
    """A client holding an ``s`` or ``t`` token (from a single-writer deployment, or handed out while the
    writers agreed) reads ``/events``, ``/sync`` and ``/messages`` from it on every host: exactly what came
    after it, in both writers' rooms, and nothing twice."""
    hosts = await two_writers(host_cluster, "tcp")
    rooms = await owned_rooms(hosts, 1, BOB)
    a, b = rooms["w1"][0], rooms["w2"][0]
    before = {a: await store_of(hosts["w1"]).send(a, ALICE, "m.room.message", text("a1"))}
    before[b] = await store_of(hosts["w2"]).send(b, ALICE, "m.room.message", text("b1"))
    await caught_up(hosts)
    db = hosts["w1"].api.database()
    ((k,),) = await db.fetchall("SELECT max(stream_ordering) FROM events")
    ((topo, stream),) = await db.fetchall(
        "SELECT topological_ordering, stream_ordering FROM events WHERE event_id = %(e)s", {"e": before[a]}
    )
    old_sync = {}
    for name, host in hosts.items():
        body = await get(host_cluster.client(host, token_of(BOB)), "/sync", filter=FILTER)
        fields = body["next_batch"].split("_")
        room_field = [i for i, f in enumerate(fields) if f.startswith(("s", "m"))]
        assert len(room_field) == 1, body["next_batch"]
        fields[room_field[0]] = f"s{k}"  # the token of a client that synced at k
        old_sync[name] = "_".join(fields)
    after = {a: await store_of(hosts["w1"]).send(a, ALICE, "m.room.message", text("a2"))}
    after[b] = await store_of(hosts["w2"]).send(b, ALICE, "m.room.message", text("b2"))
    await caught_up(hosts)
    expected = {room: [event] for room, event in after.items()}

    for name, host in hosts.items():
        http = host_cluster.client(host, token_of(BOB))
        answer = await get(http, "/events", **{"from": f"s{k}"})
        assert new_messages(answer, "events") == expected, name
        assert new_messages(await get(http, "/events", **{"from": answer["next"]}), "events") == {}
        body = await get(http, "/sync", since=old_sync[name], filter=FILTER, timeout=0)
        assert new_messages(body, "sync") == expected, name
        for room in (a, b):
            back = await get(http, f"/rooms/{room}/messages", **{"from": f"s{k}", "dir": "b"})
            assert [e["event_id"] for e in back["chunk"] if e["type"] == "m.room.message"] == [before[room]]
            forward = await get(http, f"/rooms/{room}/messages", **{"from": f"s{k}", "dir": "f"})
            assert [e["event_id"] for e in forward["chunk"] if e["type"] == "m.room.message"] == [after[room]]
        # a t token: a position in room a's own order, just after its first message
        page = await get(http, f"/rooms/{a}/messages", **{"from": f"t{topo}-{stream}", "dir": "f"})
        assert [e["event_id"] for e in page["chunk"] if e["type"] == "m.room.message"] == [after[a]], name
        await http.aclose()


async def test_an_unknown_writer_in_a_token_is_a_400_naming_the_parameter(host_cluster: HostCluster) -> None:
    hosts = await two_writers(host_cluster, "tcp")
    rooms = await owned_rooms(hosts, 1, BOB)
    async with host_cluster.client(hosts["worker1"], token_of(BOB)) as http:
        for path, name in (("/events", "from"), (f"/rooms/{rooms['w1'][0]}/messages", "from")):
            response = await http.get(path, params={name: "m5~999.7"})
            assert response.status_code == 400, response.text
            assert response.json()["error"].startswith(f"{name}: ") and "instance ID 999" in response.json()["error"]
        response = await http.get(f"/rooms/{rooms['w1'][0]}/messages", params={"to": "m5~1.5"})
        assert response.status_code == 400 and "to: invalid room token 'm5~1.5'" in response.json()["error"]


# -- the model: random interleavings --------------------------------------------------------------------

operations = st.lists(
    st.one_of(
        st.tuples(st.just("send"), st.integers(0, 3)),
        st.tuples(st.just("stall"), st.sampled_from(WRITERS)),
        st.tuples(st.just("release"), st.sampled_from(WRITERS)),
        st.tuples(st.just("read"), st.integers(0, 5)),
    ),
    min_size=1,
    max_size=14,
)


class Chain:
    """One reader's incremental reads (``/events`` or ``/sync`` on one host), and what they delivered."""

    def __init__(self, host: str, kind: str, http: httpx.AsyncClient) -> None:
        self.host, self.kind, self.http = host, kind, http
        self.token = ""
        self.delivered: dict[str, list[str]] = {}

    async def begin(self) -> None:
        if self.kind == "events":
            self.token = (await get(self.http, "/events"))["next"]
        else:
            self.token = (await get(self.http, "/sync", filter=FILTER))["next_batch"]

    async def read(self, mine: set[str]) -> dict[str, list[str]]:
        """One incremental read; the new messages among ``mine`` (also added to :attr:`delivered`)."""
        if self.kind == "events":
            answer = await get(self.http, "/events", **{"from": self.token, "limit": 100})
            self.token = answer["next"]
        else:
            answer = await get(self.http, "/sync", since=self.token, filter=FILTER, timeout=0)
            self.token = answer["next_batch"]
        new = {r: [e for e in ids if e in mine] for r, ids in new_messages(answer, self.kind).items()}
        for room, ids in new.items():
            self.delivered.setdefault(room, []).extend(ids)
        return new


async def test_consecutive_reads_deliver_every_message_once_in_stream_order_whatever_the_interleaving(
    host_cluster: HostCluster,
) -> None:
    hosts = await two_writers(host_cluster, "tcp")
    rooms = await owned_rooms(hosts, 2, BOB)
    room_list = [room for writer in WRITERS for room in rooms[writer]]
    owner = {room: writer for writer in WRITERS for room in rooms[writer]}
    loop = asyncio.get_running_loop()
    examples: list[int] = []

    async def run(ops: list[tuple[str, Any]]) -> None:
        n = len(examples)
        chains = [Chain(h, k, host_cluster.client(hosts[h], token_of(BOB))) for h in hosts for k in ("events", "sync")]
        for chain in chains:
            await chain.begin()
        stalls: dict[str, tuple[Stall, str]] = {}
        sent: dict[str, list[tuple[int, str]]] = {room: [] for room in room_list}  # (stream, event ID)
        done: set[str] = set()  # completed sends of writers not stalled when they completed: visible at once

        async def stream_of(event_id: str) -> int:
            rows = (
                await hosts["w1"]
                .api.database()
                .fetchall("SELECT stream_ordering FROM events WHERE event_id = %(e)s", {"e": event_id})
            )
            return int(rows[0][0])

        try:
            await play(n, ops, chains, stalls, sent, done, stream_of)
        finally:  # a failed example must not leave a writer stalled for the next (or the teardown)
            for stall, room in stalls.values():
                event_id = await stall.release()
                sent[room].append((await stream_of(event_id), event_id))
            stalls.clear()
        await caught_up(hosts)
        for chain in chains:
            await chain.read({e for ids in sent.values() for _, e in ids})
            for room in room_list:
                expected = [e for _, e in sorted(sent[room])]
                assert chain.delivered.get(room, []) == expected, (chain.host, chain.kind, room)
            assert not any((await chain.read({e for ids in sent.values() for _, e in ids})).values())
            await chain.http.aclose()
        examples.append(len(ops))

    async def play(
        n: int,
        ops: list[tuple[str, Any]],
        chains: list[Chain],
        stalls: dict[str, tuple[Stall, str]],
        sent: dict[str, list[tuple[int, str]]],
        done: set[str],
        stream_of: Any,
    ) -> None:
        for step, (kind, arg) in enumerate(ops):
            if kind == "send":
                room = room_list[arg]
                if owner[room] in stalls and stalls[owner[room]][1] == room:
                    continue  # the room's lock is held by the stalled send
                event_id = await store_of(hosts[owner[room]]).send(room, ALICE, "m.room.message", text(f"{n}.{step}"))
                sent[room].append((await stream_of(event_id), event_id))
                if owner[room] not in stalls:
                    done.add(event_id)
            elif kind == "stall" and arg not in stalls:
                room = rooms[arg][step % 2]
                stall = Stall(host_cluster.database_url)
                await stall.start(hosts[arg], room, ALICE, f"stall-{n}-{step}", f"{n}.{step} stalled")
                stalls[arg] = (stall, room)
            elif kind == "release" and arg in stalls:
                stall, room = stalls.pop(arg)
                event_id = await stall.release()
                sent[room].append((await stream_of(event_id), event_id))
            elif kind == "read":
                chain = chains[arg]
                await caught_up(hosts, chain.host)
                await chain.read({e for ids in sent.values() for _, e in ids})
                got = {e for ids in chain.delivered.values() for e in ids}
                assert done <= got, f"{chain.host} {chain.kind}: held back by a stalled writer: {done - got}"
                if chain.kind == "events":  # the token bounds /messages as the reads did
                    for room in room_list:
                        page = await get(chain.http, f"/rooms/{room}/messages", **{"from": chain.token, "limit": 100})
                        mine = {e for _, e in sent[room]}
                        shown = {e["event_id"] for e in page["chunk"]} & mine
                        assert shown == set(chain.delivered.get(room, [])), (chain.host, room)

    @settings(max_examples=10, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
    @given(operations)
    def interleavings(ops: list[tuple[str, Any]]) -> None:
        asyncio.run_coroutine_threadsafe(run(ops), loop).result(120)

    await asyncio.to_thread(interleavings)
    assert len(examples) >= 10
