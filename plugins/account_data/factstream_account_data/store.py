"""Reading and writing account data: one change is one fact plus an upsert of the latest value.

A write runs in one transaction: it appends the change to the stream (its writer reserves the stream
ID in the insert), then upserts the latest value of that (user, room, type) only if the stored value
is older in stream order. So with several writers the latest table holds the value of the highest
stream ID whatever order the transactions commit in, and a rolled-back write leaves neither.

Reads go through the ``account_data_latest`` cache. The plugin's ``InvalidationSpec`` on the stream
forgets the key in every process: in the writing one when the transaction ends (the host's pipeline
for its own writes), in every other one when the change's row is replicated, before the stream's
position there moves past the change.
"""

from __future__ import annotations

from factstream import Caches, HostApi, cached
from factstream_account_data.rows import CACHE, LATEST_TABLE, STREAM, AccountDataRow, room_key

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


class AccountDataStore:
    """Account data of one host process: ``host.state(AccountDataStore)``."""

    def __init__(self, host: HostApi) -> None:
        self.host = host
        #: Where ``@cached`` finds its cache.
        self.caches: Caches = host.caches

    @cached(name=CACHE, max_size=50_000)
    async def get_content(self, user_id: str, room: str, data_type: str) -> str | None:
        """The latest content (JSON text as sent) of a type; ``room`` is ``""`` for global data."""
        rows = await self.host.database().fetchall(
            _SELECT_LATEST, {"user_id": user_id, "room_key": room, "data_type": data_type}
        )
        return str(rows[0][0]) if rows else None

    async def put(self, user_id: str, room_id: str | None, data_type: str, content: str) -> int:
        """Store ``content`` (a JSON object's text) as the new value; returns the change's stream ID.

        Only a configured writer of the stream may call this (the stream's writer refuses otherwise).
        """
        writer = self.host.stream(STREAM, AccountDataRow)
        async with self.host.database().transaction() as txn:
            stream_id = await writer.append(txn, AccountDataRow(user_id, room_id, data_type))
            await txn.execute(
                _UPSERT_LATEST,
                {
                    "user_id": user_id,
                    "room_key": room_key(room_id),
                    "data_type": data_type,
                    "stream_id": stream_id,
                    "instance": self.host.instance_name,
                    "content": content,
                },
            )
        return stream_id
