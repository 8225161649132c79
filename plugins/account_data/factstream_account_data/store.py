"""Reading and writing account data: one change is one fact plus an upsert of the latest value.

A write runs in one transaction: it appends the change to the stream's table (which reserves its
stream ID), then upserts the latest value of that (user, room, type) only if the stored value is
older in stream order. So with several writers the latest table holds the value of the highest
stream ID whatever order the transactions commit in, and a rolled-back write leaves neither.

Reads go through the ``account_data_latest`` cache. The writing process forgets the key after its
commit; every other process forgets it when the change's row is replicated (the plugin's
``InvalidationSpec``), before the stream's position there moves past the change.
"""

from __future__ import annotations

import weakref
from typing import Any

from factstream import cached
from factstream_account_data.rows import CACHE, LATEST_TABLE, STREAM, TABLE, room_key

_UPSERT_LATEST = f"""
INSERT INTO {LATEST_TABLE} AS l (user_id, room_id, data_type, stream_id, instance_name, content)
VALUES (%(user_id)s, %(room_key)s, %(data_type)s, %(stream_id)s, %(instance)s, %(content)s)
ON CONFLICT (user_id, room_id, data_type) DO UPDATE
SET stream_id = EXCLUDED.stream_id, instance_name = EXCLUDED.instance_name, content = EXCLUDED.content
WHERE l.stream_id < EXCLUDED.stream_id
"""

_SELECT_LATEST = f"""
SELECT content FROM {LATEST_TABLE} WHERE user_id = %(user_id)s AND room_id = %(room_key)s AND data_type = %(data_type)s
"""

_stores: weakref.WeakKeyDictionary[Any, AccountDataStore] = weakref.WeakKeyDictionary()


class AccountDataStore:
    """Account data of one host process (``AccountDataStore.of(host)``)."""

    def __init__(self, host: Any) -> None:
        self.host = host
        self.caches = host.caches

    @classmethod
    def of(cls, host: Any) -> AccountDataStore:
        store = _stores.get(host)
        if store is None or store.caches is not host.caches:
            store = _stores[host] = cls(host)
        return store

    @cached(name=CACHE, max_size=50_000)
    async def get_content(self, user_id: str, room: str, data_type: str) -> str | None:
        """The latest content (JSON text as sent) of a type; ``room`` is ``""`` for global data."""
        rows = await self.host.database().fetchall(
            _SELECT_LATEST, {"user_id": user_id, "room_key": room, "data_type": data_type}
        )
        return str(rows[0][0]) if rows else None

    async def put(self, user_id: str, room_id: str | None, data_type: str, content: str) -> int:
        """Store ``content`` (a JSON object's text) as the new value; returns the change's stream ID.

        Only a configured writer of the stream may call this (the ID generator refuses otherwise).
        """
        gen = self.host.id_generator(STREAM)
        key = (user_id, room_key(room_id), data_type)
        async with self.host.database().transaction() as txn:
            stream_id = await gen.append_txn(
                txn, TABLE, {"user_id": user_id, "room_id": room_id, "data_type": data_type}
            )
            await txn.execute(
                _UPSERT_LATEST,
                {
                    "user_id": user_id,
                    "room_key": key[1],
                    "data_type": data_type,
                    "stream_id": stream_id,
                    "instance": gen.instance_name,
                    "content": content,
                },
            )
            txn.after_commit(lambda: self.caches.invalidate_local(CACHE, key))
        return int(stream_id)
