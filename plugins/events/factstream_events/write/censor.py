"""The censor job: once a redaction is old enough, the stored JSON of its target becomes the pruned form.

Off unless ``plugins.events.censor_redactions_after_days`` is set. It runs on the instance that writes
the ``events`` stream (the main writer when there are several), first a minute after start-up and then
every :data:`INTERVAL_SECONDS`, in batches of :data:`BATCH` redactions, each batch one transaction:

* a redaction counts once its ``received_ts`` is older than the retention, it is not censored yet, and
  its target is held; it censors only if it is the one its target names in ``events.redacted_by`` (a
  redaction of another room's event, of the create event, or a second redaction censors nothing and
  is marked done); one whose target never arrived is not looked at until the target arrives;
* a pruned form that canonical JSON cannot hold (numbers of room versions 1-5) keeps the stored JSON,
  with a warning;
* the target's ``event_json`` is replaced with the canonical JSON of the pruned event (the room
  version's rules, :mod:`factstream_events.rules.prune`); reads already pruned it, so what users see does
  not change; a server reading the raw bytes (``?raw=true``) gets the pruned form from then on;
* the redaction is marked ``censored``, so it is never considered again.

Nothing else changes: the event keeps its row, its stream ordering, its place in the graph and its
state; only its content is gone for good.
"""

from __future__ import annotations

import asyncio
import logging
import time

from factstream import HostApi
from factstream_events.rules.canonical import CanonicalJsonError, canonical_json, parse_event_json
from factstream_events.rules.prune import prune_event
from factstream_events.shared.rows import STREAM, EventsRow
from factstream_events.shared.settings import EventsSettings

log = logging.getLogger(__name__)

INTERVAL_SECONDS = 300.0
FIRST_RUN_SECONDS = 60.0
BATCH = 500

_DUE = """
SELECT r.event_id, r.redacts, e.room_id, e.redacted_by, j.json, rm.room_version
FROM redactions r
JOIN events e ON e.event_id = r.redacts
JOIN event_json j ON j.event_id = r.redacts
JOIN rooms rm ON rm.room_id = e.room_id
WHERE NOT r.censored AND r.received_ts <= %(before)s
ORDER BY r.received_ts, r.event_id
LIMIT %(n)s
FOR UPDATE OF r SKIP LOCKED
"""
_SET_JSON = "UPDATE event_json SET json = %(json)s WHERE event_id = %(event_id)s"
_DONE = "UPDATE redactions SET censored = TRUE WHERE event_id = ANY(%(ids)s)"


async def censor_once(host: HostApi, *, now_ms: int | None = None) -> int:
    """One pass over every due redaction; the number of events censored. Does nothing when the
    setting is unset."""
    days = host.plugin_settings(EventsSettings).censor_redactions_after_days
    if days is None:
        return 0
    now = int(time.time() * 1000) if now_ms is None else now_ms
    before = now - int(days * 86_400_000)
    censored = 0
    while True:
        async with host.database().transaction() as txn:
            cur = await txn.execute(_DUE, {"before": before, "n": BATCH})
            due = await cur.fetchall()
            done: list[str] = []
            for redaction, target, _, redacted_by, raw, version in due:
                done.append(str(redaction))
                if redacted_by != redaction:
                    continue  # this redaction did not redact it (another room, the create event, a first one)
                pruned = prune_event(parse_event_json(bytes(raw)), str(version))
                try:
                    text = canonical_json(pruned)
                except CanonicalJsonError as exc:  # numbers of an old room version canonical JSON cannot hold
                    log.warning("censor: event %s keeps its stored JSON: its pruned form %s", target, exc)
                    continue
                await txn.execute(_SET_JSON, {"json": text, "event_id": target})
                censored += 1
            if done:
                await txn.execute(_DONE, {"ids": done})
        if len(due) < BATCH:
            return censored


async def censor_forever(host: HostApi) -> None:
    """The background job (module docstring); cancelled when the host stops."""
    await asyncio.sleep(FIRST_RUN_SECONDS)
    while True:
        try:
            count = await censor_once(host)
            if count:
                log.info("censored the stored JSON of %d redacted events", count)
        except Exception:
            log.exception("the censor job failed; it runs again in %.0f s", INTERVAL_SECONDS)
        await asyncio.sleep(INTERVAL_SECONDS)


def start(host: HostApi) -> None:
    """Start the job on this instance if the setting is set and it is the first writer of ``events``."""
    if host.plugin_settings(EventsSettings).censor_redactions_after_days is None:
        return
    stream = host.stream(STREAM, EventsRow)
    writers = stream.writers
    if not stream.is_writer or (writers and writers[0] != host.instance_name):
        return
    host.spawn(censor_forever(host), name="events censor job")
