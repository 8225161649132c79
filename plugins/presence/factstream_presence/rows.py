"""The ``presence`` stream's row: exactly the reference's ``PresenceStreamRow``, and its table."""

from __future__ import annotations

import msgspec

from factstream import StreamTable

STREAM = "presence"
TABLE = "presence_stream"
SEQUENCE = "presence_stream_sequence"
#: The sync token's field (the reference's ``StreamToken.presence_key``).
SYNC_KEY = "presence_key"
#: The cache of a user's latest presence, keyed ``(user_id,)``.
USER_CACHE = "presence_of_user"
#: The states a user can be in (the reference's, without the experimental ``busy``).
STATES = ("online", "unavailable", "offline")


class PresenceRow(msgspec.Struct, frozen=True):
    """A user's presence after a change: ``[user_id, state, last_active_ts, last_federation_update_ts,
    last_user_sync_ts, status_msg, currently_active]`` on the wire, as the reference sends it (times in
    milliseconds since the epoch; ``status_msg`` null when there is none)."""

    user_id: str
    state: str
    last_active_ts: int
    last_federation_update_ts: int
    last_user_sync_ts: int
    status_msg: str | None
    currently_active: bool


TABLES = (StreamTable(TABLE, "instance_name", "stream_id"),)
