"""Sync tokens and the notifier: what a /sync endpoint needs to say "where a client is" and to wait.

* :mod:`factstream.sync.tokens`: ``MultiWriterStreamToken`` and ``RoomStreamToken`` (vector clocks
  of a stream with several writers) and ``TokenError``.
* :mod:`factstream.sync.instance_ids`: small integer instance IDs for the token string form.
* :mod:`factstream.sync.layout`: ``SyncKeyLayout``, the recorded, stable order of the token's fields.
* :mod:`factstream.sync.stream_token`: ``StreamToken`` (one field per sync key),
  ``current_token_source`` and ``bound_future_token``.
* :mod:`factstream.sync.notifier`: ``Notifier``, which wakes long-polling requests.
* :mod:`factstream.sync.wakeups`: ``WakeRouter`` and ``LocalTail``, which tell the notifier who a
  row concerns, for replicated rows and this process's own writes.
* :mod:`factstream.sync.service`: ``SyncService``, the ``/sync`` long poll the host serves.

The last two are the host's (not re-exported here, so importing the tokens never loads them).

See docs/sync.md for how a /sync handler puts these together.
"""

from factstream.sync.instance_ids import DatabaseInstanceIds, InstanceIds, MemoryInstanceIds
from factstream.sync.layout import SyncKey, SyncKeyKind, SyncKeyLayout, plan_layout, sync_keys_for_streams
from factstream.sync.notifier import Notifier, WaitCallback, WaitResult
from factstream.sync.stream_token import StreamToken, TokenValue, bound_future_token, current_token_source
from factstream.sync.tokens import MultiWriterStreamToken, PositionSource, RoomStreamToken, TokenError

__all__ = [
    "DatabaseInstanceIds",
    "InstanceIds",
    "MemoryInstanceIds",
    "MultiWriterStreamToken",
    "Notifier",
    "PositionSource",
    "RoomStreamToken",
    "StreamToken",
    "SyncKey",
    "SyncKeyKind",
    "SyncKeyLayout",
    "TokenError",
    "TokenValue",
    "WaitCallback",
    "WaitResult",
    "bound_future_token",
    "current_token_source",
    "plan_layout",
    "sync_keys_for_streams",
]
