"""History visibility rules (docs/plugins/events.md, Who sees what), as pure functions.

One test per rule, one per consequence observed in a running reference server, scenarios in the
spirit of the reference's own visibility tests (with rooms and users of our own), and a generated
comparison of :func:`check_event` with an oracle written separately below. A wrong answer here is a
privacy bug: hidden-when-it-should-be-hidden is checked as carefully as the rest.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest
from factstream_events.rules.visibility import (
    MEMBERSHIP_PRIORITY,
    VISIBILITY_PRIORITY,
    EventFacts,
    HistoryVisibility,
    Verdict,
    check_event,
    filter_events,
    less_restrictive,
    parse_history_visibility,
    stored_visibility,
)
from hypothesis import given, settings
from hypothesis import strategies as st

HV = "m.room.history_visibility"
MEMBER = "m.room.member"
MESSAGE = "m.room.message"

ME = "@wren:example.org"
OTHER = "@otto:example.org"
PEST = "@pest:example.org"


def message(visibility: HistoryVisibility, sender: str = OTHER, *, outlier: bool = False) -> EventFacts:
    return EventFacts(type=MESSAGE, state_key=None, sender=sender, outlier=outlier, visibility=visibility)


def member(
    target: str,
    membership: str | None,
    prev: str | None,
    visibility: HistoryVisibility,
    *,
    sender: str | None = None,
    outlier: bool = False,
) -> EventFacts:
    return EventFacts(
        type=MEMBER,
        state_key=target,
        sender=sender or target,
        outlier=outlier,
        visibility=visibility,
        membership=membership,
        prev_membership=prev,
    )


def sees(event: EventFacts, membership_at_event: str | None, *, peeking: bool = False, user: str = ME) -> bool:
    return check_event(user, event, membership_at_event, is_peeking=peeking).visible


# -- the priorities -------------------------------------------------------------------------------


def test_priorities() -> None:
    assert VISIBILITY_PRIORITY == ("world_readable", "shared", "invited", "joined")
    assert MEMBERSHIP_PRIORITY == ("join", "invite", "knock", "leave", "ban")


# -- parsing: a missing or invalid history visibility counts as shared ------------------------------


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        ({"history_visibility": "world_readable"}, "world_readable"),
        ({"history_visibility": "shared"}, "shared"),
        ({"history_visibility": "invited"}, "invited"),
        ({"history_visibility": "joined", "extra": 1}, "joined"),
        (None, "shared"),  # no history-visibility event at all
        ({}, "shared"),  # e.g. a redacted-then-emptied content
        ({"history_visibility": "JOINED"}, "shared"),
        ({"history_visibility": "joined "}, "shared"),
        ({"history_visibility": ["joined"]}, "shared"),
        ({"history_visibility": None}, "shared"),
        ({"history_visibility": 3}, "shared"),
        ("joined", "shared"),  # not an object
        (["joined"], "shared"),
        (7, "shared"),
    ],
)
def test_parse_history_visibility(content: object, expected: str) -> None:
    assert parse_history_visibility(content) == expected


# -- rule 1: dummy and aliases events never shown; ignored senders' non-state events dropped -------------


@pytest.mark.parametrize("event_type", ["m.room.dummy", "m.room.aliases"])
@pytest.mark.parametrize("state_key", [None, "", "example.org"])
def test_rule1_dummy_and_aliases_events_are_never_shown(event_type: str, state_key: str | None) -> None:
    event = EventFacts(type=event_type, state_key=state_key, sender=ME, outlier=False, visibility="world_readable")
    verdict = check_event(ME, event, "join", is_peeking=False)
    assert verdict == Verdict(visible=False, membership="join")


def test_rule1_an_ignored_senders_messages_are_dropped() -> None:
    event = message("world_readable", sender=PEST)
    assert not check_event(ME, event, "join", is_peeking=False, ignored_senders=frozenset({PEST})).visible
    assert check_event(ME, event, "join", is_peeking=False, ignored_senders=frozenset({OTHER})).visible
    assert check_event(OTHER, event, "join", is_peeking=False).visible  # ignoring is per user


def test_rule1_an_ignored_senders_state_events_stay() -> None:
    topic = EventFacts(type="m.room.topic", state_key="", sender=PEST, outlier=False, visibility="shared")
    kick = member(ME, "leave", "join", "joined", sender=PEST)
    ignored = frozenset({PEST})
    assert check_event(ME, topic, "join", is_peeking=False, ignored_senders=ignored).visible
    assert check_event(ME, kick, "leave", is_peeking=False, ignored_senders=ignored).visible


# -- rule 2: outliers: only the user's own membership events -------------------------------------


def test_rule2_an_out_of_band_invite_and_its_rejection_are_visible_to_their_user() -> None:
    invite = member(ME, "invite", None, "joined", sender=OTHER, outlier=True)
    rejection = member(ME, "leave", None, "joined", outlier=True)
    # Peeking (no membership in the room's state) and no state at the event: still visible.
    assert check_event(ME, invite, None, is_peeking=True) == Verdict(visible=True, membership="invite")
    assert check_event(ME, rejection, None, is_peeking=True) == Verdict(visible=True, membership="leave")


@pytest.mark.parametrize("visibility", VISIBILITY_PRIORITY)
def test_rule2_other_outliers_are_hidden_even_from_members_of_world_readable_rooms(
    visibility: HistoryVisibility,
) -> None:
    others_invite = member(OTHER, "invite", None, visibility, sender=ME, outlier=True)
    own_message = message(visibility, sender=ME, outlier=True)
    create = EventFacts(type="m.room.create", state_key="", sender=ME, outlier=True, visibility=visibility)
    for event in (others_invite, own_message, create):
        assert not sees(event, "join")
        assert not sees(event, None, peeking=True)


# -- rule 3: a history-visibility event is judged by the less restrictive of its old and new value ------


@pytest.mark.parametrize("before", VISIBILITY_PRIORITY)
@pytest.mark.parametrize("after", VISIBILITY_PRIORITY)
def test_rule3_a_visibility_change_is_stored_with_the_less_restrictive_side(
    before: HistoryVisibility, after: HistoryVisibility
) -> None:
    order = {"world_readable": 0, "shared": 1, "invited": 2, "joined": 3}
    expected = before if order[before] < order[after] else after
    assert stored_visibility(HV, "", after, before) == expected
    assert less_restrictive(before, after) == expected == less_restrictive(after, before)


@pytest.mark.parametrize("before", VISIBILITY_PRIORITY)
@pytest.mark.parametrize("after", VISIBILITY_PRIORITY)
def test_rule3_other_events_are_stored_with_the_visibility_after_them(
    before: HistoryVisibility, after: HistoryVisibility
) -> None:
    assert stored_visibility(MESSAGE, None, after, before) == after
    assert stored_visibility(MEMBER, ME, after, before) == after
    assert stored_visibility("m.room.topic", "", after, before) == after
    # A non-state event that merely has the type changes nothing, and is not widened.
    assert stored_visibility(HV, None, after, before) == after


# -- rule 4: the user's own membership event: the more joined side; a leave after join/invite ---------


@pytest.mark.parametrize("visibility", ["joined", "invited"])
def test_rule4_a_leave_after_a_join_or_an_invite_is_always_visible(visibility: HistoryVisibility) -> None:
    for prev in ("join", "invite"):
        event = member(ME, "leave", prev, visibility)
        assert check_event(ME, event, "leave", is_peeking=False) == Verdict(visible=True, membership="leave")
        kicked = member(ME, "leave", prev, visibility, sender=OTHER)
        assert sees(kicked, "leave")


@pytest.mark.parametrize(
    ("new", "prev", "visible"),
    [
        ("join", None, True),  # the join itself
        ("join", "invite", True),
        ("join", "leave", True),
        ("ban", "join", True),  # banned while joined: joined is the more joined side
        ("invite", "join", True),  # (not allowed by the auth rules, but ranked all the same)
        ("leave", "leave", False),
        ("leave", "knock", False),  # a retracted knock: knock is not a leave after join/invite
        ("leave", None, False),
        ("ban", "leave", False),
        ("ban", None, False),
        ("knock", "leave", False),
        ("invite", None, False),  # own invite, joined-only room: hidden from the timeline
        ("bogus", "join", True),  # an unknown membership counts as leave
        ("leave", "bogus", False),
        (None, "invite", True),  # no membership counts as leave: a leave after an invite
        (None, "knock", False),
    ],
)
def test_rule4_own_membership_events_in_a_joined_only_room(new: str | None, prev: str | None, visible: bool) -> None:
    event = member(ME, new, prev, "joined", sender=OTHER if new in ("ban", "invite") else ME)
    # The state at the event is not consulted for the user's own member event.
    assert sees(event, "join" if not visible else "leave") is visible


@pytest.mark.parametrize(
    ("new", "prev", "visible"),
    [
        ("invite", None, True),  # own invite: invited at it
        ("invite", "leave", True),
        ("knock", None, False),
        ("leave", "knock", False),
        ("ban", "invite", True),  # the invite is the more joined side
        ("join", "invite", True),
    ],
)
def test_rule4_own_membership_events_in_an_invited_room(new: str, prev: str | None, visible: bool) -> None:
    assert sees(member(ME, new, prev, "invited"), new) is visible


def test_rule4_someone_elses_member_event_uses_the_users_membership_from_the_state() -> None:
    others_join = member(OTHER, "join", "invite", "joined")
    assert sees(others_join, "join")
    assert not sees(others_join, "leave")
    assert not sees(others_join, None)
    others_leave_after_join = member(OTHER, "leave", "join", "joined")
    assert not sees(others_leave_after_join, "invite")  # the leave rule is for one's own events only


# -- rule 5: join -> visible; otherwise by visibility -------------------------------------------------

# Written out by hand: which memberships at the event see a message, per visibility, not peeking.
SEEN_BY: dict[str, set[str | None]] = {
    "world_readable": {"join", "invite", "knock", "leave", "ban", None},
    "shared": {"join", "invite", "knock", "leave", "ban", None},
    "invited": {"join", "invite"},
    "joined": {"join"},
}
# ... and while peeking (the user has no membership now; the state at the event may still, in theory).
SEEN_BY_PEEKER: dict[str, set[str | None]] = {
    "world_readable": {"join", "invite", "knock", "leave", "ban", None},
    "shared": {"join"},
    "invited": {"join", "invite"},
    "joined": {"join"},
}


@pytest.mark.parametrize("visibility", VISIBILITY_PRIORITY)
@pytest.mark.parametrize("membership", ["join", "invite", "knock", "leave", "ban", None])
@pytest.mark.parametrize("peeking", [False, True])
def test_rule5_by_membership_then_visibility(
    visibility: HistoryVisibility, membership: str | None, peeking: bool
) -> None:
    table = SEEN_BY_PEEKER if peeking else SEEN_BY
    assert sees(message(visibility), membership, peeking=peeking) is (membership in table[visibility])


def test_rule5_sender_does_not_matter() -> None:
    # Not even one's own message, once outside the visibility window.
    assert not sees(message("joined", sender=ME), "leave")
    assert not sees(message("invited", sender=ME), "knock")


# -- rule 6: every verdict carries the user's membership at the event ---------------------------------


@pytest.mark.parametrize("membership", ["join", "invite", "knock", "leave", "ban", "custom"])
def test_rule6_membership_annotation_comes_from_the_state_at_the_event(membership: str) -> None:
    for visibility in VISIBILITY_PRIORITY:
        assert check_event(ME, message(visibility), membership, is_peeking=False).membership == membership


def test_rule6_no_membership_in_the_state_is_annotated_leave() -> None:
    assert check_event(ME, message("world_readable"), None, is_peeking=True) == Verdict(True, "leave")
    assert check_event(ME, message("joined"), None, is_peeking=False) == Verdict(False, "leave")


def test_rule6_own_member_events_are_annotated_with_the_membership_they_set() -> None:
    assert check_event(ME, member(ME, "ban", "join", "joined", sender=OTHER), "ban", is_peeking=False) == Verdict(
        True, "ban"
    )
    assert check_event(ME, member(ME, "invite", None, "shared", sender=OTHER), "invite", is_peeking=False) == Verdict(
        True, "invite"
    )
    # Another user's member event: the user's own membership, not the target's.
    assert check_event(ME, member(OTHER, "join", None, "shared"), "invite", is_peeking=False).membership == "invite"


def test_filter_events_gives_one_verdict_per_event_in_order() -> None:
    events = [
        (message("joined"), "leave"),
        (message("joined"), "join"),
        (message("shared"), None),
        (EventFacts("m.room.dummy", None, OTHER, False, "world_readable"), "join"),
        (message("invited", sender=PEST), "invite"),
    ]
    verdicts = filter_events(ME, events, is_peeking=False, ignored_senders=frozenset({PEST}))
    assert verdicts == [
        Verdict(False, "leave"),
        Verdict(True, "join"),
        Verdict(True, "leave"),
        Verdict(False, "join"),
        Verdict(False, "invite"),
    ]
    assert filter_events(ME, [], is_peeking=True) == []


# -- a small room, to play the observed consequences end to end --------------------------------------


@dataclass
class Stored:
    label: str
    facts: EventFacts
    members_after: dict[str, str | None]


@dataclass
class Room:
    """Applies events in order, keeping the two pieces of state the rules read (the history
    visibility and the memberships), and stores each event's facts as the store would."""

    events: list[Stored] = field(default_factory=list)
    members: dict[str, str | None] = field(default_factory=dict)
    visibility_content: Any = None  # no history-visibility event yet

    def send(
        self,
        label: str,
        event_type: str,
        sender: str,
        state_key: str | None = None,
        content: dict[str, Any] | None = None,
        *,
        outlier: bool = False,
    ) -> None:
        content = content or {}
        before = parse_history_visibility(self.visibility_content)
        membership = prev = None
        if event_type == MEMBER and state_key is not None:
            membership = content.get("membership")
            prev = None if outlier else self.members.get(state_key)
        if not outlier and state_key is not None:  # outliers are in no state
            if event_type == HV and state_key == "":
                self.visibility_content = content
            if event_type == MEMBER:
                self.members[state_key] = membership
        after = parse_history_visibility(self.visibility_content)
        facts = EventFacts(
            type=event_type,
            state_key=state_key,
            sender=sender,
            outlier=outlier,
            visibility=stored_visibility(event_type, state_key, after, before),
            membership=membership,
            prev_membership=prev,
        )
        self.events.append(Stored(label, facts, dict(self.members)))

    def say(self, label: str, sender: str) -> None:
        self.send(label, MESSAGE, sender, content={"body": label})

    def set_visibility(self, label: str, visibility: str, sender: str) -> None:
        self.send(label, HV, sender, "", {"history_visibility": visibility})

    def membership(self, label: str, target: str, membership: str, sender: str | None = None) -> None:
        self.send(label, MEMBER, sender or target, target, {"membership": membership})

    def create(self, creator: str, visibility: str | None = None) -> None:
        """As the reference creates a room: create, the creator's join, power levels, join rules, then
        (when given) the history visibility."""
        self.send("create", "m.room.create", creator, "", {"room_version": "11"})
        self.membership("creator joins", creator, "join")
        self.send("power levels", "m.room.power_levels", creator, "", {"users": {creator: 100}})
        self.send("join rules", "m.room.join_rules", creator, "", {"join_rule": "invite"})
        if visibility is not None:
            self.set_visibility(f"visibility {visibility}", visibility, creator)

    def verdicts(self, user: str, ignored: frozenset[str] = frozenset()) -> dict[str, Verdict]:
        peeking = user not in self.members  # no membership in the room at all, now
        pairs = [(s.facts, None if s.facts.outlier else s.members_after.get(user)) for s in self.events]
        verdicts = filter_events(user, pairs, is_peeking=peeking, ignored_senders=ignored)
        return {s.label: v for s, v in zip(self.events, verdicts, strict=True)}

    def visible(self, user: str) -> list[str]:
        return [label for label, verdict in self.verdicts(user).items() if verdict.visible]

    def labels(self) -> list[str]:
        return [s.label for s in self.events]


CREATION = ["create", "creator joins", "power levels", "join rules"]
ALICE = "@alice:one.test"
BOB = "@bob:two.test"
CAROL = "@carol:three.test"


# -- the consequences observed in a running reference server -----------------------------------------


@pytest.mark.parametrize("visibility", ["joined", "invited"])
def test_observed_creation_events_before_the_first_visibility_event_are_shared(visibility: str) -> None:
    room = Room()
    room.create(ALICE, visibility)
    room.say("before bob", ALICE)
    room.membership("bob joins", BOB, "join")
    room.say("with bob", ALICE)
    assert room.visible(BOB) == [
        "create",
        "creator joins",
        "power levels",
        "join rules",
        f"visibility {visibility}",  # shared -> restrictive: judged as shared
        "bob joins",
        "with bob",
    ]
    memberships = {label: v.membership for label, v in room.verdicts(BOB).items()}
    assert memberships["create"] == "leave"
    assert memberships["with bob"] == "join"


def test_observed_a_narrowing_change_is_visible_from_the_wider_side() -> None:
    room = Room()
    room.create(ALICE, "shared")
    room.say("shared era", ALICE)
    room.set_visibility("to joined", "joined", ALICE)
    room.say("joined era", ALICE)
    room.membership("carol joins", CAROL, "join")
    assert room.visible(CAROL) == [
        "create",
        "creator joins",
        "power levels",
        "join rules",
        "visibility shared",
        "shared era",
        "to joined",
        "carol joins",
    ]


def test_observed_a_widening_change_is_visible_from_the_wider_side() -> None:
    room = Room()
    room.create(ALICE, "joined")
    room.say("joined era", ALICE)
    room.set_visibility("to shared", "shared", ALICE)
    room.say("shared era", ALICE)
    room.membership("carol joins", CAROL, "join")
    visible = room.visible(CAROL)
    assert "joined era" not in visible
    assert visible[-3:] == ["to shared", "shared era", "carol joins"]


@pytest.mark.parametrize(("old", "new"), [("world_readable", "joined"), ("joined", "world_readable")])
def test_observed_a_change_to_or_from_world_readable_is_visible_to_a_peeker(old: str, new: str) -> None:
    room = Room()
    room.create(ALICE, old)
    room.say("first", ALICE)
    room.set_visibility("change", new, ALICE)
    room.say("second", ALICE)
    visible = room.visible(CAROL)
    assert "change" in visible
    assert ("first" in visible) is (old == "world_readable")
    assert ("second" in visible) is (new == "world_readable")


def test_a_change_between_restrictive_values_is_not_visible_to_later_joiners() -> None:
    room = Room()
    room.create(ALICE, "joined")
    room.set_visibility("to invited", "invited", ALICE)
    room.set_visibility("back to joined", "joined", ALICE)
    room.membership("carol joins", CAROL, "join")
    assert room.visible(CAROL) == [*CREATION, "visibility joined", "carol joins"]


def test_observed_a_user_who_left_a_shared_room_sees_history_up_to_their_leave() -> None:
    room = Room()
    room.create(ALICE, "shared")
    room.say("before bob", ALICE)
    room.membership("bob joins", BOB, "join")
    room.say("with bob", ALICE)
    room.membership("bob leaves", BOB, "leave")
    room.say("after bob", ALICE)
    verdicts = room.verdicts(BOB)
    labels = room.labels()
    up_to_leave = labels[: labels.index("bob leaves") + 1]
    assert all(verdicts[label].visible for label in up_to_leave)
    assert verdicts["bob leaves"].membership == "leave"
    # Bob is not peeking (he has a membership: leave), so `shared` events stay readable. The rules do
    # not cut at the leave: the reader clamps `/messages` to the leave event first, as the reference
    # does. So here the event after the leave still passes the filter:
    assert verdicts["after bob"] == Verdict(True, "leave")


def test_observed_rejected_invite_and_kick_keep_their_own_leave() -> None:
    room = Room()
    room.create(ALICE, "joined")
    room.membership("bob invited", BOB, "invite", ALICE)
    room.membership("bob rejects", BOB, "leave")
    room.membership("carol joins", CAROL, "join")
    room.say("with carol", ALICE)
    room.membership("carol kicked", CAROL, "leave", ALICE)
    # Bob's own invite is hidden in a joined-only room, not its rejection; the room's creation is shared.
    assert room.visible(BOB) == [*CREATION, "visibility joined", "bob rejects"]
    assert room.visible(CAROL) == [*CREATION, "visibility joined", "carol joins", "with carol", "carol kicked"]


def test_observed_invited_visibility_shows_history_from_the_invite() -> None:
    room = Room()
    room.create(ALICE, "invited")
    room.say("before invite", ALICE)
    room.membership("bob invited", BOB, "invite", ALICE)
    room.say("while invited", ALICE)
    room.membership("bob joins", BOB, "join")
    room.say("while joined", ALICE)
    room.membership("carol joins", CAROL, "join")
    after_creation = ["bob invited", "while invited", "bob joins", "while joined", "carol joins"]
    assert room.visible(BOB) == [*CREATION, "visibility invited", *after_creation]
    assert room.visible(CAROL) == [*CREATION, "visibility invited", "carol joins"]
    bob = room.verdicts(BOB)
    assert [bob[label].membership for label in after_creation] == ["invite", "invite", "join", "join", "join"]


def test_observed_joined_visibility_shows_only_while_joined() -> None:
    room = Room()
    room.create(ALICE, "joined")
    room.say("m1", ALICE)
    room.membership("bob invited", BOB, "invite", ALICE)
    room.say("m2", ALICE)
    room.membership("bob joins", BOB, "join")
    room.say("m3", BOB)
    room.membership("alice bans bob", BOB, "ban", ALICE)
    room.say("m4", ALICE)
    assert room.visible(BOB) == [*CREATION, "visibility joined", "bob joins", "m3", "alice bans bob"]
    assert room.visible(ALICE) == room.labels()  # joined throughout


def test_observed_world_readable_for_peekers() -> None:
    room = Room()
    room.create(ALICE, "shared")
    room.say("shared era", ALICE)
    room.set_visibility("to world_readable", "world_readable", ALICE)
    room.say("public", ALICE)
    room.membership("bob joins", BOB, "join")
    # Carol never had a membership: she is peeking. Shared history is hidden from her; world-readable
    # history (and the change to it) is not.
    assert room.visible(CAROL) == ["to world_readable", "public", "bob joins"]
    assert all(v.membership == "leave" for v in room.verdicts(CAROL).values())
    # Once she has any membership (even a leave), she no longer peeks: the shared era opens up.
    room.membership("carol knocks", CAROL, "knock")
    room.membership("carol retracts", CAROL, "leave")
    assert "shared era" in room.visible(CAROL)


def test_observed_outliers_only_the_users_own_membership() -> None:
    room = Room()
    room.send("remote invite", MEMBER, ALICE, BOB, {"membership": "invite"}, outlier=True)
    room.send("local rejection", MEMBER, BOB, BOB, {"membership": "leave"}, outlier=True)
    room.send("auth event", "m.room.power_levels", ALICE, "", {}, outlier=True)
    bob = room.verdicts(BOB)
    assert [label for label, v in bob.items() if v.visible] == ["remote invite", "local rejection"]
    assert [bob["remote invite"].membership, bob["local rejection"].membership] == ["invite", "leave"]
    assert room.visible(CAROL) == []


# -- scenarios in the spirit of the reference's tests/test_visibility.py ----------------------------


def test_joiner_sees_join_to_leave_resident_sees_all() -> None:
    room = Room()
    room.create(ALICE)
    room.set_visibility("joined only", "joined", ALICE)
    room.say("early", ALICE)
    room.membership("dave in", "@dave:four.test", "join")
    room.say("middle", ALICE)
    room.membership("dave out", "@dave:four.test", "leave")
    room.say("late", ALICE)
    dave = room.verdicts("@dave:four.test")
    assert [(label, v.membership) for label, v in dave.items() if v.visible and label not in room.labels()[:5]] == [
        ("dave in", "join"),
        ("middle", "join"),
        ("dave out", "leave"),
    ]
    assert not dave["early"].visible and not dave["late"].visible
    alice = room.verdicts(ALICE)
    assert all(v.visible for v in alice.values())
    assert [alice[label].membership for label in ("early", "dave in", "middle", "dave out", "late")] == ["join"] * 5


def test_out_of_band_invite_rejection_visible_to_the_invitee_only() -> None:
    room = Room()
    room.send("invite over federation", MEMBER, "@eve:remote.test", ME, {"membership": "invite"}, outlier=True)
    room.send("rejected locally", MEMBER, ME, ME, {"membership": "leave"}, outlier=True)
    assert [(v.visible, v.membership) for v in room.verdicts(ME).values()] == [(True, "invite"), (True, "leave")]
    assert room.visible(OTHER) == []


def test_ignoring_a_sender_hides_their_messages_not_their_state() -> None:
    room = Room()
    room.create(ALICE, "shared")
    room.membership("pest joins", PEST, "join")
    room.say("spam", PEST)
    room.send("pest topic", "m.room.topic", PEST, "", {"topic": "t"})
    room.say("hello", ALICE)
    verdicts = room.verdicts(ALICE, ignored=frozenset({PEST}))
    assert not verdicts["spam"].visible
    assert verdicts["pest joins"].visible and verdicts["pest topic"].visible and verdicts["hello"].visible


def test_sender_cannot_widen_a_message_by_giving_it_the_visibility_type() -> None:
    room = Room()
    room.create(ALICE, "joined")
    room.send("fake change", HV, ALICE, None, {"history_visibility": "world_readable"})
    assert "fake change" not in room.visible(CAROL)


def test_a_user_invited_across_a_change_from_invited_to_joined_sees_the_change() -> None:
    """Where we differ from the reference on purpose (see check_event): the change is visible if
    either side allows it, and Bob, invited, could read the `invited` side."""
    room = Room()
    room.create(ALICE, "invited")
    room.membership("bob invited", BOB, "invite", ALICE)
    room.set_visibility("to joined", "joined", ALICE)
    room.say("after", ALICE)
    assert room.visible(BOB) == [*CREATION, "visibility invited", "bob invited", "to joined"]


# -- generated: check_event against an oracle written from the section's text ------------------------

RANK = {"join": 0, "invite": 1, "knock": 2, "leave": 3, "ban": 4}


def oracle(
    user: str,
    event: EventFacts,
    membership_at_event: str | None,
    peeking: bool,
    ignored: frozenset[str],
) -> Verdict:
    """Section 7, read literally, one rule after the other, without early returns."""
    mine = event.type == MEMBER and event.state_key == user
    annotation = (event.membership or "leave") if mine else (membership_at_event or "leave")

    never_shown = event.type in ("m.room.dummy", "m.room.aliases")
    from_ignored = event.state_key is None and event.sender in ignored
    rule1_ok = not never_shown and not from_ignored

    if event.outlier:
        return Verdict(rule1_ok and mine, annotation)

    leave_after_joined_or_invited = False
    effective: str | None
    if mine:
        new = event.membership if event.membership in RANK else "leave"
        old = event.prev_membership if event.prev_membership in RANK else "leave"
        assert new is not None and old is not None
        effective = min((new, old), key=RANK.__getitem__)
        leave_after_joined_or_invited = new == "leave" and old in ("join", "invite")
    else:
        effective = membership_at_event

    by_visibility = {
        "world_readable": True,
        "shared": not peeking,
        "invited": effective == "invite",
        "joined": False,
    }[event.visibility]
    allowed = leave_after_joined_or_invited or effective == "join" or by_visibility
    return Verdict(rule1_ok and allowed, annotation)


USERS = [ME, OTHER, PEST]
memberships = st.sampled_from(["join", "invite", "knock", "leave", "ban", None, "bogus"])
visibilities = st.sampled_from(VISIBILITY_PRIORITY)
any_event = st.builds(
    EventFacts,
    type=st.sampled_from([MESSAGE, MEMBER, HV, "m.room.dummy", "m.room.aliases", "m.room.topic", "m.room.create"]),
    state_key=st.sampled_from([None, "", *USERS]),
    sender=st.sampled_from(USERS),
    outlier=st.booleans(),
    visibility=visibilities,
    membership=memberships,
    prev_membership=memberships,
)
own_member_event = st.builds(
    EventFacts,
    type=st.just(MEMBER),
    state_key=st.just(ME),
    sender=st.sampled_from(USERS),
    outlier=st.booleans(),
    visibility=visibilities,
    membership=memberships,
    prev_membership=memberships,
)


@settings(max_examples=2000, deadline=None)
@given(
    event=st.one_of(any_event, own_member_event),
    membership_at_event=memberships,
    peeking=st.booleans(),
    ignored=st.frozensets(st.sampled_from(USERS)),
)
def test_check_event_agrees_with_the_oracle(
    event: EventFacts, membership_at_event: str | None, peeking: bool, ignored: frozenset[str]
) -> None:
    expected = oracle(ME, event, membership_at_event, peeking, ignored)
    got = check_event(ME, event, membership_at_event, is_peeking=peeking, ignored_senders=ignored)
    assert got == expected


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.tuples(st.one_of(any_event, own_member_event), memberships), max_size=12),
    st.booleans(),
    st.frozensets(st.sampled_from(USERS)),
)
def test_filter_events_is_check_event_per_event(
    events: list[tuple[EventFacts, str | None]], peeking: bool, ignored: frozenset[str]
) -> None:
    expected = [check_event(ME, e, m, is_peeking=peeking, ignored_senders=ignored) for e, m in events]
    assert filter_events(ME, events, is_peeking=peeking, ignored_senders=ignored) == expected


@settings(max_examples=500, deadline=None)
@given(event=any_event, membership_at_event=memberships, ignored=st.frozensets(st.sampled_from(USERS)))
def test_peeking_never_shows_more(event: EventFacts, membership_at_event: str | None, ignored: frozenset[str]) -> None:
    peeking = check_event(ME, event, membership_at_event, is_peeking=True, ignored_senders=ignored)
    member_now = check_event(ME, event, membership_at_event, is_peeking=False, ignored_senders=ignored)
    assert not (peeking.visible and not member_now.visible)
    assert peeking.membership == member_now.membership
