"""The write side of cross-process invalidation: rows of the caches stream, written inside a write.

The core does not know the plugin that provides the caches stream; it knows a contract. A stream
registered under the name ``caches`` (the bundled ``caches`` plugin registers it) must have a row
type with the fields ``cache_func`` (the cache's name), ``keys`` (one key's components as text, or
null for "the whole cache") and ``invalidation_ts`` (milliseconds since the epoch), in that order,
and its first backing table must have columns of those names next to its stream-ID and instance
columns. :class:`InvalidationStream` checks the contract at start-up and writes such rows; each row
is one fact with its own stream ID (the reference's layout, wire-compatible with it).

A change to a room's current state is sent as ``cs_cache_fake`` rows whose keys are
``[room_id, *members_changed]``, at most :data:`MEMBERS_PER_ROW` members a row (a row must fit a
replication line, and user IDs may be 255 characters long); with no member changed, one row
``[room_id]``.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from factstream.db.database import Transaction
from factstream.errors import PluginError
from factstream.idgen.generator import MultiWriterIdGenerator
from factstream.plugin.specs import CURRENT_STATE_CACHE_NAME
from factstream.plugin.streams import StreamSpec

#: The name the core looks for (see the module docstring).
CACHES_STREAM = "caches"
#: The caches stream's row fields, in wire order.
ROW_FIELDS = ("cache_func", "keys", "invalidation_ts")
#: Members of a room-state change per ``cs_cache_fake`` row.
MEMBERS_PER_ROW = 50
#: Rows per INSERT statement when one write sends many invalidations.
ROWS_PER_STATEMENT = 500

#: ``(cache_func, keys or None)``: what one row of the caches stream says.
Invalidation = tuple[str, list[str] | None]


def room_state_rows(room_id: str, members_changed: Sequence[str]) -> list[Invalidation]:
    """The ``cs_cache_fake`` rows announcing that ``room_id``'s current state changed."""
    if not members_changed:
        return [(CURRENT_STATE_CACHE_NAME, [room_id])]
    return [
        (CURRENT_STATE_CACHE_NAME, [room_id, *members_changed[i : i + MEMBERS_PER_ROW]])
        for i in range(0, len(members_changed), MEMBERS_PER_ROW)
    ]


def now_ms() -> int:
    return int(time.time() * 1000)


class InvalidationStream:
    """Writes rows of the caches stream through its ID generator (see the module docstring)."""

    def __init__(self, spec: StreamSpec[Any], id_gen: MultiWriterIdGenerator) -> None:
        if spec.row_fields != ROW_FIELDS:
            raise PluginError(
                f"stream {spec.name!r} must have the row fields {', '.join(ROW_FIELDS)} (in that order) to carry "
                f"cache invalidations; its row type {spec.row_type.__name__} has {', '.join(spec.row_fields) or 'none'}"
            )
        self.spec = spec
        self.id_gen = id_gen
        table = spec.tables[0]
        self.table = table.table
        columns = (table.id_column, table.instance_column, *ROW_FIELDS)
        self._insert_head = f"INSERT INTO {table.table} ({', '.join(columns)}) VALUES "

    @property
    def name(self) -> str:
        return self.spec.name

    async def write(self, txn: Transaction, rows: Sequence[Invalidation]) -> list[int]:
        """Write ``rows`` inside ``txn``, one stream ID each; returns the IDs (complete at commit)."""
        if not rows:
            return []
        ts = now_ms()
        if len(rows) == 1:
            cache_func, keys = rows[0]
            values = {"cache_func": cache_func, "keys": keys, "invalidation_ts": ts}
            return [await self.id_gen.append_txn(txn, self.table, values)]
        ids = await self.id_gen.get_next_mult_txn(txn, len(rows))
        instance = self.id_gen.instance_name
        for start in range(0, len(rows), ROWS_PER_STATEMENT):
            chunk = rows[start : start + ROWS_PER_STATEMENT]
            params: dict[str, Any] = {"instance": instance, "ts": ts}
            values_sql = []
            for i, (cache_func, keys) in enumerate(chunk):
                params[f"i{i}"] = ids[start + i]
                params[f"f{i}"] = cache_func
                params[f"k{i}"] = keys
                values_sql.append(f"(%(i{i})s, %(instance)s, %(f{i})s, %(k{i})s::text[], %(ts)s)")
            await txn.execute(self._insert_head + ", ".join(values_sql), params)
        return ids
