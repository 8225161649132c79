"""factstream_events.rules.prune: the Matrix redaction algorithm, room versions 1 to 11.

The expected results are written out from the specification's per-version redaction rules; the worked
examples at the end are adapted from Synapse's redaction tests (Synapse also keeps some ``unsigned`` keys,
which this implementation drops by design).
"""

from __future__ import annotations

import copy
from typing import Any

import pytest
from factstream_events.rules.prune import (
    KNOWN_ROOM_VERSIONS,
    UnknownRoomVersion,
    check_room_version,
    prune_event,
    redacts_target,
)
from hypothesis import given
from hypothesis import strategies as st

from tests.bundled.events.test_eventid import SYNAPSE_MESSAGE


def versions(first: int, last: int) -> list[str]:
    """Room versions ``first`` to ``last`` inclusive, as strings."""
    return [str(number) for number in range(first, last + 1)]


def test_known_room_versions() -> None:
    assert tuple(versions(1, 11)) == KNOWN_ROOM_VERSIONS


# ---------------------------------------------------------------------------------------------------------
# Top-level keys

EVERY_TOP_LEVEL_KEY: dict[str, Any] = {
    "event_id": "$e:example.org",
    "type": "m.room.message",
    "room_id": "!r:example.org",
    "sender": "@u:example.org",
    "state_key": "",
    "content": {},
    "hashes": {"sha256": "abc"},
    "signatures": {"example.org": {"ed25519:1": "sig"}},
    "depth": 4,
    "prev_events": ["$p"],
    "auth_events": ["$a"],
    "origin_server_ts": 1234,
    "origin": "example.org",
    "membership": "join",
    "prev_state": [],
    "unsigned": {"age_ts": 5, "replaces_state": "$old"},
    "redacts": "$target",
    "age_ts": 5,
    "outlier": True,
    "destinations": ["x"],
    "other_key": "foo",
}

KEPT_BY_ALL = {
    "event_id",
    "type",
    "room_id",
    "sender",
    "state_key",
    "content",
    "hashes",
    "signatures",
    "depth",
    "prev_events",
    "auth_events",
    "origin_server_ts",
}


@pytest.mark.parametrize("room_version", versions(1, 10))
def test_top_level_keys_before_v11(room_version: str) -> None:
    pruned = prune_event(EVERY_TOP_LEVEL_KEY, room_version)
    assert set(pruned) == KEPT_BY_ALL | {"origin", "membership", "prev_state"}
    assert {key: pruned[key] for key in pruned if key != "content"} == {
        key: EVERY_TOP_LEVEL_KEY[key] for key in pruned if key != "content"
    }


def test_top_level_keys_v11() -> None:
    pruned = prune_event(EVERY_TOP_LEVEL_KEY, "11")
    assert set(pruned) == KEPT_BY_ALL


@pytest.mark.parametrize("room_version", KNOWN_ROOM_VERSIONS)
def test_unsigned_is_dropped(room_version: str) -> None:
    assert "unsigned" not in prune_event({"type": "A", "content": {}, "unsigned": {"age_ts": 1}}, room_version)


@pytest.mark.parametrize("room_version", KNOWN_ROOM_VERSIONS)
def test_missing_keys_are_not_invented(room_version: str) -> None:
    assert prune_event({"type": "m.room.member"}, room_version) == {"type": "m.room.member"}
    assert prune_event({}, room_version) == {}


@pytest.mark.parametrize("room_version", KNOWN_ROOM_VERSIONS)
def test_content_that_is_not_an_object_prunes_to_empty(room_version: str) -> None:
    assert prune_event({"type": "m.room.member", "content": "x"}, room_version) == {
        "type": "m.room.member",
        "content": {},
    }


@pytest.mark.parametrize("room_version", KNOWN_ROOM_VERSIONS)
def test_without_a_string_type_no_content_is_kept(room_version: str) -> None:
    assert prune_event({"content": {"membership": "join"}}, room_version) == {"content": {}}
    assert prune_event({"type": 5, "content": {"membership": "join"}}, room_version) == {"type": 5, "content": {}}


# ---------------------------------------------------------------------------------------------------------
# Content keys, per event type and room version

SIGNED = {"mxid": "@alice:example.org", "token": "abc123", "signatures": {"magic.forest": {"ed25519:3": "sig"}}}

EVERY_CONTENT_KEY: dict[str, Any] = {
    "membership": "join",
    "join_authorised_via_users_server": "@admin:example.org",
    "third_party_invite": {"display_name": "alice", "signed": SIGNED},
    "displayname": "Alice",
    "creator": "@u:example.org",
    "room_version": "5",
    "predecessor": {"room_id": "!old:example.org", "event_id": "$old"},
    "join_rule": "restricted",
    "allow": [{"type": "m.room_membership", "room_id": "!space:example.org"}],
    "users": {"@u:example.org": 100},
    "users_default": 0,
    "events": {"m.room.name": 50},
    "events_default": 0,
    "state_default": 50,
    "ban": 50,
    "kick": 50,
    "redact": 50,
    "invite": 0,
    "notifications": {"room": 50},
    "aliases": ["#a:example.org"],
    "history_visibility": "shared",
    "redacts": "$target",
    "body": "hello",
    "m.relates_to": {"rel_type": "m.thread", "event_id": "$root"},
    "other_key": "stripped",
}

POWER_LEVELS = {"users", "users_default", "events", "events_default", "state_default", "ban", "kick", "redact"}

# (event type, room versions, content keys kept); "ALL" keeps the whole content.
CONTENT_RULES: list[tuple[str, list[str], set[str] | str]] = [
    ("m.room.member", versions(1, 8), {"membership"}),
    ("m.room.member", versions(9, 10), {"membership", "join_authorised_via_users_server"}),
    ("m.room.member", ["11"], {"membership", "join_authorised_via_users_server", "third_party_invite"}),
    ("m.room.create", versions(1, 10), {"creator"}),
    ("m.room.create", ["11"], "ALL"),
    ("m.room.join_rules", versions(1, 7), {"join_rule"}),
    ("m.room.join_rules", versions(8, 11), {"join_rule", "allow"}),
    ("m.room.power_levels", versions(1, 10), POWER_LEVELS),
    ("m.room.power_levels", ["11"], POWER_LEVELS | {"invite"}),
    ("m.room.aliases", versions(1, 5), {"aliases"}),
    ("m.room.aliases", versions(6, 11), set()),
    ("m.room.history_visibility", versions(1, 11), {"history_visibility"}),
    ("m.room.redaction", versions(1, 10), set()),
    ("m.room.redaction", ["11"], {"redacts"}),
    ("m.room.message", versions(1, 11), set()),
    ("m.room.name", versions(1, 11), set()),
    ("m.room.topic", versions(1, 11), set()),
    ("org.example.custom", versions(1, 11), set()),
]


def _expected_content(event_type: str, room_version: str, kept: set[str] | str) -> dict[str, Any]:
    if kept == "ALL":
        return EVERY_CONTENT_KEY
    expected = {key: EVERY_CONTENT_KEY[key] for key in kept}
    if "third_party_invite" in expected:  # version 11 keeps only its ``signed``
        expected["third_party_invite"] = {"signed": SIGNED}
    return expected


@pytest.mark.parametrize(
    ("event_type", "room_version", "kept"),
    [(event_type, version, kept) for event_type, rule_versions, kept in CONTENT_RULES for version in rule_versions],
)
def test_kept_content_keys(event_type: str, room_version: str, kept: set[str] | str) -> None:
    event = {"type": event_type, "state_key": "", "content": EVERY_CONTENT_KEY}
    pruned = prune_event(event, room_version)
    assert pruned["content"] == _expected_content(event_type, room_version, kept)


def test_content_rules_cover_every_version_of_every_special_type() -> None:
    for event_type in {rule[0] for rule in CONTENT_RULES}:
        covered = [
            version
            for rule_type, rule_versions, _ in CONTENT_RULES
            if rule_type == event_type
            for version in rule_versions
        ]
        assert sorted(covered, key=int) == list(KNOWN_ROOM_VERSIONS), event_type


@pytest.mark.parametrize(
    ("third_party_invite", "expected"),
    [
        ({"display_name": "alice", "signed": SIGNED}, {"third_party_invite": {"signed": SIGNED}}),
        ({"display_name": "alice"}, {"third_party_invite": {}}),
        ({}, {"third_party_invite": {}}),
        ("not an object", {}),
        (["signed"], {}),
    ],
)
def test_v11_member_third_party_invite(third_party_invite: object, expected: dict[str, Any]) -> None:
    event = {"type": "m.room.member", "content": {"membership": "invite", "third_party_invite": third_party_invite}}
    assert prune_event(event, "11")["content"] == {"membership": "invite", **expected}


@pytest.mark.parametrize("room_version", versions(1, 10))
def test_member_third_party_invite_dropped_before_v11(room_version: str) -> None:
    event = {"type": "m.room.member", "content": {"membership": "invite", "third_party_invite": {"signed": SIGNED}}}
    assert prune_event(event, room_version)["content"] == {"membership": "invite"}


# ---------------------------------------------------------------------------------------------------------
# No mutation, no sharing


@pytest.mark.parametrize("room_version", KNOWN_ROOM_VERSIONS)
@pytest.mark.parametrize("event_type", sorted({rule[0] for rule in CONTENT_RULES}))
def test_input_is_not_mutated_and_nothing_is_shared(event_type: str, room_version: str) -> None:
    event = {**EVERY_TOP_LEVEL_KEY, "type": event_type, "content": copy.deepcopy(EVERY_CONTENT_KEY)}
    before = copy.deepcopy(event)
    pruned = prune_event(event, room_version)
    assert event == before
    _scribble(pruned)
    assert event == before


def _scribble(value: Any) -> None:
    """Modify every container inside ``value`` in place."""
    if isinstance(value, dict):
        for item in value.values():
            _scribble(item)
        value["scribbled"] = True
    elif isinstance(value, list):
        for item in value:
            _scribble(item)
        value.append("scribbled")


# ---------------------------------------------------------------------------------------------------------
# Unknown room versions


@pytest.mark.parametrize("room_version", ["0", "12", "", "1.0", " 1", "v1", "org.matrix.msc2176", 1, None])
def test_unknown_room_versions_refused(room_version: Any) -> None:
    with pytest.raises(UnknownRoomVersion, match="unknown room version"):
        prune_event({"type": "A", "content": {}}, room_version)
    with pytest.raises(UnknownRoomVersion):
        redacts_target({"type": "m.room.redaction", "redacts": "$x"}, room_version)
    with pytest.raises(UnknownRoomVersion):
        check_room_version(room_version)


def test_unknown_room_version_is_a_value_error() -> None:
    assert issubclass(UnknownRoomVersion, ValueError)
    with pytest.raises(UnknownRoomVersion, match="'12': the known versions are 1, 2, 3"):
        check_room_version("12")


# ---------------------------------------------------------------------------------------------------------
# redacts_target


@pytest.mark.parametrize("room_version", versions(1, 10))
def test_redacts_target_before_v11_is_top_level(room_version: str) -> None:
    event = {"type": "m.room.redaction", "redacts": "$top", "content": {"redacts": "$content"}}
    assert redacts_target(event, room_version) == "$top"
    assert redacts_target({"type": "m.room.redaction", "content": {"redacts": "$content"}}, room_version) is None


def test_redacts_target_v11_is_content_only() -> None:
    event = {"type": "m.room.redaction", "redacts": "$top", "content": {"redacts": "$content"}}
    assert redacts_target(event, "11") == "$content"
    assert redacts_target({"type": "m.room.redaction", "redacts": "$top", "content": {}}, "11") is None
    assert redacts_target({"type": "m.room.redaction", "redacts": "$top", "content": {"redacts": 5}}, "11") is None
    assert redacts_target({"type": "m.room.redaction", "redacts": "$top", "content": "x"}, "11") is None


@pytest.mark.parametrize("room_version", KNOWN_ROOM_VERSIONS)
@pytest.mark.parametrize(
    "event",
    [
        {"type": "m.room.redaction", "content": {}},
        {"type": "m.room.redaction", "redacts": 5, "content": {"redacts": ["$x"]}},
        {"type": "m.room.redaction", "redacts": None},
        {"type": "m.room.message", "redacts": "$x", "content": {"redacts": "$x"}},
        {"redacts": "$x", "content": {"redacts": "$x"}},
    ],
)
def test_redacts_target_none(event: dict[str, Any], room_version: str) -> None:
    assert redacts_target(event, room_version) is None


# ---------------------------------------------------------------------------------------------------------
# Worked examples adapted from Synapse's tests


def test_synapse_basic_keys_v1() -> None:
    event = {
        "event_id": "$3:domain",
        "type": "A",
        "room_id": "!1:domain",
        "sender": "@2:domain",
        "state_key": "B",
        "content": {"other_key": "foo"},
        "hashes": {"sha256": "abc"},
        "signatures": {"domain": {"algo:1": "sigs"}},
        "depth": 4,
        "prev_events": [],
        "prev_state": "prev_state",
        "auth_events": [],
        "origin": "domain",
        "origin_server_ts": 1234,
        "membership": "join",
        "other_key": "foo",
    }
    expected = {key: value for key, value in event.items() if key != "other_key"}
    expected["content"] = {}
    assert prune_event(event, "1") == expected
    assert prune_event({"type": "A", "prev_state": "prev_state", "membership": "join"}, "11") == {"type": "A"}


def test_synapse_message_v10_and_v11() -> None:
    # From Synapse's rust/src/events/utils.rs, with an extra top-level key it must drop.
    event = {**SYNAPSE_MESSAGE, "unknown_key": "unknown_value"}
    expected_v10 = {key: value for key, value in SYNAPSE_MESSAGE.items() if key not in {"unsigned", "content"}}
    expected_v10["content"] = {}
    assert prune_event(event, "10") == expected_v10
    expected_v11 = {key: value for key, value in expected_v10.items() if key != "origin"}
    assert prune_event(event, "11") == expected_v11


def test_synapse_create_v11_keeps_all_content() -> None:
    event = {"type": "m.room.create", "content": {"not_a_real_key": True}, "nonsense_field": "garbage"}
    assert prune_event(event, "11") == {"type": "m.room.create", "content": {"not_a_real_key": True}}
    assert prune_event(event, "10") == {"type": "m.room.create", "content": {}}


def test_synapse_relations_are_not_protected_in_standard_versions() -> None:
    # MSC3389 (keeping m.relates_to) is in no room version up to 11.
    event = {"type": "m.room.message", "content": {"body": "foo", "m.relates_to": {"rel_type": "r", "event_id": "$p"}}}
    for room_version in KNOWN_ROOM_VERSIONS:
        assert prune_event(event, room_version)["content"] == {}


# ---------------------------------------------------------------------------------------------------------
# Properties over generated events

json_leaves = st.none() | st.booleans() | st.integers() | st.text(max_size=8)
json_values = st.recursive(
    json_leaves,
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=6), children, max_size=3),
    max_leaves=8,
)
SPECIAL_TYPES = [rule[0] for rule in CONTENT_RULES]
third_party_invites = st.one_of(
    json_values,
    st.fixed_dictionaries({}, optional={"signed": json_values, "display_name": json_values}),
)
contents = st.one_of(
    st.dictionaries(
        st.sampled_from(sorted(EVERY_CONTENT_KEY)) | st.text(max_size=6),
        json_values,
        max_size=8,
    ).flatmap(
        lambda content: st.fixed_dictionaries({}, optional={"third_party_invite": third_party_invites}).map(
            lambda extra: {**content, **extra}
        )
    ),
    json_values,
)
events = st.dictionaries(
    st.sampled_from(sorted(EVERY_TOP_LEVEL_KEY)) | st.text(max_size=6),
    json_values,
    max_size=10,
).flatmap(
    lambda event: st.fixed_dictionaries(
        {},
        optional={"type": st.sampled_from(SPECIAL_TYPES) | st.text(max_size=10), "content": contents},
    ).map(lambda extra: {**event, **extra})
)


@given(events, st.sampled_from(KNOWN_ROOM_VERSIONS))
def test_pruning_is_idempotent(event: dict[str, Any], room_version: str) -> None:
    once = prune_event(event, room_version)
    assert prune_event(once, room_version) == once


@given(events, st.sampled_from(KNOWN_ROOM_VERSIONS))
def test_pruned_keys_are_a_subset_and_input_untouched(event: dict[str, Any], room_version: str) -> None:
    before = copy.deepcopy(event)
    pruned = prune_event(event, room_version)
    assert event == before
    assert set(pruned) <= set(event)
    assert "unsigned" not in pruned
    if isinstance(event.get("content"), dict):
        assert set(pruned["content"]) <= set(event["content"])
    for key, value in pruned.items():
        if key != "content":
            assert value == event[key]
