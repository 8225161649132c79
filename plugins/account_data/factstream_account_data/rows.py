"""The ``account_data`` stream: its row type, tables and spec."""

from __future__ import annotations

import msgspec

from factstream import StreamTable

STREAM = "account_data"
#: The change log: one row per change, the stream's facts.
TABLE = "account_data_stream"
#: The latest value of each (user, room, type); room ``""`` holds global account data.
LATEST_TABLE = "account_data_latest"
SEQUENCE = "account_data_sequence"
SYNC_KEY = "account_data_key"
#: The cache of latest values, keyed ``(user_id, room_key, data_type)``.
CACHE = "account_data_latest"
#: ``room_key`` of global account data in the latest table and the cache (room IDs are never empty).
GLOBAL = ""


class AccountDataRow(msgspec.Struct, frozen=True):
    """One change as replication sends it: ``[user_id, room_id, data_type]`` (the reference's wire row).

    ``room_id`` is ``None`` for global account data. The content is not in the row: readers take the
    latest value from the database (through the cache this row invalidates).
    """

    user_id: str
    room_id: str | None
    data_type: str


TABLES = (StreamTable(TABLE, "instance_name", "stream_id"),)


def room_key(room_id: str | None) -> str:
    return GLOBAL if room_id is None else room_id


def cache_keys(row: AccountDataRow) -> list[tuple[str, str, str]]:
    """The cache keys a replicated change makes stale."""
    return [(row.user_id, room_key(row.room_id), row.data_type)]
