"""Sending to-device messages and keeping the known devices.

A send runs in one transaction: it claims the ``(sender, txn_id)`` pair, expands ``"*"`` to the
recipient's known devices, appends one inbox row per (message, device) (one stream ID each, in the
order of the body) and stores the response. A retry with the same request finds the pair taken by an
equal request and gets the stored response without writing anything; a different request under the
same pair is refused (409). A concurrent retry waits on the first one's row lock, so both answers are
the same and the messages exist once.

Known devices: a device becomes known to ``"*"`` when it syncs the ``to_device`` stream (naming its
device ID) or when it is registered with ``PUT /devices/{device_id}``. A message to a device that is
not known yet is stored all the same; the device finds it when it first syncs.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable
from dataclasses import dataclass

from factstream import HostApi
from factstream_to_device.messages import ALL_DEVICES, Message
from factstream_to_device.rows import DEVICES_TABLE, STREAM, TXNS_TABLE, ToDeviceRow

_CLAIM = f"""
INSERT INTO {TXNS_TABLE} (sender, txn_id, request_hash, response, received_ts)
VALUES (%(sender)s, %(txn_id)s, %(hash)s, '', %(ts)s)
ON CONFLICT (sender, txn_id) DO NOTHING
RETURNING 1
"""
_EARLIER = f"SELECT request_hash, response FROM {TXNS_TABLE} WHERE sender = %(sender)s AND txn_id = %(txn_id)s"
_RESPOND = f"UPDATE {TXNS_TABLE} SET response = %(response)s WHERE sender = %(sender)s AND txn_id = %(txn_id)s"
_DEVICES_OF = f"SELECT user_id, device_id FROM {DEVICES_TABLE} WHERE user_id = ANY(%(users)s) ORDER BY device_id"
_REMEMBER = f"""
INSERT INTO {DEVICES_TABLE} (user_id, device_id, first_seen_ts) VALUES (%(user_id)s, %(device_id)s, %(ts)s)
ON CONFLICT (user_id, device_id) DO NOTHING
"""


class TxnConflict(Exception):
    """A transaction ID reused for a different request."""


@dataclass(frozen=True)
class SendResult:
    """The response body of a send, and whether this call wrote it (``False``: a retry)."""

    response: str
    stored: list[int]
    replayed: bool


def now_ms() -> int:
    return int(time.time() * 1000)


class ToDeviceStore:
    """To-device messages of one host process: ``host.state(ToDeviceStore)``."""

    def __init__(self, host: HostApi) -> None:
        self.host = host
        #: Devices this process has recorded as known (to skip the insert on every sync).
        self._known: set[tuple[str, str]] = set()

    async def send(
        self, sender: str, event_type: str, txn_id: str, request_hash: str, messages: Iterable[Message]
    ) -> SendResult:
        """Store the messages of one request once (see the module docstring); raises ``TxnConflict``."""
        writer = self.host.stream(STREAM, ToDeviceRow)
        key = {"sender": sender, "txn_id": txn_id}
        async with self.host.database().transaction() as txn:
            cur = await txn.execute(_CLAIM, {**key, "hash": request_hash, "ts": now_ms()})
            if not await cur.fetchall():
                cur = await txn.execute(_EARLIER, key)
                earlier_hash, response = (await cur.fetchall())[0]
                if earlier_hash != request_hash:
                    raise TxnConflict(f"transaction ID {txn_id!r} was already used by {sender} for a different request")
                return SendResult(str(response), [], replayed=True)
            messages = list(messages)
            wildcard = sorted({m.user_id for m in messages if m.device_id == ALL_DEVICES})
            known: dict[str, list[str]] = {}
            if wildcard:
                cur = await txn.execute(_DEVICES_OF, {"users": wildcard})
                for user_id, device_id in await cur.fetchall():
                    known.setdefault(str(user_id), []).append(str(device_id))
            ts = now_ms()
            recipients = [
                (m, device_id)
                for m in messages
                for device_id in (known.get(m.user_id, []) if m.device_id == ALL_DEVICES else [m.device_id])
            ]
            ids = await writer.append_many(
                txn,
                [ToDeviceRow(m.user_id) for m, _ in recipients],
                columns=[
                    {
                        "device_id": device_id,
                        "sender": sender,
                        "message_type": event_type,
                        "content": m.content,
                        "received_ts": ts,
                    }
                    for m, device_id in recipients
                ],
            )
            response = json.dumps({"stored": len(ids)})
            await txn.execute(_RESPOND, {**key, "response": response})
        return SendResult(response, ids, replayed=False)

    async def remember_device(self, user_id: str, device_id: str) -> None:
        """Make the device known to ``"*"`` sends (idempotent; once per process and device)."""
        if (user_id, device_id) in self._known:
            return
        async with self.host.database().autocommit() as conn:
            await conn.execute(_REMEMBER, {"user_id": user_id, "device_id": device_id, "ts": now_ms()})
        self._known.add((user_id, device_id))
