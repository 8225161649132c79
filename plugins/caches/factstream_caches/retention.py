"""Retention of the caches stream: delete rows old enough that no reader can still need them.

A reader needs rows of the caches stream only while it catches up, so rows older than the retention
age (7 days by default) go. One run deletes, among the rows whose stream IDs lie in the window of
``batch_ids`` IDs starting at the oldest row, those older than the cutoff: a bounded delete, however
far behind retention is. Rows are (nearly) in time order by stream ID, so when the oldest remaining
row is newer than the cutoff there is nothing more to do; otherwise the next run comes sooner.
"""

from __future__ import annotations

import asyncio
import logging
import time

from factstream import Database, HostApi
from factstream_caches.rows import TABLE

log = logging.getLogger(__name__)

#: Pause between runs while old rows remain, and before the first run (capped by the interval).
BUSY_INTERVAL_SECONDS = 60.0

_OLDEST = f"SELECT stream_id, invalidation_ts FROM {TABLE} ORDER BY stream_id LIMIT 1"
_DELETE = f"DELETE FROM {TABLE} WHERE stream_id < %(upper)s AND invalidation_ts < %(cutoff)s"


async def delete_old_invalidations(db: Database, *, older_than_ms: int, batch_ids: int) -> tuple[int, bool]:
    """Delete one batch of rows older than ``older_than_ms`` (epoch ms); returns (deleted, more_to_do)."""
    rows = await db.fetchall(_OLDEST)
    if not rows or int(rows[0][1]) >= older_than_ms:
        return 0, False
    upper = int(rows[0][0]) + batch_ids
    async with db.transaction() as txn:
        cur = await txn.execute(_DELETE, {"upper": upper, "cutoff": older_than_ms})
        deleted = max(cur.rowcount, 0)
    rows = await db.fetchall(_OLDEST)
    return deleted, bool(rows) and int(rows[0][1]) < older_than_ms


async def run_retention(host: HostApi) -> None:
    """Run retention forever on ``host`` (cancel to stop), with the timings of ``host.settings.caches``."""
    config = host.settings.caches
    busy = min(BUSY_INTERVAL_SECONDS, config.retention_interval_seconds)
    await asyncio.sleep(busy)
    while True:
        more = False
        try:
            cutoff = int((time.time() - config.retention_seconds) * 1000)
            deleted, more = await delete_old_invalidations(
                host.database(), older_than_ms=cutoff, batch_ids=config.retention_batch_ids
            )
            if deleted:
                log.info("caches retention deleted %d invalidation row(s)%s", deleted, "; more to do" if more else "")
        except asyncio.CancelledError:
            raise
        except Exception:
            log.warning("caches retention failed; retrying later", exc_info=True)
        await asyncio.sleep(busy if more else config.retention_interval_seconds)
