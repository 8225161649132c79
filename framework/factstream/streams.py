"""The Stream contract: what a plugin declares about one stream.

A stream is an append-only log of facts with integer stream IDs. The spec says where its rows live
(one or more backing tables, each with the column holding the stream ID and the column naming the
writer instance), which Postgres sequence hands out its IDs, whether IDs grow upwards (normal) or
downwards (a backfill stream: -1, -2, ...), who may write it, and the row type sent over replication
(a ``msgspec.Struct`` whose fields, in order, are the wire array).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import msgspec

from factstream.specs import check_name

WritersMode = Literal["configured", "any"]


@dataclass(frozen=True)
class StreamTable:
    """A backing table of a stream: ``id_column`` holds the stream ID, ``instance_column`` the writer."""

    table: str
    instance_column: str
    id_column: str

    def __post_init__(self) -> None:
        for what, value in (("table", self.table), ("column", self.instance_column), ("column", self.id_column)):
            check_name(what, value)


@dataclass(frozen=True)
class StreamSpec:
    """Everything the core needs to generate IDs for, replicate and export one stream.

    * ``name``: the replication stream name (``RDATA <name> ...``), unique across plugins.
    * ``row_type``: a ``msgspec.Struct``; its fields in declaration order form the wire array.
    * ``tables``: the backing tables (several for streams such as events).
    * ``sequence``: the Postgres sequence (default ``<name>_seq``); ``positions_key``: the key in
      ``stream_positions`` (default the name).
    * ``positive``: ``False`` for a backwards stream whose IDs are -1, -2, ...
    * ``writers``: ``"configured"`` (the instances listed under ``stream_writers`` in the config) or
      ``"any"`` (every instance writes its own facts and positions are not persisted).
    * ``sync_key``: the field of the sync token that follows this stream, if clients sync it.
    """

    name: str
    row_type: type[msgspec.Struct]
    tables: tuple[StreamTable, ...]
    sequence: str = ""
    positions_key: str = ""
    positive: bool = True
    writers: WritersMode = "configured"
    sync_key: str | None = None
    description: str = ""

    def __post_init__(self) -> None:
        check_name("stream", self.name)
        if not (isinstance(self.row_type, type) and issubclass(self.row_type, msgspec.Struct)):
            raise ValueError(f"stream {self.name!r}: row_type must be a msgspec.Struct subclass, not {self.row_type!r}")
        tables = tuple(self.tables)
        if not tables or not all(isinstance(t, StreamTable) for t in tables):
            raise ValueError(f"stream {self.name!r}: tables must be a non-empty sequence of StreamTable")
        object.__setattr__(self, "tables", tables)
        object.__setattr__(self, "sequence", check_name("sequence", self.sequence or f"{self.name}_seq"))
        object.__setattr__(self, "positions_key", check_name("positions key", self.positions_key or self.name))
        if self.writers not in ("configured", "any"):
            raise ValueError(f"stream {self.name!r}: writers must be 'configured' or 'any', not {self.writers!r}")
        if self.sync_key is not None:
            check_name("sync key", self.sync_key)

    @property
    def row_fields(self) -> tuple[str, ...]:
        """The row type's field names in wire order."""
        return tuple(self.row_type.__struct_fields__)
