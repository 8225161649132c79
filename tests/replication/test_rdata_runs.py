"""The TCP reader's run path (many RDATA lines handled at once) behaves exactly like the per-line path."""

from __future__ import annotations

import asyncio
from typing import Any

import msgspec
from hypothesis import given, settings
from hypothesis import strategies as st

from factstream.replication import wire
from factstream.replication.handler import ReplicationHandler
from factstream.replication.stream import RowError
from factstream.replication.tcp import ConnectionSettings, TcpConnection
from factstream.replication.wire import decode_json


class Row(msgspec.Struct, frozen=True):
    key: str
    n: int


class _Stream:
    """The slice of ReplicatedStream the handler uses, with positions in memory (no database here)."""

    name = "s"
    _wire = msgspec.defstruct("RowWire", [("key", str), ("n", int)], array_like=True, frozen=True)

    def __init__(self) -> None:
        self.positions: dict[str, int] = {}

    def parse_row(self, raw: Any) -> Row:
        try:
            return Row(*msgspec.structs.astuple(msgspec.convert(raw, self._wire)))
        except msgspec.ValidationError as exc:
            raise RowError(str(exc)) from None

    def decode_rows(self, texts: list[bytes], _array: bytes) -> list[Row | None]:
        out: list[Row | None] = []
        for text in texts:
            try:
                out.append(self.parse_row(decode_json(text.decode())))
            except (RowError, ValueError):
                out.append(None)
        return out

    def current_token(self, instance: str) -> int:
        return self.positions.get(instance, 0)

    def advance(self, instance: str, token: int) -> None:
        if token > self.current_token(instance):  # a writer at 0 is not listed, as in the generator
            self.positions[instance] = token

    def can_discard_position(self, instance: str, token: int) -> bool:
        return token <= self.current_token(instance)

    def may_write(self, instance: str) -> bool:
        return True  # anyone writes this stream

    def position_allowed(self, token: int) -> bool:
        return True  # no sequence here

    async def get_updates_since(self, instance: str, low: int, high: int, limit: int) -> tuple[list, int, bool]:
        return [], high, False


class _Writer:
    def __init__(self) -> None:
        self.data = b""

    def write(self, data: bytes) -> None:
        self.data += data

    def can_write_eof(self) -> bool:
        return False

    def get_extra_info(self, _key: str) -> Any:
        return ("127.0.0.1", 1)


class RecordingSink:
    """A reader pipeline that records ``(writer, token, rows)`` for every token, as the host's would see it."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, int, list[Row]]] = []

    def rows(self, stream: Any, instance: str, token: int, rows: list[Row]) -> None:
        self.seen.append((instance, token, list(rows)))

    def run(self, stream: Any, instance: str, tokens: list[int], rows: list[Row]) -> None:
        self.seen.extend((instance, token, [row]) for token, row in zip(tokens, rows, strict=True))

    def advanced(self, stream: Any, instance: str, token: int) -> None:
        pass


def recording_handler(instance: str) -> tuple[_Stream, list[tuple[str, int, list[Row]]], ReplicationHandler]:
    """A handler for one in-memory stream ``s`` whose pipeline records ``(writer, token, rows)``."""
    stream = _Stream()
    sink = RecordingSink()
    handler = ReplicationHandler(instance, [stream], sink=sink)  # type: ignore[list-item]
    return stream, sink.seen, handler


async def follow(handler: ReplicationHandler, conn: Any, writer: str = "w0") -> None:
    """Make ``conn`` a link that follows stream ``s``, as a first POSITION does (rows before it are dropped)."""
    handler.on_command(conn, wire.PositionCommand("s", writer, 0, 0))
    await handler.drained()
    assert handler.following("s")


async def _deliver(lines: list[bytes], runs: bool) -> tuple[list[tuple[str, int, list[Row]]], dict[str, int], bytes]:
    stream, seen, handler = recording_handler("reader")
    writer = _Writer()
    conn = TcpConnection(
        None,  # type: ignore[arg-type]
        writer,  # type: ignore[arg-type]
        ConnectionSettings(local_name="reader", server_name="srv"),
        side="client",
        dispatch=handler.on_command,
        capacity=handler,
        dispatch_run=handler.on_rdata_run if runs else None,
    )
    handler.new_connection(conn)
    # Rows of a writer are accepted once a POSITION of that writer was processed on the link.
    writers = {line.split()[2].decode() for line in lines if line.startswith((b"RDATA ", b"POSITION "))}
    for name in sorted(writers | {"w0"}):
        await follow(handler, conn, name)
    for start in range(0, len(lines), 7):  # several chunks, so runs also end at chunk borders
        if not await conn._receive_lines(lines[start : start + 7]):
            break
        await asyncio.sleep(0)
    await handler.drained()
    await handler.close()
    return seen, stream.positions, writer.data


def _line(kind: str, instance: str, token: int, n: int) -> bytes:
    if kind == "row":
        return f'RDATA s {instance} {token} ["k{n}",{n}]'.encode()
    if kind == "batch":
        return f'RDATA s {instance} batch ["b{n}",{n}]'.encode()
    if kind == "crlf":
        return f'RDATA s {instance} {token} ["c{n}",{n}]\r'.encode()
    if kind == "badrow":
        return f'RDATA s {instance} {token} ["x", "not an int"]'.encode()
    if kind == "position":
        return f"POSITION s {instance} {token} {token}".encode()
    if kind == "spaced":
        return f'RDATA s {instance} {token} [ "k{n}" , {n} ]'.encode()
    return f"PING {n}".encode()


@given(
    st.lists(
        st.tuples(
            st.sampled_from(["row", "row", "row", "batch", "crlf", "badrow", "position", "spaced", "ping"]),
            st.sampled_from(["w1", "w2"]),
            st.integers(0, 3),
        ),
        max_size=40,
    )
)
@settings(max_examples=150, deadline=None)
def test_runs_deliver_the_same_rows_tokens_and_positions_as_single_lines(steps) -> None:
    tokens = {"w1": 0, "w2": 0}
    lines = []
    for n, (kind, instance, step) in enumerate(steps):
        tokens[instance] += step  # step 0 repeats a token: a duplicate the handler must drop
        lines.append(_line(kind, instance, tokens[instance], n))

    one_by_one = asyncio.run(_deliver(lines, runs=False))
    in_runs = asyncio.run(_deliver(lines, runs=True))

    assert in_runs == one_by_one


def test_a_bad_line_inside_a_run_is_refused_like_on_the_per_line_path() -> None:
    lines = [b'RDATA s w1 1 ["a",1]', b'RDATA s w1 2 ["a",2', b'RDATA s w1 3 ["a",3]']
    for runs in (False, True):
        seen, positions, sent = asyncio.run(_deliver(lines, runs=runs))
        assert [t for _, t, _ in seen] == [1]
        assert positions == {"w1": 1}
        assert sent.startswith(b"ERROR failed to parse line: RDATA")


def test_huge_or_negative_tokens_fall_back_to_the_codec() -> None:
    lines = [b'RDATA s w1 -4 ["a",1]', b'RDATA s w1 0005 ["a",5]', b"RDATA s w1 " + b"9" * 30 + b' ["a",6]']
    assert asyncio.run(_deliver(lines, runs=True)) == asyncio.run(_deliver(lines, runs=False))


@given(
    st.lists(
        st.tuples(st.sampled_from(["row"] * 8 + ["batch", "badrow", "spaced", "crlf", "ping"]), st.integers(0, 2)),
        max_size=60,
    )
)
@settings(max_examples=150, deadline=None)
def test_chunks_of_one_stream_and_writer_only_deliver_what_single_lines_do(steps) -> None:
    """Mostly uniform chunks (one writer, plain rows) take the one-pass path; anything odd falls back."""
    token = 0
    lines = []
    for n, (kind, step) in enumerate(steps):
        token += step
        lines.append(_line(kind, "w1", token, n))

    assert asyncio.run(_deliver(lines, runs=True)) == asyncio.run(_deliver(lines, runs=False))


def test_rows_that_are_not_one_json_value_each_are_refused_even_when_their_pieces_add_up() -> None:
    """Joined, these three rows read as three valid rows; alone, the first holds two values and the
    second and third are halves of one. The run path must refuse them as the per-line path does."""
    lines = [
        b'RDATA s w1 1 ["a",1]',
        b'RDATA s w1 2 ["b",2],["c",3]',
        b'RDATA s w1 3 ["d"',
        b"RDATA s w1 4 4]",
    ]
    for runs in (False, True):
        seen, positions, sent = asyncio.run(_deliver(lines, runs=runs))
        assert [t for _, t, _ in seen] == [1]
        assert positions == {"w1": 1}
        assert sent.startswith(b"ERROR failed to parse line: RDATA: row is not valid JSON"), (runs, sent)
