"""What a Redis subscriber does with one read's messages: its own echoes dropped wherever they are,
everyone else's lines delivered in order, whether the read is one writer's run or a mix."""

from __future__ import annotations

import asyncio

from factstream.config import load_config
from factstream.replication.auth import ReplicationSecret
from factstream.replication.redis import RedisLink, RedisTransport
from tests.replication.test_rdata_runs import Row, follow, recording_handler


def _message(line: str) -> list[bytes]:
    return [b"message", b"d", line.encode()]


async def test_own_echoes_are_dropped_and_every_other_line_is_delivered_in_order():
    stream, seen, handler = recording_handler("me")
    settings = load_config(environ={}, deployment="d", instance_name="me", redis={"url": "redis://127.0.0.1:1/0"})
    transport = RedisTransport(settings, handler)
    link = RedisLink(transport, 1)
    handler.new_connection(link)
    for writer in ("w1", "w2"):  # a writer's rows are accepted once its POSITION was processed
        await follow(handler, link, writer)

    reads = [
        # A writer's usual read: nothing but its own echoes.
        ['RDATA s me 1 ["mine",1]', 'RDATA s me 2 ["mine",2]', "POSITION s me 0 2"],
        # A reader's usual read: one other writer's run.
        ['RDATA s w1 1 ["a",1]', 'RDATA s w1 batch ["b",2]', 'RDATA s w1 2 ["c",3]'],
        # Mixed, starting with an echo.
        ['RDATA s me 3 ["mine",3]', 'RDATA s w1 3 ["d",4]'],
        # Mixed, the echo in the middle, and another writer after it.
        ['RDATA s w1 4 ["e",5]', 'RDATA s me 4 ["mine",4]', 'RDATA s w1 5 ["f",6]', 'RDATA s w2 1 ["g",7]'],
    ]
    for read in reads:
        transport._dispatch(link, [_message(line) for line in read])
        await asyncio.sleep(0)
    await handler.drained()
    await handler.close()

    assert seen == [
        ("w1", 1, [Row("a", 1)]),
        ("w1", 2, [Row("b", 2), Row("c", 3)]),
        ("w1", 3, [Row("d", 4)]),
        ("w1", 4, [Row("e", 5)]),
        ("w1", 5, [Row("f", 6)]),
        ("w2", 1, [Row("g", 7)]),
    ]
    assert stream.positions == {"w1": 5, "w2": 1}


async def test_with_a_secret_only_lines_under_their_signers_name_are_delivered():
    stream, seen, handler = recording_handler("me")
    secret = {"secret": "sixteen+ characters"}
    settings = load_config(
        environ={},
        deployment="d",
        instance_name="me",
        redis={"url": "redis://127.0.0.1:1/0"},
        replication=secret,
    )
    transport = RedisTransport(settings, handler)
    link = RedisLink(transport, 1)
    handler.new_connection(link)
    for writer in ("w1", "w2"):  # a writer's rows are accepted once its POSITION was processed
        await follow(handler, link, writer)
    signing = ReplicationSecret(secret["secret"], "d")

    def signed(signer: bytes, *lines: str) -> list[bytes]:
        return [b"message", b"d", signing.sign("\n".join(lines).encode(), signer)]

    reads = [
        # One signer, a run under its own name: delivered.
        [signed(b"w1", 'RDATA s w1 1 ["a",1]', 'RDATA s w1 2 ["b",2]')],
        # One signer, a run under another writer's name: dropped, however uniform.
        [signed(b"w1", 'RDATA s w2 1 ["x",1]', 'RDATA s w2 2 ["x",2]')],
        # Several signers in one read, each message mixing its own lines with another's.
        [
            signed(b"w2", 'RDATA s w2 1 ["c",3]', 'RDATA s w1 3 ["x",3]'),
            signed(b"w1", 'RDATA s w1 3 ["d",4]', "POSITION s w2 0 9"),
        ],
        # Unsigned, and signed with another secret: dropped.
        [[b"message", b"d", b'RDATA s w1 4 ["x",5]']],
        [[b"message", b"d", ReplicationSecret("another secret here", "d").sign(b'RDATA s w1 4 ["x",5]', b"w1")]],
    ]
    for read in reads:
        transport._dispatch(link, read)
        await asyncio.sleep(0)
    await handler.drained()
    await handler.close()

    assert seen == [
        ("w1", 1, [Row("a", 1)]),
        ("w1", 2, [Row("b", 2)]),
        ("w2", 1, [Row("c", 3)]),
        ("w1", 3, [Row("d", 4)]),
    ]
    assert stream.positions == {"w1": 3, "w2": 1}
    assert transport.unsigned == 6  # two lines of the uniform run, two misattributed lines, two messages
