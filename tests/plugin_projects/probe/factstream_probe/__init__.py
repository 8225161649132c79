"""A probe for process-level tests: writes notes on command and records the rows a process receives.

It registers nothing; it drives the ``notes`` stream of the ``notes`` test plugin, which must be
installed next to it. Everything is controlled through environment variables, so a test can run it
inside real ``factstream run`` processes:

``FACTSTREAM_PROBE_CONTROL=PATH``
    The writer polls this file (every 20 ms) for commands, one JSON object a line:
    ``{"id": "w1", "count": 600, "rate": 0, "batch": 1, "author_bytes": 0}``. It writes ``count``
    notes in transactions of ``batch`` notes through the stream's writer (``append`` for one,
    ``append_many`` for more),
    at most ``rate`` notes a second (0: as fast as it can), each with the author
    ``<instance>/<id>/<n>`` (padded with ``.`` to ``author_bytes`` characters). Commands run one at a
    time, in file order. When one ends, a line is appended to the acknowledgement file
    ``PATH.ack``: ``{"id", "status", "written", "first", "last"}`` with ``status`` ``done``,
    ``cancelled`` (the process stopped in the middle) or ``failed`` (with ``error``); a line with
    ``status`` ``started`` comes first. A command with any acknowledgement (even only ``started``: the
    process was killed) is not run again after a restart.
``FACTSTREAM_PROBE_WRITE=COUNT[:RATE[:BATCH]]``
    One such command, run at every start-up (acknowledged as id ``env`` when there is an ack file).
``FACTSTREAM_PROBE_ACK=PATH``
    Where acknowledgements go (default ``$FACTSTREAM_PROBE_CONTROL.ack``).
``FACTSTREAM_PROBE_RECORD=PATH``
    Its rows handler, registered for every stream, appends one JSON line per received row:
    ``{"stream", "instance", "token", "author", "local"}`` (``local``: a row this process wrote
    itself), flushed after each call.
``FACTSTREAM_PROBE_SLOW_MS=MS``
    The rows handler sleeps (``asyncio.sleep``) this long per call: a slow reader.
``FACTSTREAM_PROBE_SLOW_FILE=PATH``
    Overrides ``FACTSTREAM_PROBE_SLOW_MS`` with the number in this file while it exists (re-read at
    most every 0.1 s), so a test can make a reader slow and fast again at run time.
``FACTSTREAM_PROBE_READY=PATH``
    ``startup`` appends ``{"event": "started", "instance", "pid"}`` once the host is up, and
    ``shutdown`` appends ``{"event": "stopped", ...}``.
``FACTSTREAM_PROBE_DUMP=PATH``
    On ``SIGUSR1``, append the stack of every asyncio task to this file (to see where a process that
    does not stop is stuck).

These are environment variables rather than plugin settings on purpose: the tests set them per
process, and the probe takes no configuration section (a host config names no ``plugins.probe``).
The writer runs as a task of the host's (``host.spawn``), cancelled when the host stops.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TextIO

import msgspec

import factstream
from factstream import HostApi, RegisterRowsHandler, RowsHandler, RowsHandlerSpec, StreamSpec

log = logging.getLogger(__name__)

POLL_SECONDS = 0.02
SLOW_FILE_CHECK_SECONDS = 0.1
#: The notes table's column besides the row's fields.
BODY = {"body": "probe"}


class _State:
    def __init__(self) -> None:
        self.record: TextIO | None = None
        self.slow_ms = 0.0
        self.slow_checked = 0.0


_state = _State()


def _append_json(path: str | os.PathLike[str], obj: dict[str, Any]) -> None:
    with open(path, "a", encoding="utf-8") as f:
        f.write(json.dumps(obj) + "\n")
        f.flush()


def _ack_path() -> str | None:
    explicit = os.environ.get("FACTSTREAM_PROBE_ACK")
    if explicit:
        return explicit
    control = os.environ.get("FACTSTREAM_PROBE_CONTROL")
    return f"{control}.ack" if control else None


def _read_json_lines(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        return []
    out = []
    for line in text.splitlines():
        # A line the test is still writing has no newline yet: ``splitlines`` keeps it, json rejects it.
        with contextlib.suppress(ValueError):
            out.append(json.loads(line))
    return out


# -- writing -------------------------------------------------------------------------------------------


async def _run_command(host: HostApi, command: dict[str, Any], ack: str | None) -> None:
    from factstream_notes import NoteRow  # the notes plugin is installed next to the probe

    cid = str(command.get("id", "?"))
    count = int(command.get("count", 0))
    rate = float(command.get("rate", 0) or 0)
    batch = max(1, int(command.get("batch", 1) or 1))
    author_bytes = int(command.get("author_bytes", 0) or 0)
    writer = host.stream("notes", NoteRow)
    written = 0
    first: int | None = None
    last: int | None = None
    status = "done"
    error = None
    if ack:
        _append_json(ack, {"id": cid, "status": "started"})
    start = time.monotonic()
    try:
        while written < count:
            if rate > 0:
                delay = start + written / rate - time.monotonic()
                if delay > 0:
                    await asyncio.sleep(delay)
            n = min(batch, count - written)
            rows = [
                NoteRow(f"{host.instance_name}/{cid}/{i}".ljust(author_bytes, ".")) for i in range(written, written + n)
            ]
            async with host.database().transaction() as txn:
                if n == 1:
                    ids = [await writer.append(txn, rows[0], columns=BODY)]
                else:
                    ids = await writer.append_many(txn, rows, columns=[BODY] * n)
            written += n
            first = ids[0] if first is None else first
            last = ids[-1]
    except asyncio.CancelledError:
        status = "cancelled"
        raise
    except Exception as exc:
        status = "failed"
        error = f"{type(exc).__name__}: {exc}"
        log.exception("probe command %s failed", cid)
    finally:
        if ack:
            entry: dict[str, Any] = {"id": cid, "status": status, "written": written, "first": first, "last": last}
            if error:
                entry["error"] = error
            _append_json(ack, entry)


async def _writer(host: HostApi) -> None:
    ack = _ack_path()
    fixed = os.environ.get("FACTSTREAM_PROBE_WRITE")
    if fixed:
        parts = [*fixed.split(":"), "0", "1"]
        await _run_command(host, {"id": "env", "count": parts[0], "rate": parts[1], "batch": parts[2]}, ack)
    control = os.environ.get("FACTSTREAM_PROBE_CONTROL")
    if not control:
        return
    done = {str(a.get("id")) for a in _read_json_lines(ack)} if ack else set()
    while True:
        for command in _read_json_lines(control):
            cid = str(command.get("id"))
            if cid in done:
                continue
            done.add(cid)
            await _run_command(host, command, ack)
        await asyncio.sleep(POLL_SECONDS)


# -- hooks ---------------------------------------------------------------------------------------------


def _dump_tasks(path: str) -> None:
    with open(path, "a", encoding="utf-8") as f:
        f.write(f"===== asyncio tasks of pid {os.getpid()} at {time.strftime('%H:%M:%S')} =====\n")
        for task in asyncio.all_tasks():
            f.write(f"--- {task!r}\n")
            task.print_stack(file=f)


@factstream.hookimpl
def startup(host: HostApi) -> None:
    if os.environ.get("FACTSTREAM_PROBE_WRITE") or os.environ.get("FACTSTREAM_PROBE_CONTROL"):
        host.spawn(_writer(host), name="probe-writer")
    dump = os.environ.get("FACTSTREAM_PROBE_DUMP")
    if dump:
        asyncio.get_running_loop().add_signal_handler(signal.SIGUSR1, _dump_tasks, dump)
    _record_file()
    ready = os.environ.get("FACTSTREAM_PROBE_READY")
    if ready:
        _append_json(ready, {"event": "started", "instance": host.instance_name, "pid": os.getpid()})


@factstream.hookimpl
def shutdown(host: HostApi) -> None:
    # The writer task, if any, was cancelled by the host before this hook runs.
    if _state.record is not None:
        _state.record.close()
        _state.record = None
    ready = os.environ.get("FACTSTREAM_PROBE_READY")
    if ready:
        _append_json(ready, {"event": "stopped", "instance": host.instance_name, "pid": os.getpid()})


def _record_file() -> TextIO | None:
    """The record file, opened once (in ``startup``, or by the first rows handled if they come first)."""
    path = os.environ.get("FACTSTREAM_PROBE_RECORD")
    if path and _state.record is None:
        _state.record = open(path, "a", encoding="utf-8")  # noqa: SIM115 - kept open, closed at shutdown
    return _state.record


def _slow_seconds() -> float:
    now = time.monotonic()
    if now - _state.slow_checked >= SLOW_FILE_CHECK_SECONDS:
        _state.slow_checked = now
        ms = float(os.environ.get("FACTSTREAM_PROBE_SLOW_MS") or 0)
        path = os.environ.get("FACTSTREAM_PROBE_SLOW_FILE")
        if path:
            with contextlib.suppress(OSError, ValueError):
                ms = float(Path(path).read_text().strip())
        _state.slow_ms = ms
    return _state.slow_ms / 1000


def _recorder(stream: str) -> RowsHandler[msgspec.Struct]:
    """The handler of ``stream``'s rows: records them (``FACTSTREAM_PROBE_RECORD``), then sleeps if slow."""

    async def record_rows(
        host: HostApi, instance: str, token: int, rows: Sequence[msgspec.Struct], local: bool
    ) -> None:
        record = _record_file()
        if record is not None:
            lines = [
                json.dumps(
                    {
                        "stream": stream,
                        "instance": instance,
                        "token": token,
                        "author": getattr(r, "author", None),
                        "local": local,
                    }
                )
                for r in rows
            ]
            record.write("\n".join(lines) + "\n")
            record.flush()
        slow = _slow_seconds()
        if slow > 0:
            await asyncio.sleep(slow)

    return record_rows


@factstream.hookimpl
def register_rows_handlers(register: RegisterRowsHandler, streams: Sequence[StreamSpec[msgspec.Struct]]) -> None:
    """Every stream's rows reach the probe (a generic handler: any row type is a ``msgspec.Struct``)."""
    for spec in streams:
        register(RowsHandlerSpec(stream=spec, handler=_recorder(spec.name)))
