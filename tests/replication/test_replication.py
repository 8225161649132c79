"""Replication between real hosts (in one event loop) over TCP and Redis."""

from __future__ import annotations

import asyncio

import pytest

from factstream.host.app import Host
from factstream.testing import RecordedRow, until


async def append_notes(host: Host, n: int, author: str = "ada") -> list[int]:
    gen = host.id_generator("notes")
    ids = []
    for i in range(n):
        async with host.database().transaction() as txn:
            ids.append(await gen.append_txn(txn, "notes", {"author": f"{author}{i}", "body": "x"}))
    return ids


def received(name: str) -> list[RecordedRow]:
    """The rows host ``name`` received, for the tests of this folder that do not take ``row_recorder``
    themselves: ``notes_db`` installs it for every ``host_cluster`` test (its plugin module is loaded)."""
    import factstream_row_recorder  # type: ignore[import-not-found]

    rows: list[RecordedRow] = factstream_row_recorder.recorder.rows(name)
    return rows


@pytest.fixture(params=["tcp", "redis"])
def transport(request):
    if request.param == "redis":
        request.getfixturevalue("redis_url")  # skipped (or failed) here when Redis is not usable
    return request.param


async def test_worker_receives_every_fact_in_order(host_cluster, transport, row_recorder):
    host_cluster.configure(transport=transport)
    main = await host_cluster("main")
    worker = await host_cluster("worker1")
    await worker.handler.wait_for_stream_position("main", "notes", 1, timeout=5)
    await host_cluster.following(worker, "notes")

    ids = await append_notes(main, 50)

    await until(lambda: len(row_recorder.rows("worker1")) == 50)
    got = row_recorder.rows("worker1")
    assert [r.token for r in got] == ids
    assert [r.row.author for r in got] == [f"ada{i}" for i in range(50)]
    assert {(r.stream, r.writer) for r in got} == {("notes", "main")}
    assert await worker.wait_for_stream_position("main", "notes", ids[-1], timeout=5)
    assert worker.id_generator("notes").get_current_token() == ids[-1]


GARBAGE = [
    (b"\x00\xff\xfe binary \x80\n", "ERROR failed to parse line"),
    (b"FROBNICATE now\n", "ERROR failed to parse line: unknown command 'FROBNICATE'"),
    (b"PING " + b"x" * (1024 * 1024) + b"\n", "ERROR Line length exceeded"),
    (b'RDATA nosuchstream main 5 ["x"]\n', "ERROR unknown stream 'nosuchstream'"),
    (b'RDATA notes worker2 5 ["x"\n', "ERROR failed to parse line: RDATA"),
    (b"SERVER impostor\n", "ERROR invalid command: SERVER"),
]


@pytest.mark.parametrize(("garbage", "error"), GARBAGE, ids=[e for _, e in GARBAGE])
async def test_garbage_on_the_tcp_port_gets_an_error_and_a_closed_connection(
    host_cluster, garbage, error, row_recorder
):
    main = await host_cluster("main")
    worker = await host_cluster("worker1")
    await host_cluster.following(worker, "notes")
    port = main.transport.endpoint.port

    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    writer.write(b"NAME vandal\n")
    writer.write(garbage)
    await writer.drain()
    lines = []
    while line := await asyncio.wait_for(reader.readline(), 5):
        lines.append(line.decode(errors="replace"))
    writer.close()

    assert lines[0].startswith("SERVER test")
    assert lines[-1].startswith(error), lines[-1]
    # Everyone else is still served, and nothing was lost.
    ids = await append_notes(main, 20)
    await until(lambda: [r.token for r in row_recorder.rows("worker1")] == ids)
