"""The bundled ``typing`` stream plugin: who is typing in which room, kept in the writer's memory.

* Stream ``typing``, kept (``StreamSpec(kept=True)``: no table, no sequence, no export): its writer
  (``stream_writers.typing``, one instance, ``main`` by default) holds each room's typing users and
  their deadlines (``factstream_typing.state``); each change is one row, the reference's
  ``TypingStreamRow`` ``[room_id, user_ids]``. Readers catch up by asking the writer, and forget what
  it said when it restarts (``reset``).
* ``/sync``: ``rooms.join.<room>.ephemeral.events`` gets ``m.typing`` for the user's joined rooms
  (``factstream_typing.sync``), beside the events plugin's rooms; a change wakes the room's members.
* Routes ``PUT /rooms/{room_id}/typing/{user_id}`` and ``GET /rooms/{room_id}/typing``.
* Needs the ``events`` plugin: who is joined to a room.
* Settings ``plugins.typing`` (``default_timeout_ms``, ``max_timeout_ms``).

See docs/plugins/typing.md.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import factstream
from factstream import (
    ConfigError,
    HostApi,
    RegisterRowsHandler,
    RegisterStream,
    RequirementSpec,
    RouteSpec,
    RowsHandlerSpec,
    SettingsSpec,
    StreamSpec,
    Wake,
)
from factstream_typing.routes import ROUTES
from factstream_typing.rows import STREAM, SYNC_KEY, TypingRow
from factstream_typing.settings import TypingSettings
from factstream_typing.state import TypingView, TypingWriter
from factstream_typing.sync import sync_typing, watch_key

__all__ = ["TYPING_STREAM", "TypingRow", "TypingSettings", "TypingView", "TypingWriter"]


def _wake(row: TypingRow) -> Wake:
    return Wake(rooms=(watch_key(row.room_id),))


TYPING_STREAM = StreamSpec(
    name=STREAM,
    row_type=TypingRow,
    tables=(),
    kept=True,
    writers="configured",
    sync_key=SYNC_KEY,
    sync_section="rooms",
    sync_rows=sync_typing,
    wake=_wake,
    description="typing notifications: each room's typing users, kept in the writer's memory",
)


def on_rows(host: HostApi, instance: str, position: int, rows: Sequence[TypingRow], local: bool) -> None:
    """Another process's view follows the writer's rows (the writer's view is its state)."""
    if not local:
        view = host.state(TypingView)
        for row in rows:
            view.apply(position, row)


def on_reset(host: HostApi, writer: str, epoch: int) -> None:
    """The writer started a new run: what it said before is gone."""
    host.state(TypingView).reset(epoch)


@factstream.hookimpl
def register_streams(register: RegisterStream) -> None:
    register(TYPING_STREAM)


@factstream.hookimpl
def register_rows_handlers(register: RegisterRowsHandler) -> None:
    register(RowsHandlerSpec(stream=TYPING_STREAM, handler=on_rows, reset=on_reset))


@factstream.hookimpl
def register_requirements(register: Callable[[RequirementSpec], None]) -> None:
    register(RequirementSpec("events", "typing notifications go to a room's joined members"))


@factstream.hookimpl
def register_settings(register: Callable[[SettingsSpec], None]) -> None:
    register(SettingsSpec(model=TypingSettings))


@factstream.hookimpl
def register_routes(register: Callable[[RouteSpec], None]) -> None:
    for route in ROUTES:
        register(route)


@factstream.hookimpl
def startup(host: HostApi) -> None:
    """On the writer: the typing state, its keeper, and the task that stops users whose time is up."""
    writers = host.settings.writers_for(STREAM)
    if len(writers) != 1:
        raise ConfigError(f"stream_writers.typing: typing has one writer, not {len(writers)} ({', '.join(writers)})")
    if host.writes(STREAM):
        host.spawn(host.state(TypingWriter).run(), name="typing-deadlines")
