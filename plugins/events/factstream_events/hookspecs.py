"""The hooks the events plugin offers other plugins (registered with ``register_hookspecs``).

Both are ``firstresult``: implementations run in hook order and the first answer other than None is
used; the events plugin's own implementations run last (``trylast``) and are the defaults. Callers
pass the spec itself, ``await host.call_first(hookspecs.resolve_state, room_id=..., ...)``, so mypy
checks the arguments and the answer's type against the signatures below.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import factstream
from factstream_events.rules.policy import RoomFacts
from factstream_events.rules.statemath import State


@factstream.hookspec(firstresult=True)
def resolve_state(room_id: str, room_version: str, states: Sequence[State]) -> State | None:
    """The state before an event whose prev_events' states differ (and a room's current state when
    its forward extremities' states differ).

    ``states`` are ``type -> state_key -> event_id`` maps, in order of preference: the state after
    the deepest prev_event first (ties: the later stream ordering first). Return the resolved map (a
    coroutine may be returned and is awaited), or None to leave the decision to the next
    implementation. The default (``factstream_events.rules.statemath.default_resolve``) keeps every key of
    every state, the first state holding a key winning it.
    """


@factstream.hookspec(firstresult=True)
def check_local_event(room_id: str, event: Mapping[str, Any], state: State, facts: RoomFacts) -> bool | str | None:
    """Whether this server may create ``event`` (a local event, complete but for its hashes and ID).

    ``state`` is the room's state before the event (``type -> state_key -> event_id``), ``facts``
    a ``factstream_events.rules.policy.RoomFacts`` (creator, power levels, join rule, the memberships of the
    sender and the target). Return True to allow it, a sentence (str) to refuse it with that reason
    (403), or None to leave the decision to the next implementation. The default is
    ``factstream_events.rules.policy.check``.
    """
