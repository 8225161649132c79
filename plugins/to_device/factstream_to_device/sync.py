"""``/sync`` for to-device messages: a device's pending messages, deleted only once acknowledged.

A device's inbox holds the messages it has not acknowledged. Each time the host asks the stream for
``(user, device)``, in one transaction:

1. **acknowledge**: per writer ``W``, delete the messages at or below ``min(since[W], delivered[W])``
   where ``delivered[W]`` is the highest stream ID of ``W`` that an earlier response carried to this
   device. Holding a token past a message is not enough to delete it: the message must also have
   been sent. So a response cut short by ``limit``, or a token moved by a ``/sync`` that named no
   device, never causes a message to be deleted unseen;
2. **deliver** the oldest pending messages up to ``upto`` (per writer), at most ``limit`` of them,
   in stream order, and record the highest stream ID sent per writer.

When the host asks. On every ``/sync``, before it waits, the host asks the stream once with the empty
range ``since == upto ==`` the client's token (``SyncService.acknowledge``), even when nothing is new:
that is where a token acknowledges, and where messages at or below the token that were never sent (the
token moved while the client synced without ``device``) are delivered at once. Then, as for every
stream, whenever the user's stream moved: with ``since`` the greater of the client's token and the
point an earlier, empty answer of the same request reached. Acknowledging up to that point deletes
nothing more than the client's token does: that earlier answer found nothing pending up to it.

Without ``since`` (the reference's initial sync) the token is 0 everywhere: nothing is acknowledged and
every message still in the inbox comes again, from the oldest. A message is gone only after a ``/sync``
whose token is at or past it.

Pending messages are not filtered by ``since``: whatever is still in the inbox has not been
acknowledged. A response that is lost costs nothing: the client syncs again with its older token,
nothing more is deleted, and the same messages come again. Messages of one writer are delivered in
its stream order, and the first ``limit`` are a prefix of every writer's pending messages.

Cost: only positions above where the device's inbox is known to be empty
(:class:`~factstream_to_device.empty_inboxes.EmptyInboxes`) are asked about. So the call at the
client's token needs no query once that is known (an idle device's long poll costs nothing), a
delete that could find nothing is not sent, and a new range costs one read.
"""

from __future__ import annotations

from typing import Any

import msgspec

from factstream import SyncRequest
from factstream_to_device.empty_inboxes import EmptyInboxes
from factstream_to_device.rows import DELIVERED_TABLE, INBOX_TABLE
from factstream_to_device.store import ToDeviceStore

_DELIVERED = f"""
SELECT instance_name, stream_id FROM {DELIVERED_TABLE} WHERE user_id = %(user_id)s AND device_id = %(device_id)s
"""
_ACKNOWLEDGE = f"""
DELETE FROM {INBOX_TABLE} AS d
USING unnest(%(writers)s::text[], %(upto)s::bigint[]) AS a(writer, upto)
WHERE d.entity = %(user_id)s AND d.device_id = %(device_id)s
  AND d.instance_name = a.writer AND d.stream_id <= a.upto
"""
_PENDING = f"""
SELECT d.stream_id, d.instance_name, d.sender, d.message_type, d.content
FROM {INBOX_TABLE} d
JOIN unnest(%(writers)s::text[], %(high)s::bigint[]) AS r(writer, high)
  ON d.instance_name = r.writer AND d.stream_id <= r.high
WHERE d.entity = %(user_id)s AND d.device_id = %(device_id)s
ORDER BY d.stream_id
LIMIT %(limit)s
"""
_RECORD = f"""
INSERT INTO {DELIVERED_TABLE} AS x (user_id, device_id, instance_name, stream_id)
SELECT %(user_id)s, %(device_id)s, s.writer, s.sent
FROM unnest(%(writers)s::text[], %(sent)s::bigint[]) AS s(writer, sent)
ON CONFLICT (user_id, device_id, instance_name) DO UPDATE SET stream_id = GREATEST(x.stream_id, EXCLUDED.stream_id)
"""


async def sync_to_device(request: SyncRequest) -> list[dict[str, object]]:
    """The items of one device's ``/sync`` (see the module docstring); nothing without a device.

    Each item is ``{"stream_id", "instance", "type", "sender", "content"}`` with the content embedded
    unchanged (``msgspec.Raw``).
    """
    device_id = request.device
    if not device_id or request.limit < 1:
        return []
    host = request.host
    user_id = request.user
    await host.state(ToDeviceStore).remember_device(user_id, device_id)
    inboxes = host.state(EmptyInboxes)
    clear = inboxes.clear_upto(user_id, device_id)
    # Only positions above what is known to be empty can hold anything to delete or to deliver.
    since = {w: p for w, p in request.since.items() if p > clear.get(w, 0)}
    upto = {w: p for w, p in request.upto.items() if p > clear.get(w, 0)}
    if not since and not upto:
        return []
    who = {"user_id": user_id, "device_id": device_id}
    acks: dict[str, int] = {}
    rows: list[Any] = []
    async with host.database().transaction() as txn:
        if since:
            cur = await txn.execute(_DELIVERED, who)
            delivered = {str(w): int(s) for w, s in await cur.fetchall()}
            acks = {w: min(since[w], delivered[w]) for w in since if w in delivered}
            acks = {w: ack for w, ack in acks.items() if ack > clear.get(w, 0)}
            if acks:
                await txn.execute(_ACKNOWLEDGE, {**who, "writers": list(acks), "upto": list(acks.values())})
        if upto:
            cur = await txn.execute(
                _PENDING, {**who, "writers": list(upto), "high": list(upto.values()), "limit": request.limit}
            )
            rows = await cur.fetchall()
        sent: dict[str, int] = {}
        for stream_id, instance, *_ in rows:
            sent[str(instance)] = max(sent.get(str(instance), 0), int(stream_id))
        if sent:
            await txn.execute(_RECORD, {**who, "writers": list(sent), "sent": list(sent.values())})
    # Committed: nothing is left at or below an acknowledged position, nor, unless the page was
    # full, at or below ``upto`` of a writer that had nothing pending.
    cleared = dict(acks)
    if len(rows) < request.limit:
        for w, high in upto.items():
            if w not in sent:
                cleared[w] = max(cleared.get(w, 0), high)
    inboxes.cleared(user_id, device_id, cleared)
    return [
        {
            "stream_id": int(stream_id),
            "instance": str(instance),
            "type": str(message_type),
            "sender": str(sender),
            "content": msgspec.Raw(str(content).encode("utf-8")),
        }
        for stream_id, instance, sender, message_type, content in rows
    ]
