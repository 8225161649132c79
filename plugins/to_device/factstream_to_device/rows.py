"""The ``to_device`` stream: its row type, tables and spec."""

from __future__ import annotations

import msgspec

from factstream import StreamTable

STREAM = "to_device"
#: One row per message per recipient device: the stream's facts.
INBOX_TABLE = "device_inbox"
TXNS_TABLE = "to_device_txns"
DEVICES_TABLE = "to_device_devices"
DELIVERED_TABLE = "device_inbox_delivered"
SEQUENCE = "device_inbox_sequence"
SYNC_KEY = "to_device_key"


class ToDeviceRow(msgspec.Struct, frozen=True):
    """One message as replication sends it: ``[entity]``, the recipient user (the reference's wire row).

    The message itself (device, sender, type, content) stays in the inbox table: a row only says
    whose inbox grew, which is what waking long polls needs.
    """

    entity: str


TABLES = (StreamTable(INBOX_TABLE, "instance_name", "stream_id"),)
