"""History visibility: which room events a user may read, decided without touching the database.

The rules are those of docs/plugins/events.md, "Who sees what" (numbered as there), applied as the
reference server (Synapse) applies them when it filters events for a client. Two things differ from
the reference in *when* the work is done, not in the answers:

* The reference loads, for every event it filters, the state at that event (the history-visibility
  event and the user's member event). Here the store computes an event's *effective history
  visibility* once, when it stores the event (:func:`stored_visibility`, which already applies rule 3),
  and keeps it with the event; at read time it only has to find the user's membership at each event.
* The decision itself (:func:`check_event`, :func:`filter_events`) is a pure function of small facts
  (:class:`EventFacts`), so every rule can be tested on its own, without a room.

The rules, as numbered there and in the docstrings below:

1. ``m.room.dummy`` and ``m.room.aliases`` events are never shown to clients; non-state events whose
   sender the user ignores are dropped.
2. Outliers (events held without their state) are hidden, except the user's own membership events
   (an out-of-band invite and its rejection).
3. An ``m.room.history_visibility`` event is judged by the less restrictive of the visibility before
   it and the one it sets, so a change is visible from both sides of it.
4. The user's membership at an event comes from the state after the event; for the user's own member
   event it is the "more joined" of the new and previous membership, and a leave that follows a join
   or an invite is always visible to its user.
5. A user joined at the event sees it. Otherwise: ``world_readable`` shows it; ``shared`` shows it
   unless the user is peeking; ``invited`` shows it iff the user was invited at the event;
   ``joined`` hides it.
6. Every event returned carries the user's membership at it (``unsigned.membership``).

What this module does not decide: whether the user may read the room at all (the reference answers
``/messages`` with 403 to a user who was invited but never joined, or is banned), and where a departed
user's history ends. Under ``shared`` visibility the rules above show a user who left the room the
events sent after their leave too; the reference hides those by clamping the ``/messages`` range to the
user's leave event before it filters, and so must our reader.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Final, Literal, Protocol, TypeGuard

__all__ = [
    "HISTORY_VISIBILITY_EVENT_TYPE",
    "MEMBERSHIP_PRIORITY",
    "VISIBILITY_PRIORITY",
    "EventFacts",
    "EventLike",
    "HistoryVisibility",
    "Verdict",
    "check_event",
    "filter_events",
    "less_restrictive",
    "parse_history_visibility",
    "stored_visibility",
]

HistoryVisibility = Literal["world_readable", "shared", "invited", "joined"]
"""The values of ``m.room.history_visibility``'s ``history_visibility`` key."""

VISIBILITY_PRIORITY: Final[tuple[HistoryVisibility, ...]] = ("world_readable", "shared", "invited", "joined")
"""History visibilities from the least to the most restrictive."""

MEMBERSHIP_PRIORITY: Final[tuple[str, ...]] = ("join", "invite", "knock", "leave", "ban")
"""Memberships from the "most joined" to the least (rule 4)."""

HISTORY_VISIBILITY_EVENT_TYPE: Final = "m.room.history_visibility"
MEMBER_EVENT_TYPE: Final = "m.room.member"
HIDDEN_EVENT_TYPES: Final[frozenset[str]] = frozenset({"m.room.dummy", "m.room.aliases"})
"""Event types never shown to clients (rule 1): dummy events only exist to merge forward extremities,
and alias events cannot be redacted in older room versions, so the reference hides them to stop abuse."""

DEFAULT_HISTORY_VISIBILITY: Final[HistoryVisibility] = "shared"
"""What a room without a (valid) history-visibility event uses."""


def _is_history_visibility(value: object) -> TypeGuard[HistoryVisibility]:
    return isinstance(value, str) and value in VISIBILITY_PRIORITY


def parse_history_visibility(content: object) -> HistoryVisibility:
    """The visibility an ``m.room.history_visibility`` event's ``content`` sets.

    ``content`` is the event's decoded content (any JSON value). Anything other than an object whose
    ``history_visibility`` is one of the four known values (a missing event, a missing key, a value of
    another type or an unknown string) counts as ``"shared"``, the default (docs/plugins/events.md, Who sees what).
    """
    if isinstance(content, Mapping):
        value = content.get("history_visibility")
        if _is_history_visibility(value):
            return value
    return DEFAULT_HISTORY_VISIBILITY


def less_restrictive(a: HistoryVisibility, b: HistoryVisibility) -> HistoryVisibility:
    """The less restrictive of two history visibilities (``world_readable`` < ``shared`` < ``invited`` <
    ``joined``)."""
    return a if VISIBILITY_PRIORITY.index(a) <= VISIBILITY_PRIORITY.index(b) else b


def stored_visibility(
    event_type: str,
    state_key: str | None,
    in_state_after: HistoryVisibility,
    before: HistoryVisibility,
) -> HistoryVisibility:
    """The effective history visibility to store with an event, computed once when it is stored.

    ``in_state_after`` is the visibility in force in the state *after* the event (for a
    history-visibility state event, the value it sets); ``before`` the one in force in the state
    before it. Both come from the room's ``("m.room.history_visibility", "")`` state entry, through
    :func:`parse_history_visibility`, so a room without one reads as ``"shared"``: the events of a
    room's creation that precede its first history-visibility event are stored as ``shared``.

    Rule 3 (docs/plugins/events.md, Who sees what): an ``m.room.history_visibility`` *state* event is
    stored with the less restrictive of ``before`` and ``in_state_after``, so that users who could read
    either side of a change can read the change itself. Every other event gets ``in_state_after``.

    The reference also widens a *non-state* event of type ``m.room.history_visibility`` (it compares
    with an empty previous content, i.e. ``shared``); such an event changes nothing, and widening it
    would let any sender publish one message beyond the room's setting, so it is stored like any
    other message. For a state key other than ``""`` (no effect on visibility) ``before`` and
    ``in_state_after`` are equal and the rule changes nothing.
    """
    if event_type == HISTORY_VISIBILITY_EVENT_TYPE and state_key is not None:
        return less_restrictive(before, in_state_after)
    return in_state_after


@dataclass(frozen=True, slots=True)
class EventFacts:
    """What the visibility rules need to know about one event, all of it known when it is stored.

    * ``type``, ``state_key`` (``None`` for a non-state event; ``""`` is a state key), ``sender``.
    * ``outlier``: the event is held without its state (rule 2).
    * ``visibility``: the stored effective history visibility (:func:`stored_visibility`, rule 3).
    * ``membership``: for an ``m.room.member`` event, its ``content.membership`` (``None`` otherwise,
      or when the content has none).
    * ``prev_membership``: for an ``m.room.member`` event, the target's membership in the state
      *before* the event (``None`` if the target had none: the reference reads it from the event's
      ``unsigned.prev_content``).
    """

    type: str
    state_key: str | None
    sender: str
    outlier: bool
    visibility: HistoryVisibility
    membership: str | None = None
    prev_membership: str | None = None


class EventLike(Protocol):
    """Anything with :class:`EventFacts`' fields: the rules read no more (a stored row of the reads
    has them all, so it is judged as it is, without a copy)."""

    @property
    def type(self) -> str: ...
    @property
    def state_key(self) -> str | None: ...
    @property
    def sender(self) -> str: ...
    @property
    def outlier(self) -> bool: ...
    @property
    def visibility(self) -> HistoryVisibility: ...
    @property
    def membership(self) -> str | None: ...
    @property
    def prev_membership(self) -> str | None: ...


@dataclass(frozen=True, slots=True)
class Verdict:
    """The decision for one user and one event.

    ``visible``: whether the user may read the event. ``membership``: the user's membership at the
    event, to return as the event's ``unsigned.membership`` (rule 6): their membership in the state
    after the event, ``"leave"`` when they have none there. For the user's own member event it is the
    membership the event sets (the only source for an outlier, which has no state).
    """

    visible: bool
    membership: str


def _ranked_membership(membership: str | None) -> str:
    """A membership usable with :data:`MEMBERSHIP_PRIORITY`: unknown or missing counts as ``leave``."""
    return membership if membership is not None and membership in MEMBERSHIP_PRIORITY else "leave"


# Long on purpose: the six rules, in the reference's order, in one place; half of it is their statement.
def check_event(
    user: str,
    event: EventLike,
    membership_at_event: str | None,
    *,
    is_peeking: bool,
    ignored_senders: frozenset[str] = frozenset(),
) -> Verdict:
    """Whether ``user`` may read ``event``, and their membership at it (docs/plugins/events.md, Who sees
    what, rules 1-6).

    ``membership_at_event``: the user's ``content.membership`` in the state after the event (``None``
    if the state holds no member event for them; ignored for outliers, which have no state).

    ``is_peeking``: the user has no membership in the room at all *now*: they never joined, were
    never invited, never knocked, never left and were never banned. Such a user can only be reading a
    ``world_readable`` room (the reader refuses the others before filtering). A user who joined and
    then left a ``shared`` room, or rejected an invite, has a membership (``leave``) and is *not*
    peeking, so they keep seeing the ``shared`` history (up to their leave: see the module docstring).

    ``ignored_senders``: the users this user ignores (``m.ignored_user_list`` account data).

    The rules, in the order the reference applies them:

    1. ``m.room.dummy`` and ``m.room.aliases`` events are hidden; so is a non-state event from an
       ignored sender (state events from ignored senders stay: they make up the room).
    2. An outlier is visible only if it is the user's own member event (an out-of-band invite, or
       the rejection of one); any other outlier is hidden.
    3. Already applied to ``event.visibility`` when it was stored (:func:`stored_visibility`).
    4. The user's membership at the event is ``membership_at_event``; for the user's own member event
       it is the more joined (:data:`MEMBERSHIP_PRIORITY`) of the membership it sets and
       ``prev_membership`` (a missing or unknown value counting as ``leave``), so that a user sees
       the event that made them leave or get banned from a room they were in; and a ``leave`` after
       a ``join`` or an ``invite`` is always visible to its user (they must see the room go away,
       also when they reject an invite).
    5. Joined at the event: visible. Otherwise by ``event.visibility``: ``world_readable`` visible;
       ``shared`` visible unless peeking; ``invited`` visible iff the membership at the event is
       ``invite``; ``joined`` hidden.
    6. The verdict carries the user's membership at the event (:class:`Verdict`), also when hidden.

    One difference from the reference, a consequence of storing one visibility per event: for a
    history-visibility change, the reference uses the widened value (rule 3) only for the
    ``world_readable``/``shared`` shortcut and the value set by the event for the membership
    checks. So a user invited (not joined) when the room goes from ``invited`` to ``joined`` does not
    see that change there; here the widened ``invited`` applies and they do, which is what rule 3
    (and the Matrix specification: visible if either side allows it) says.
    """
    # Over 80 lines for its docstring only (the body is some 45): the rules are written where they apply.
    own_member_event = event.type == MEMBER_EVENT_TYPE and event.state_key == user
    # Rule 6: annotate with the membership after the event; for the user's own member event that is
    # the membership it sets (an outlier has no state to read it from).
    if own_member_event:
        annotation = event.membership if event.membership is not None else "leave"
    else:
        annotation = membership_at_event if membership_at_event is not None else "leave"
    hidden = Verdict(visible=False, membership=annotation)
    shown = Verdict(visible=True, membership=annotation)

    # Rule 1.
    if event.type in HIDDEN_EVENT_TYPES:
        return hidden
    if event.state_key is None and event.sender in ignored_senders:
        return hidden

    # Rule 2.
    if event.outlier:
        return shown if own_member_event else hidden

    visibility = event.visibility  # rule 3 applied when stored

    # Lax visibilities need no membership (rule 5, checked first by the reference).
    if visibility == "world_readable" or (visibility == "shared" and not is_peeking):
        return shown

    # Rule 4.
    membership: str | None
    if own_member_event:
        new = _ranked_membership(event.membership)
        old = _ranked_membership(event.prev_membership)
        if new == "leave" and old in ("join", "invite"):
            return shown
        membership = old if MEMBERSHIP_PRIORITY.index(old) < MEMBERSHIP_PRIORITY.index(new) else new
    else:
        membership = membership_at_event

    # Rule 5.
    if membership == "join":
        return shown
    if visibility == "invited" and membership == "invite":
        return shown
    # "joined", "invited" without an invite, or "shared" while peeking.
    return hidden


def filter_events(
    user: str,
    events: Sequence[tuple[EventFacts, str | None]],
    *,
    is_peeking: bool,
    ignored_senders: frozenset[str] = frozenset(),
) -> list[Verdict]:
    """:func:`check_event` for each ``(event, membership_at_event)``: one verdict per event, in order.

    The caller keeps the visible events and annotates each with its verdict's ``membership``.
    """
    return [
        check_event(user, event, membership, is_peeking=is_peeking, ignored_senders=ignored_senders)
        for event, membership in events
    ]
