"""The ``typing`` stream's row: exactly the reference's ``TypingStreamRow``, ``[room_id, user_ids]``."""

from __future__ import annotations

import msgspec

STREAM = "typing"
#: The sync token's field (the reference's ``StreamToken.typing_key``).
SYNC_KEY = "typing_key"


class TypingRow(msgspec.Struct, frozen=True):
    """A room's typing users after a change: the whole list, not the change (``[]``: nobody types).

    On the wire ``RDATA typing <writer> <position> ["!room:hs",["@alice:hs"]]``, as the reference sends it.
    """

    room_id: str
    user_ids: list[str]
