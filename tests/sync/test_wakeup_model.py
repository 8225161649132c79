"""A model of two writers, one reader and a long-polling client: a long poll returns as soon as anything it
would return is applied in the reader's process, whatever the order of the writers' rows (docs/sync.md,
"When a long poll returns").

The code under test is the reader's own: :class:`ReplicationHandler` (queues, runs, POSITIONs, catch-ups),
:class:`ReplicatedStream` over a real :class:`MultiWriterIdGenerator` position tracker (watermark, per-writer
positions), the reader pipeline (:class:`ReaderPipeline`), :class:`WakeRouter` and :class:`Notifier`, with
room tokens of :func:`current_token_source`. The model is the rest: a sequence handing out IDs, two writers
that reserve, commit (out of order too), stream their rows as RDATA (``batch`` rows included), announce
their positions as the real streamer does (an idle writer's position follows the other's IDs) and sometimes
drop what they sent (the reader then catches up from the "database", the model's committed rows, through
the stream's update function), and one channel in the order a hub relays (or Redis delivers) them.

The reader processes the channel in bursts of any size (a reader that was stopped, then resumed, gets one
large backlog). After each burst the client asks once more from its token with a zero timeout, and its
callback answers, as a sync stream does, with the committed rows of the client's rooms in ``(prev,
current]`` per writer. Checked after every burst: every row at or below the reader's position of its
writer was delivered to the pipeline exactly once, and the client has received every one of its rows the
reader has applied.
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

import msgspec
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from factstream import StreamSpec, StreamTable, Wake
from factstream.caches.registry import CacheRegistry
from factstream.host.pipeline import ReaderPipeline
from factstream.idgen.generator import MultiWriterIdGenerator
from factstream.idgen.positions import PositionTracker
from factstream.replication import wire
from factstream.replication.handler import ReplicationHandler
from factstream.replication.stream import ReplicatedStream
from factstream.sync import Notifier, RoomStreamToken, StreamToken, SyncKey, SyncKeyKind, SyncKeyLayout
from factstream.sync.stream_token import current_token_source
from factstream.sync.wakeups import SyncedStream, WakeRouter

WRITERS = ("w1", "w2")
USER = "@u"
#: The client's rooms (of either writer) and one room it is not in.
ROOMS = ("!a", "!b", "!c", "!elsewhere")
MINE = frozenset(ROOMS[:3])


class Fact(msgspec.Struct, frozen=True, order=True):
    room: str
    body: str


@dataclass(eq=False)
class Link:
    """The reader's one link (a TCP client of the hub, or Redis): it carries every writer's commands."""

    name: str = "hub"
    peer: str | None = None
    relays: bool = True

    def send(self, command: wire.Command) -> None:
        pass


@dataclass
class Writer:
    """One writer as its peers see it: reservations, commits, its position and its streamer's cursor."""

    name: str
    #: Reserved IDs not yet committed.
    open: set[int] = field(default_factory=set)
    #: Committed rows by ID (several rows at one ID: a batch).
    rows: dict[int, list[Fact]] = field(default_factory=dict)
    position: int = 1
    #: What the streamer sent last (its ``last_token``).
    sent: int = 1
    #: The highest ID this writer heard of from the other writers (an idle writer's position follows it).
    heard: int = 1

    def advance_own(self) -> None:
        """The position: every own ID up to it is committed; with nothing open, whatever it heard."""
        if self.open:
            floor = min(self.open) - 1
            done = [i for i in self.rows if i <= floor]
            self.position = max(self.position, max(done, default=0))
        else:
            self.position = max(self.position, self.heard, max(self.rows, default=0))


class Model:
    def __init__(self) -> None:
        self.sequence = 1  # positions start at 1, as a new stream's do
        self.writers = {w: Writer(w) for w in WRITERS}
        self.channel: list[wire.Command] = []

    # -- the writers ---------------------------------------------------------------------------------

    def reserve(self, writer: str, count: int) -> None:
        w = self.writers[writer]
        for _ in range(count):
            self.sequence += 1
            w.open.add(self.sequence)

    def commit(self, writer: str, pick: int, rooms: list[str]) -> None:
        """Commit one open reservation (the ``pick``-th lowest), with one row per room given."""
        w = self.writers[writer]
        if not w.open:
            return
        stream_id = sorted(w.open)[pick % len(w.open)]
        w.open.discard(stream_id)
        w.rows[stream_id] = [Fact(room, f"{writer}-{stream_id}-{i}") for i, room in enumerate(rooms)]
        w.advance_own()

    def stream(self, writer: str, lose: bool = False) -> None:
        """The streamer's pass: RDATA up to the position, then ``POSITION last position`` if it moved past
        the last row. ``lose``: the lines never arrive (a transport dropped them)."""
        w = self.writers[writer]
        w.advance_own()
        if w.position <= w.sent:
            return
        out: list[wire.Command] = []
        last = w.sent
        for stream_id in sorted(i for i in w.rows if w.sent < i <= w.position):
            rows = w.rows[stream_id]
            for i, row in enumerate(rows):
                token = stream_id if i == len(rows) - 1 else None
                out.append(wire.RdataCommand("facts", writer, token, [row.room, row.body]))
            last = stream_id
        if last < w.position:
            out.append(wire.PositionCommand("facts", writer, last, w.position))
        w.sent = w.position
        if not lose:
            self.channel.extend(out)
        # Every other writer hears it (through the hub, or Redis) and may now announce a position past it.
        for other in self.writers.values():
            if other is not w:
                other.heard = max(other.heard, w.position)

    def announce_gap(self, writer: str) -> None:
        """``POSITION t t`` after lost lines (``mark_gap``): a reader behind ``t`` catches up."""
        w = self.writers[writer]
        self.channel.append(wire.PositionCommand("facts", writer, w.sent, w.sent))

    # -- the "database" ------------------------------------------------------------------------------

    async def updates(self, _db: Any, instance: str, low: int, high: int, limit: int) -> tuple[list[Any], int, bool]:
        """The stream's update function over the committed rows (whole IDs, at most ``limit`` rows or so)."""
        out: list[tuple[int, Fact]] = []
        for stream_id in sorted(i for i in self.writers[instance].rows if low < i <= high):
            if len(out) >= limit:
                return out, out[-1][0], True
            out += [(stream_id, row) for row in self.writers[instance].rows[stream_id]]
        return out, high, False

    def committed(self, writer: str, low: int, high: int) -> list[tuple[int, Fact]]:
        rows = self.writers[writer].rows
        return [(i, row) for i in sorted(rows) if low < i <= high for row in rows[i]]


class Reader:
    """The real reader: handler, stream, tracker, pipeline, router and notifier of one process."""

    def __init__(self, model: Model) -> None:
        spec: StreamSpec[Fact] = StreamSpec(
            name="facts",
            row_type=Fact,
            tables=(StreamTable("facts", "stream_id", "instance_name"),),
            writers="configured",
            sync_key="facts_key",
            update_function=model.updates,
            wake=lambda row: Wake(rooms=(row.room,)),
        )
        gen = MultiWriterIdGenerator(
            None,  # type: ignore[arg-type]  # a reader of the model never asks the database
            stream_name="facts",
            sequence_name="facts_seq",
            tables=spec.tables,
            writers=WRITERS,
            instance_name="worker",
        )
        gen._tracker = PositionTracker(local="worker", positions=dict.fromkeys(WRITERS, 1), persisted_upto=1)
        self.stream = ReplicatedStream(spec, gen, None)  # type: ignore[arg-type]
        self.stream.position_allowed = lambda token: True  # type: ignore[method-assign]  # no sequence here
        layout = SyncKeyLayout.of(SyncKey("facts_key", SyncKeyKind.ROOM))
        self.layout = layout
        self.notifier = Notifier(current_token_source(layout, {"facts_key": gen}))
        router = WakeRouter(self.notifier, [SyncedStream(spec, self.stream, "facts_key", spec.wake)])
        self.pipeline = ReaderPipeline(CacheRegistry(), router)
        self.delivered: list[tuple[str, int, Fact]] = []
        pipeline_rows, pipeline_run = self.pipeline.rows, self.pipeline.run

        def rows(stream: Any, instance: str, token: int, batch: list[Any]) -> Any:
            self.delivered += [(instance, token, row) for row in batch]
            return pipeline_rows(stream, instance, token, batch)

        def run(stream: Any, instance: str, tokens: list[int], batch: list[Any]) -> Any:
            self.delivered += [(instance, token, row) for token, row in zip(tokens, batch, strict=True)]
            return pipeline_run(stream, instance, tokens, batch)

        self.pipeline.rows = rows  # type: ignore[method-assign]
        self.pipeline.run = run  # type: ignore[method-assign]
        self.handler = ReplicationHandler("worker", [self.stream], sink=self.pipeline)
        self.link = Link()
        self.handler.new_connection(self.link)  # type: ignore[arg-type]
        self.notifier.set_user_rooms(USER, MINE)

    def position(self, writer: str) -> int:
        return self.stream.current_token(writer)


@dataclass
class Client:
    """The long-polling client: its token and the rows it received."""

    token: StreamToken
    received: list[tuple[str, int, Fact]] = field(default_factory=list)


def _at(token: StreamToken, writer: str) -> int:
    value = token.get("facts_key")
    assert isinstance(value, RoomStreamToken)
    return value.get_stream_pos_for_instance(writer)


async def _poll(model: Model, reader: Reader, client: Client) -> None:
    """One long poll with a zero timeout: whatever is there now, as a sync stream's callback reads it."""

    async def callback(prev: StreamToken, current: StreamToken) -> list[tuple[str, int, Fact]]:
        found = []
        for writer in WRITERS:
            low = max(_at(prev, writer), _at(client.token, writer))
            for stream_id, row in model.committed(writer, low, _at(current, writer)):
                if row.room in MINE:
                    found.append((writer, stream_id, row))
        return found

    result = await reader.notifier.wait_for_events(USER, client.token, 0, callback)
    client.received += result.result or []
    value = client.token.get("facts_key")
    upto = result.next_token.get("facts_key")
    assert isinstance(value, RoomStreamToken) and isinstance(upto, RoomStreamToken)
    client.token = client.token.replace("facts_key", value.copy_and_advance(upto))


_STEPS = st.lists(
    st.one_of(
        st.tuples(st.just("reserve"), st.sampled_from(WRITERS), st.integers(1, 4)),
        st.tuples(
            st.just("commit"),
            st.sampled_from(WRITERS),
            st.integers(0, 3),
            st.lists(st.sampled_from(ROOMS), min_size=1, max_size=3),
        ),
        st.tuples(st.just("stream"), st.sampled_from(WRITERS)),
        st.tuples(st.just("stream"), st.sampled_from(WRITERS)),
        st.tuples(st.just("lose"), st.sampled_from(WRITERS)),
        st.tuples(st.just("burst")),
        st.tuples(st.just("poll")),
    ),
    max_size=60,
)


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(_STEPS)
async def test_a_long_poll_brings_every_applied_row_of_its_rooms_whatever_the_writers_order(steps: list[Any]) -> None:
    model = Model()
    reader = Reader(model)
    for writer in WRITERS:  # each writer announces itself on the link, as after REPLICATE
        reader.handler.on_command(reader.link, wire.PositionCommand("facts", writer, 1, 1))  # type: ignore[arg-type]
    await reader.handler.drained()
    client = Client(StreamToken.start(reader.layout))
    await _poll(model, reader, client)
    fed = 0
    lost: set[str] = set()

    async def burst() -> None:
        nonlocal fed
        for cmd in model.channel[fed:]:
            reader.handler.on_command(reader.link, cmd)  # type: ignore[arg-type]
        fed = len(model.channel)
        await reader.handler.drained()
        await asyncio.sleep(0)
        check_applied()
        await _poll(model, reader, client)
        check_received()

    def check_applied() -> None:
        # Every committed row up to the reader's position of its writer went through the pipeline, once.
        expected = sorted((w, i, row) for w in WRITERS for i, row in model.committed(w, 0, reader.position(w)))
        got = sorted((w, i, row) for w, i, row in reader.delivered if i <= reader.position(w))
        assert got == expected, f"positions {reader.stream.id_gen.get_positions()}"

    def check_received() -> None:
        applied = sorted(
            (w, i, row) for w in WRITERS for i, row in model.committed(w, 0, reader.position(w)) if row.room in MINE
        )
        assert sorted(client.received) == applied, (
            f"the client lacks {sorted(set(applied) - set(client.received))} at {client.token}"
        )

    for step in steps:
        kind = step[0]
        if kind == "reserve":
            model.reserve(step[1], step[2])
        elif kind == "commit":
            model.commit(step[1], step[2], step[3])
        elif kind == "stream":
            model.stream(step[1])
            if step[1] in lost:
                lost.discard(step[1])
        elif kind == "lose":
            model.stream(step[1], lose=True)
            model.announce_gap(step[1])
        elif kind == "burst":
            await burst()
        elif kind == "poll":
            await _poll(model, reader, client)
            check_received()
    for writer in WRITERS:  # everything committed and sent
        while model.writers[writer].open:
            model.commit(writer, 0, ["!a"])
        model.stream(writer)
    for writer in WRITERS:
        model.stream(writer)
    await burst()
    await reader.handler.close()
    for writer in WRITERS:
        assert reader.position(writer) >= model.writers[writer].position
