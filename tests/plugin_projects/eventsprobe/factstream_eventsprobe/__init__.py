"""A test plugin for the events stream in real processes, controlled by environment variables.

``FACTSTREAM_EVENTSPROBE_RECORD=PATH``
    Its rows handler, registered for the ``events`` and ``backfill`` streams, appends one JSON line per
    row another process wrote: ``{"stream", "instance", "token", "row"}`` (``row``: the wire array,
    ``[kind, data]`` for ``events``), flushed after each call.
``FACTSTREAM_EVENTSPROBE_LOCAL=1``
    Record this process's own committed rows too (``"local": true`` in their lines).
``FACTSTREAM_EVENTSPROBE_DROP=PATH``
    While this file exists, its ``resolve_state`` resolves as the default does, then drops every key
    of the state type named in the file (a merge that removes state keys).
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import msgspec
from factstream_events import BACKFILL_STREAM_SPEC, EVENTS_STREAM_SPEC
from factstream_events.rules.statemath import State, default_resolve

import factstream
from factstream import HostApi, RegisterRowsHandler, RowsHandlerSpec


def record(host: HostApi, instance: str, token: int, rows: Sequence[Any], local: bool) -> None:
    path = os.environ.get("FACTSTREAM_EVENTSPROBE_RECORD")
    if not path or (local and not os.environ.get("FACTSTREAM_EVENTSPROBE_LOCAL")):
        return
    stream = "backfill" if rows and not hasattr(rows[0], "kind") else "events"
    with open(path, "a", encoding="utf-8") as f:
        for row in rows:
            wire = list(msgspec.to_builtins(row).values())
            line = {"stream": stream, "instance": instance, "token": token, "row": wire, "local": local}
            f.write(json.dumps(line) + "\n")
        f.flush()


@factstream.hookimpl
def register_rows_handlers(register: RegisterRowsHandler) -> None:
    register(RowsHandlerSpec(stream=EVENTS_STREAM_SPEC, handler=record))
    register(RowsHandlerSpec(stream=BACKFILL_STREAM_SPEC, handler=record))


@factstream.hookimpl(defined_by="events")
def resolve_state(room_id: str, room_version: str, states: Sequence[State]) -> State | None:
    path = os.environ.get("FACTSTREAM_EVENTSPROBE_DROP")
    if not path or not Path(path).exists():
        return None
    dropped = Path(path).read_text().strip()
    return {t: dict(keys) for t, keys in default_resolve(states).items() if t != dropped}
