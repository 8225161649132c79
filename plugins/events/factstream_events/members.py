"""Who is joined where, for other plugins: ``host.state(Memberships)`` in any host process.

Receipts, typing and presence all decide who may see what from the events plugin's memberships. They
ask here, through a typed service, rather than reading ``current_state_events`` themselves:

* :meth:`Memberships.joined_rooms` and :meth:`Memberships.is_joined` read a user's current rooms through
  :meth:`Timeline.rooms_for_user <factstream_events.read.timeline.Timeline.rooms_for_user>`'s cache
  (joins only: an invite is not a membership that shows a room's ephemeral events);
* :meth:`Memberships.joined_members` is a cache of its own (:data:`JOINED_MEMBERS`, keyed by room),
  declared ``depends_on_room_state``: the events stream's ``state`` and ``state-all`` rows clear it
  through the core's room-state fan-out (``factstream_events.invalidations.on_rows``);
* :meth:`Memberships.users_sharing_a_room` is the union of the members of the user's joined rooms
  (the user included when joined anywhere), each room's members read through the cache above.

Every process applies the events stream's rows the same way, its own and replicated ones alike, so
the answers are the same on a worker as on the writer once both have reached the same position. Both
caches read the database, which may be a little ahead of this process's position in the events stream:
an answer may already reflect a membership change whose row is still on its way. It is never behind
for longer than that row takes to arrive, as the row then clears the entry.
"""

from __future__ import annotations

from factstream import Caches, HostApi, cached
from factstream_events.store import EventsStore

#: A room's joined members, ``frozenset`` of user IDs, by ``(room_id,)``.
JOINED_MEMBERS = "events_joined_members"

_JOINED = """
SELECT state_key FROM current_state_events
WHERE room_id = %(room_id)s AND type = 'm.room.member' AND membership = 'join'
"""


class Memberships:
    """The current joins of users and rooms (module docstring): ``host.state(Memberships)``."""

    def __init__(self, host: HostApi) -> None:
        self.host = host
        #: Where ``@cached`` finds its caches.
        self.caches: Caches = host.caches

    async def joined_rooms(self, user: str) -> frozenset[str]:
        """The rooms ``user`` is joined to at this process's position in the events stream (not those
        they are only invited to): what this process's ``/sync`` shows them joined to, so that a part
        another plugin adds to ``rooms.join`` never names a room the events part does not (yet, or
        any more). Read through the cache; from the history when the database is ahead of this
        process for the user's memberships, as the events plugin's own ``/sync`` does."""
        timeline = self.host.state(EventsStore).timeline
        mine = await timeline.rooms_for_user(user)
        upto = timeline.positions()
        if mine.newest_change > upto.minimum:
            return frozenset(await timeline.joined_at(user, upto))
        return frozenset(room.room_id for room in mine if room.membership == "join")

    async def is_joined(self, user: str, room_id: str) -> bool:
        """Whether ``user`` is joined to ``room_id`` now."""
        return room_id in await self.joined_rooms(user)

    @cached(name=JOINED_MEMBERS, max_size=10_000, depends_on_room_state=True)
    async def joined_members(self, room_id: str) -> frozenset[str]:
        """The users joined to ``room_id`` now (empty: an unknown room, or nobody left)."""
        rows = await self.host.database().fetchall(_JOINED, {"room_id": room_id})
        return frozenset(str(user) for (user,) in rows)

    async def users_sharing_a_room(self, user: str) -> frozenset[str]:
        """Every user joined to at least one room ``user`` is joined to, ``user`` included (empty when
        ``user`` is joined nowhere)."""
        shared: set[str] = set()
        for room_id in await self.joined_rooms(user):
            shared |= await self.joined_members(room_id)
        return frozenset(shared)
