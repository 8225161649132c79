"""The reader's per-row fast paths do exactly what the general paths do.

* ``uniform_run`` (one regular-expression split of a chunk) accepts and splits exactly the lines the
  line-by-line pattern accepted;
* ``ReplicatedStream.decode_rows`` reads rows as tuples of the field types where it can, with the same
  rows (or ``None``) as the wire type;
* the pipeline's run stage (``StreamHandlers.run``) makes the same rows handler calls, in the same
  order, with the same logged failures, as ``StreamHandlers.deliver`` token by token.
"""

from __future__ import annotations

import asyncio
import logging
import re
from types import SimpleNamespace
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from factstream import StreamSpec, StreamTable
from factstream.plugin.rows import StreamHandlers
from factstream.replication.stream import ReplicatedStream
from factstream.replication.wire import json_array, uniform_run

# -- uniform_run ---------------------------------------------------------------------------------------


def _reference_run(lines: list[bytes], max_line: int) -> tuple[str, str, list[int | None], list[bytes]] | None:
    """What ``uniform_run`` accepted before it split the chunk in one pass: a match per line."""
    if not lines or lines[0][:6] != b"RDATA ":
        return None
    head = lines[0].split(b" ", 3)
    if len(head) != 4:
        return None
    prefix = b" ".join(head[:3]) + b" "
    data = b"\n".join(lines)
    if b"\r" in data or max(map(len, lines)) > max_line:
        return None
    found = re.compile(b"^" + re.escape(prefix) + rb"(batch|\d{1,18}) (.*)$", re.M).findall(data)
    try:
        stream, instance = head[1].decode(), head[2].decode()
    except UnicodeDecodeError:
        return None
    if len(found) != len(lines):
        return None
    words, texts = zip(*found, strict=True)
    if json_array(texts, None) is None:
        return None
    return stream, instance, [None if w == b"batch" else int(w) for w in words], list(texts)


_LINE = st.tuples(
    st.sampled_from([b"RDATA s w1 "] * 6 + [b"RDATA s w2 ", b"RDATA t w1 ", b"RDATA s w1", b"XRDATA s w1 ", b""]),
    st.sampled_from([b"1", b"17", b"2", b"3"] * 3 + [b"0042", b"batch", b"x", b"9" * 19, b"-3", b""]),
    st.sampled_from([b" "] * 8 + [b"  ", b"", b" 5 "]),
    st.sampled_from(
        [b'["a",1]', b"[2]", b'"s p a c e"'] * 4
        + [b"[1", b"2]", b"3,4", b'"RDATA s w1 5 [1]"', b" [1]", b"[1] ", b"\r", b"\xff", b"", b"[" * 40]
    ),
).map(b"".join)


#: Mostly lines of one clean run, so that whole runs are accepted and a stray line must break them.
_GOOD = st.builds(
    lambda token, row: b"RDATA s w1 %d %s" % (token, row), st.integers(0, 99), st.sampled_from([b"[1]", b'"a b"'])
)


@given(st.lists(st.one_of(_GOOD, _GOOD, _GOOD, _GOOD, _GOOD, _GOOD, _LINE), min_size=1, max_size=12))
@settings(max_examples=500, deadline=None)
def test_uniform_run_accepts_and_splits_exactly_what_a_match_per_line_did(lines: list[bytes]) -> None:
    run = uniform_run(lines, 40)
    expected = _reference_run(lines, 40)
    if expected is None:
        assert run is None
    else:
        assert run is not None
        assert (run.stream_name, run.instance_name, run.tokens, list(run.texts)) == expected
        assert run.array == b"[" + b",".join(expected[3]) + b"]"
        assert run.lines == lines


@pytest.mark.parametrize(
    "lines",
    [
        [b'RDATA s w1 1 ["a",1]', b'RDATA s w1 2 ["b",2]'],
        [b'RDATA s w1 batch ["a",1]', b'RDATA s w1 2 ["b",2]'],
        [b"RDATA s w1 5", b'RDATA s w1 6 7 ["b",2]'],  # no row on one line, two "tokens" on the next
        [b'RDATA s w1 x ["RDATA s w1 5 [1]"]', b'RDATA s w1 2 ["b",2]'],  # the prefix inside a row
        [b'RDATA s w1 1 ["a",1]', b'XRDATA s w1 2 ["b",2]'],
        [b'RDATA s w1 1 ["a",1]', b'RDATA s w2 2 ["b",2]'],
    ],
)
def test_uniform_run_on_lines_that_must_not_shift(lines: list[bytes]) -> None:
    run = uniform_run(lines, 1024)
    expected = _reference_run(lines, 1024)
    assert (None if run is None else (run.stream_name, run.instance_name, run.tokens, list(run.texts))) == expected


# -- decode_rows ---------------------------------------------------------------------------------------


class Plain(msgspec.Struct, frozen=True):
    key: str
    n: int
    tags: list[str]


class WithDefault(msgspec.Struct, frozen=True):
    key: str
    n: int = 0


class Inner(msgspec.Struct, frozen=True):
    a: int


class Nested(msgspec.Struct, frozen=True):
    inner: Inner
    maybe: int | None


def _stream(row_type: type) -> ReplicatedStream:
    spec = StreamSpec(name="s", row_type=row_type, tables=(StreamTable("s", "instance_name", "stream_id"),))
    id_gen = SimpleNamespace(instance_name="r", is_writer=False, reserved_before_start=0, writers=(), capture=None)
    return ReplicatedStream(spec, id_gen, None)  # type: ignore[arg-type]


def _by_wire_type(stream: ReplicatedStream, texts: list[bytes]) -> list[Any]:
    """What ``decode_rows`` gave before it read tuples: the wire type, else row by row."""
    try:
        wires = msgspec.json.Decoder(list[stream._wire_type]).decode(b"[" + b",".join(texts) + b"]")  # type: ignore[name-defined]
    except msgspec.DecodeError:
        return [stream._row_from_text(text) for text in texts]
    return [stream.spec.row_type(*msgspec.structs.astuple(w)) for w in wires]


_ROWS = {
    Plain: [b'["a",1,["x"]]', b'["b",2,[]]', b'["c",3,["x"],"extra"]', b'["d","4",[]]', b'["e",5]', b"{}"],
    WithDefault: [b'["a",1]', b'["b"]', b'["c",3,4]', b"[1]"],
    Nested: [b'[{"a":1},null]', b'[{"a":1},2]', b'[{"a":"x"},2]', b'[{"a":1}]', b"[[1],2]"],
}


@pytest.mark.parametrize("row_type", list(_ROWS))
@given(data=st.data())
@settings(max_examples=60, deadline=None)
def test_decode_rows_gives_the_rows_the_wire_type_gives(row_type: type, data: st.DataObject) -> None:
    stream = _stream(row_type)
    texts = data.draw(st.lists(st.sampled_from(_ROWS[row_type]), min_size=1, max_size=6))
    rows = stream.decode_rows(texts, b"[" + b",".join(texts) + b"]")
    assert rows == _by_wire_type(stream, texts)
    assert all(row is None or type(row) is row_type for row in rows)


# -- the run stage -------------------------------------------------------------------------------------


def _handler(name: str, kind: str, calls: list[tuple[Any, ...]], failing: int | None) -> Any:
    """A rows handler that records its calls (sync or async), raising at token ``failing``."""

    def record(host: Any, instance: str, token: int, rows: list[Any], local: bool) -> None:
        calls.append((name, "start", host, instance, token, list(rows), local))
        if token == failing:
            raise RuntimeError(f"{name} at {token}")

    if kind == "sync":
        return record

    async def later(host: Any, instance: str, token: int, rows: list[Any], local: bool) -> None:
        calls.append((name, "await", token))
        await asyncio.sleep(0)
        record(host, instance, token, rows, local)

    return later


async def _run_both(specs: list[tuple[str, int | None]], tokens: list[int], caplog: Any) -> None:
    def handlers(calls: list[tuple[Any, ...]]) -> StreamHandlers:
        return StreamHandlers(
            "host", "s", [(f"p{i}", _handler(f"p{i}", kind, calls, failing)) for i, (kind, failing) in enumerate(specs)]
        )

    rows = [f"row{t}" for t in tokens]
    expected: list[tuple[Any, ...]] = []
    caplog.clear()
    reference = handlers(expected)
    for token, row in zip(tokens, rows, strict=True):
        waiting = reference.deliver("w", token, [row], True)
        if waiting is not None:
            await waiting
    expected_errors = [r.getMessage() for r in caplog.records]

    got: list[tuple[Any, ...]] = []
    caplog.clear()
    waiting = handlers(got).run("w", tokens, rows, True)
    if all(kind == "sync" for kind, _ in specs):
        assert waiting is None  # synchronous handlers: no coroutine at all
    elif waiting is not None:
        await waiting
    assert got == expected
    assert [r.getMessage() for r in caplog.records] == expected_errors


@given(
    specs=st.lists(
        st.tuples(st.sampled_from(["sync", "sync", "async"]), st.sampled_from([None, 2, 3])),
        min_size=1,
        max_size=3,
    ),
    count=st.integers(0, 5),
)
@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_the_run_stage_makes_the_calls_deliver_makes_token_by_token(specs, count, caplog) -> None:
    with caplog.at_level(logging.ERROR, logger="factstream.plugin.manager"):
        asyncio.run(_run_both(specs, list(range(1, count + 1)), caplog))
