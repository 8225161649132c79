"""A trivial stream plugin: users write notes; each note is one fact on the ``notes`` stream."""

from __future__ import annotations

from collections.abc import Callable

import msgspec

import factstream
from factstream import MigrationSpec, RegisterStream, StreamSpec, StreamTable


class NoteRow(msgspec.Struct, frozen=True):
    """What replication sends for a note: who wrote it."""

    author: str


NOTES_STREAM = StreamSpec(
    name="notes",
    row_type=NoteRow,
    tables=(StreamTable("notes", "instance_name", "stream_id"),),
    sync_key="notes_key",
)


@factstream.hookimpl
def register_streams(register: RegisterStream) -> None:
    register(NOTES_STREAM)


@factstream.hookimpl
def register_migrations(register: Callable[[MigrationSpec], None]) -> None:
    register(MigrationSpec.from_package("factstream_notes.migrations"))
