"""A hub with several client writers: one writer's POSITION never makes the reader drop another's rows.

An idle writer announces ``POSITION`` each time another writer's IDs move its own position forward
(its position is "nothing of mine is unfinished up to here"). On a TCP hub whose clients are two
writers of one stream, that POSITION arrives on one link while the other writer's RDATA arrive on
another. The reader accepts a writer's rows once a POSITION *of that writer* was processed on the link
they arrive on; a POSITION of one writer must leave the other writer's links as they were (keying
this by stream alone, as the reference does, stalled the hub: every row of the busy writer was dropped
until it happened to announce a POSITION itself).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from hypothesis import given, settings
from hypothesis import strategies as st

from factstream.replication import wire
from tests.replication.test_rdata_runs import Row, recording_handler


@dataclass(eq=False)
class Link:
    """A server-side TCP link as the handler sees it: one peer, which speaks only for itself."""

    name: str
    peer: str | None
    relays: bool = False
    sent: list[wire.Command] = field(default_factory=list)

    def send(self, command: wire.Command) -> None:
        self.sent.append(command)


def rdata(writer: str, token: int) -> wire.RdataCommand:
    return wire.RdataCommand("s", writer, token, [f"{writer}-{token}", token])


def position(writer: str, prev: int, new: int) -> wire.PositionCommand:
    return wire.PositionCommand("s", writer, prev, new)


async def test_a_position_of_one_writer_leaves_the_other_writers_rows_accepted() -> None:
    stream, seen, handler = recording_handler("hub")
    links = {w: Link(f"link-{w}", w) for w in ("w1", "w2")}
    for writer, link in links.items():
        handler.new_connection(link)
        handler.on_command(link, position(writer, 0, 0))
    await handler.drained()
    # w2 writes; w1, idle, announces that its position moved with w2's IDs; w2 goes on writing.
    handler.on_command(links["w2"], rdata("w2", 1))
    handler.on_command(links["w1"], position("w1", 0, 1))
    handler.on_command(links["w2"], rdata("w2", 2))
    handler.on_command(links["w1"], position("w1", 1, 2))
    handler.on_command(links["w2"], rdata("w2", 3))
    await handler.drained()
    await handler.close()

    assert [(w, t) for w, t, _ in seen] == [("w2", 1), ("w2", 2), ("w2", 3)]
    assert seen[2][2] == [Row("w2-3", 3)]
    assert stream.positions == {"w1": 2, "w2": 3}


async def test_a_writers_rows_before_its_own_first_position_on_a_link_are_left_to_its_catch_up() -> None:
    stream, seen, handler = recording_handler("hub")
    links = {w: Link(f"link-{w}", w) for w in ("w1", "w2")}
    for link in links.values():
        handler.new_connection(link)
    handler.on_command(links["w1"], position("w1", 0, 0))
    handler.on_command(links["w2"], rdata("w2", 1))  # w2 has not announced itself on its link yet
    await handler.drained()
    await handler.close()

    assert seen == []
    assert "w2" not in stream.positions


@settings(max_examples=200, deadline=None)
@given(st.lists(st.sampled_from(["w1", "w2", "w3"]), max_size=40), st.data())
async def test_every_row_of_every_writer_is_delivered_once_in_order_whatever_the_others_announce(
    order: list[str], data: st.DataObject
) -> None:
    """Writers interleave rows, and idle writers announce POSITIONs carrying the others' IDs."""
    _stream, seen, handler = recording_handler("hub")
    writers = ("w1", "w2", "w3")
    links = {w: Link(f"link-{w}", w) for w in writers}
    for writer, link in links.items():
        handler.new_connection(link)
        handler.on_command(link, position(writer, 0, 0))
    await handler.drained()
    last = dict.fromkeys(writers, 0)
    expected: list[tuple[str, int]] = []
    for token, writer in enumerate(order, start=1):
        handler.on_command(links[writer], rdata(writer, token))
        last[writer] = token
        expected.append((writer, token))
        for idle in data.draw(st.sets(st.sampled_from([w for w in writers if w != writer]))):
            handler.on_command(links[idle], position(idle, last[idle], token))
            last[idle] = token
    await handler.drained()
    await handler.close()

    assert [(w, t) for w, t, _ in seen] == expected
