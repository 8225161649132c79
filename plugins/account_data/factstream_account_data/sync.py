"""``/sync`` for account data: the types a user's data changed in since the token, with their content.

For the range of the request (per writer: after ``since``, up to ``upto``) the change log says which
(room, type) pairs of the user changed; each is returned once, with the *latest* content from the
latest table. Returning the latest value rather than the value as of the change matters with several
writers: a change from a slow writer may reach the client after a newer change from another writer,
and the client must not end up holding the older value. A value newer than ``upto`` may therefore be
returned early; the client receives it again with its own change, which is harmless.

Items are ordered by the stream ID of the newest change of each pair, so the first ``limit`` items
cover a prefix of every writer's changes.
"""

from __future__ import annotations

from typing import Any

import msgspec

from factstream import SyncRequest
from factstream_account_data.rows import LATEST_TABLE, TABLE

_CHANGED = f"""
WITH changed AS (
    SELECT DISTINCT ON (s.room_id, s.data_type) s.stream_id, s.instance_name, s.room_id, s.data_type
    FROM {TABLE} s
    JOIN unnest(%(writers)s::text[], %(low)s::bigint[], %(high)s::bigint[]) AS r(writer, low, high)
      ON s.instance_name = r.writer AND s.stream_id > r.low AND s.stream_id <= r.high
    WHERE s.user_id = %(user_id)s AND s.stream_id > %(min_low)s AND s.stream_id <= %(max_high)s
    ORDER BY s.room_id, s.data_type, s.stream_id DESC
)
SELECT c.stream_id, c.instance_name, c.room_id, c.data_type, l.content
FROM changed c
JOIN {LATEST_TABLE} l
  ON l.user_id = %(user_id)s AND l.room_id = coalesce(c.room_id, '') AND l.data_type = c.data_type
ORDER BY c.stream_id
LIMIT %(limit)s
"""


async def sync_account_data(request: SyncRequest) -> list[dict[str, Any]]:
    """The items of one user's ``/sync`` (see the module docstring).

    Each item is ``{"stream_id", "instance", "room_id" (null for global data), "type", "content"}``;
    ``content`` is the stored JSON object, embedded unchanged (``msgspec.Raw``).
    """
    writers = [w for w, high in request.upto.items() if high > request.since.get(w, 0)]
    if not writers or request.limit < 1:
        return []
    low = [request.since.get(w, 0) for w in writers]
    high = [request.upto[w] for w in writers]
    rows = await request.host.database().fetchall(
        _CHANGED,
        {
            "writers": writers,
            "low": low,
            "high": high,
            "min_low": min(low),
            "max_high": max(high),
            "user_id": request.user,
            "limit": request.limit,
        },
    )
    return [
        {
            "stream_id": int(stream_id),
            "instance": instance,
            "room_id": room_id,
            "type": data_type,
            "content": msgspec.Raw(content.encode("utf-8")),
        }
        for stream_id, instance, room_id, data_type, content in rows
    ]
