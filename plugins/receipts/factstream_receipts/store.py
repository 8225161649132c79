"""Storing receipts and reading them back: ``host.state(ReceiptsStore)`` in any host process.

A receipt is the latest word of one user, in one room, of one receipt type, in one thread (or none):
the table keeps one row per such key. :meth:`ReceiptsStore.receive` (on a writer of the stream) runs
in one transaction:

1. take a transaction-scoped advisory lock on the key, so that two writers storing receipts of the
   same key one after the other see each other's row (the first insert of a key has no row to lock);
2. read the key's current row; when its event is at or after the new receipt's event in the events
   stream, stop: the receipt would move backwards (or stay), and the reference ignores it too;
3. delete the current row and append the new one: its stream ID comes from the stream's writer
   (``reserve``, which hands the row to this process's pipeline when the transaction commits) and the
   plugin inserts the row itself, because ``append`` cannot bind the ``data`` object to a ``jsonb``
   column. The new row gets a new stream ID, so readers that are behind see only the newest receipt of
   the key.

Reads go through :meth:`room_receipts` (every current receipt of a room, cached per room and dropped
by every new row of the room, on every process) for an initial ``/sync``, and :meth:`between` for an
incremental one.
"""

from __future__ import annotations

import time
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from typing import Any

from psycopg.types.json import Jsonb

from factstream import Caches, HostApi, cached
from factstream_receipts.rows import ROOM_RECEIPTS, STREAM, TABLE, ReceiptsRow

_LOCK = "SELECT pg_advisory_xact_lock(hashtextextended(%(key)s, 0))"
_CURRENT = f"""
SELECT stream_id, event_stream_ordering FROM {TABLE}
WHERE room_id = %(room_id)s AND receipt_type = %(receipt_type)s AND user_id = %(user_id)s
  AND COALESCE(thread_id, '') = COALESCE(%(thread_id)s::text, '')
"""
_DELETE = f"DELETE FROM {TABLE} WHERE stream_id = %(stream_id)s"
_INSERT = f"""
INSERT INTO {TABLE} (stream_id, instance_name, room_id, receipt_type, user_id, event_id, thread_id, data,
                     event_stream_ordering)
VALUES (%(stream_id)s, %(instance)s, %(room_id)s, %(receipt_type)s, %(user_id)s, %(event_id)s, %(thread_id)s,
        %(data)s, %(ordering)s)
"""
_COLUMNS = "stream_id, instance_name, room_id, receipt_type, user_id, event_id, thread_id, data"
_ROOM = f"SELECT {_COLUMNS} FROM {TABLE} WHERE room_id = %(room_id)s ORDER BY stream_id"
_BETWEEN = f"""
SELECT {_COLUMNS} FROM {TABLE} r
JOIN unnest(%(writers)s::text[], %(low)s::bigint[], %(high)s::bigint[]) AS w(writer, low, high)
  ON r.instance_name = w.writer AND r.stream_id > w.low AND r.stream_id <= w.high
WHERE r.room_id = ANY(%(rooms)s)
ORDER BY r.stream_id
"""


@dataclass(frozen=True, slots=True)
class Receipt:
    """One stored receipt: its row and where it is in the stream (``instance``, ``stream_id``)."""

    stream_id: int
    instance: str
    row: ReceiptsRow


def now_ms() -> int:
    return int(time.time() * 1000)


def _receipt(r: tuple[Any, ...]) -> Receipt:
    stream_id, instance, room_id, receipt_type, user_id, event_id, thread_id, data = r
    row = ReceiptsRow(str(room_id), str(receipt_type), str(user_id), str(event_id), thread_id, dict(data))
    return Receipt(int(stream_id), str(instance), row)


class ReceiptsStore:
    """Receipts of one host process (module docstring)."""

    def __init__(self, host: HostApi) -> None:
        self.host = host
        self.writer = host.stream(STREAM, ReceiptsRow)
        #: Where the ``@cached`` methods find their caches.
        self.caches: Caches = host.caches

    async def receive(self, row: ReceiptsRow, event_stream_ordering: int) -> int | None:
        """Store ``row`` unless the key's current receipt is for the same or a later event (module
        docstring); its stream ID, or None when nothing changed. Only on a writer of the stream."""
        key = {
            "room_id": row.room_id,
            "receipt_type": row.receipt_type,
            "user_id": row.user_id,
            "thread_id": row.thread_id,
        }
        lock = "\x1f".join((row.room_id, row.receipt_type, row.user_id, row.thread_id or ""))
        async with self.host.database().transaction() as txn:
            await txn.execute(_LOCK, {"key": lock})
            cur = await txn.execute(_CURRENT, key)
            current = await cur.fetchall()
            if current and int(current[0][1]) >= event_stream_ordering:
                return None
            if current:
                await txn.execute(_DELETE, {"stream_id": current[0][0]})
            (stream_id,) = await self.writer.reserve(txn, [row])
            await txn.execute(
                _INSERT,
                {
                    **key,
                    "stream_id": stream_id,
                    "instance": self.host.instance_name,
                    "event_id": row.event_id,
                    "data": Jsonb(row.data),
                    "ordering": event_stream_ordering,
                },
            )
            return stream_id

    @cached(name=ROOM_RECEIPTS, max_size=10_000)
    async def room_receipts(self, room_id: str) -> tuple[Receipt, ...]:
        """Every current receipt of ``room_id``, in stream order (shared: never change it)."""
        rows = await self.host.database().fetchall(_ROOM, {"room_id": room_id})
        return tuple(_receipt(r) for r in rows)

    async def between(self, rooms: Collection[str], since: Mapping[str, int], upto: Mapping[str, int]) -> list[Receipt]:
        """The current receipts of ``rooms`` whose stream IDs are in ``(since[w], upto[w]]`` for
        their writer ``w`` (a writer missing from ``since`` is at 0), in stream order."""
        writers = [w for w, high in upto.items() if high > since.get(w, 0)]
        if not rooms or not writers:
            return []
        params = {
            "writers": writers,
            "low": [since.get(w, 0) for w in writers],
            "high": [upto[w] for w in writers],
            "rooms": sorted(rooms),
        }
        return [_receipt(r) for r in await self.host.database().fetchall(_BETWEEN, params)]
