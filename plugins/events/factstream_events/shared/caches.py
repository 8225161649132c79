"""The plugin's caches of facts that never change once stored, registered like every other cache.

Each is declared here (``IMMUTABLE_CACHES``, registered by the plugin's ``register_caches``) and
taken from ``host.caches`` by the reads and the store, so it is one of the process's named caches:
listed in ``host.caches``, counted on ``/metrics`` (hits, misses, evictions, size) and sized in one
place. No ``InvalidationSpec`` names them: what they hold is never rewritten (a stored event's
content, type and state group stay as they are; a room's version is fixed at its creation), so there
is nothing to invalidate, only entries to evict when a cache is full.
"""

from __future__ import annotations

from factstream import CacheSpec

#: A room's version, by ``(room_id,)``.
ROOM_VERSIONS = "events_room_versions"
#: The membership a member event sets, by ``(event_id,)``.
MEMBER_EVENT_MEMBERSHIP = "events_member_event_membership"
#: The state event a state event replaced (None: none), by ``(event_id,)``.
REPLACES_STATE = "events_replaces_state"
#: A user's member event in a state group (None: none), by ``(state_group, user_id)``.
MEMBER_AT_GROUP = "events_member_at_group"
#: The content of a state event, by ``(event_id,)``.
STATE_CONTENTS = "events_state_contents"
#: The creator a create event names, ``(creator or None,)``, by the create event's ``(event_id,)``.
ROOM_CREATORS = "events_room_creators"

#: An event's client format less ``unsigned`` (``served.ClientBody``), by ``(event_id,)``: kept only for
#: events not redacted (a redacted event is served pruned, never from here), so the stored bytes it is
#: made of never change while it is held.
CLIENT_BODIES = "events_client_bodies"

#: Entries each cache holds at most, per process.
SIZE = 100_000

IMMUTABLE_CACHES = (
    CacheSpec(ROOM_VERSIONS, max_size=SIZE),
    CacheSpec(MEMBER_EVENT_MEMBERSHIP, max_size=SIZE),
    CacheSpec(REPLACES_STATE, max_size=SIZE),
    CacheSpec(MEMBER_AT_GROUP, max_size=SIZE, key_arity=2, key_types=(int, str)),
    CacheSpec(STATE_CONTENTS, max_size=SIZE),
    CacheSpec(ROOM_CREATORS, max_size=SIZE),
    CacheSpec(CLIENT_BODIES, max_size=SIZE // 2),
)
