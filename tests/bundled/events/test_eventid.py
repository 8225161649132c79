"""factstream_events.rules.eventid: content hashes, reference hashes and event IDs.

Known vectors (events and the hashes/IDs other implementations computed for them):

* Synapse ``tests/crypto/test_event_signing.py``: content hashes of a minimal event and of a message;
* the Matrix specification's event signing examples (appendices), as used by gomatrixserverlib's
  ``eventcrypto_test.go``: content hashes of the same events with ``origin``;
* gomatrixserverlib ``eventversion_test.go``: a room version 1 event (its embedded ID and content hash) and
  a real create event from jki.re whose ID is given for room versions 3 and 4;
* Synapse ``rust/src/events/utils.rs``: a real message whose ID is given for room versions 10 and 3;
* RocketChat/homeserver ``packages/room/src/manager/v9.spec.ts``: a member event ID in room version 10.

No public vector with non-ASCII text was found, so the unicode vectors below hash canonical forms written
out by hand from the spec's rules, with the digests computed outside Python
(``printf '%s' '<canonical form>' | sha256sum``, then base64).
"""

from __future__ import annotations

import base64
import copy
import hashlib
from typing import Any

import pytest
from factstream_events.rules.canonical import CanonicalJsonError, canonical_json, parse_event_json
from factstream_events.rules.eventid import (
    EventIdError,
    content_hash,
    event_id_for,
    is_valid_event_id,
    local_event_id,
    reference_hash,
)
from factstream_events.rules.prune import KNOWN_ROOM_VERSIONS, UnknownRoomVersion, prune_event

SYNAPSE_MINIMAL = {
    "event_id": "$0:domain",
    "origin_server_ts": 1000000,
    "signatures": {},
    "type": "X",
    "content": {},
    "unsigned": {"age_ts": 1000000},
}
SYNAPSE_SIGNED_MESSAGE = {
    "content": {"body": "Here is the message content"},
    "event_id": "$0:domain",
    "origin_server_ts": 1000000,
    "type": "m.room.message",
    "room_id": "!r:domain",
    "sender": "@u:domain",
    "signatures": {},
    "unsigned": {"age_ts": 1000000},
}
SPEC_MINIMAL = {
    "event_id": "$0:domain",
    "hashes": {"sha256": "6tJjLpXtggfke8UxFhAKg82QVkJzvKOVOOSjUDK4ZSI"},
    "origin": "domain",
    "origin_server_ts": 1000000,
    "signatures": {
        "domain": {
            "ed25519:1": "2Wptgo4CwmLo/Y8B8qinxApKaCkBG2fjTWB7AbP5Uy+aIbygsSdLOFzvdDjww8zUVKCmI02eP9xtyJxc/cLiBA"
        }
    },
    "type": "X",
    "unsigned": {"age_ts": 1000000},
}
SPEC_MESSAGE = {
    "content": {"body": "Here is the message content"},
    "event_id": "$0:domain",
    "hashes": {"sha256": "onLKD1bGljeBWQhWZ1kaP9SorVmRQNdN5aM2JYU2n/g"},
    "origin": "domain",
    "origin_server_ts": 1000000,
    "type": "m.room.message",
    "room_id": "!r:domain",
    "sender": "@u:domain",
    "signatures": {
        "domain": {
            "ed25519:1": "Wm+VzmOUOz08Ds+0NTWb1d4CZrVsJSikkeRxh6aCcUwu6pNC78FunoD7KNWzqFn241eYHYMGCA5McEiVPdhzBA"
        }
    },
    "unsigned": {"age_ts": 1000000},
}
GMSL_V1_EVENT = parse_event_json(
    '{"auth_events":[["$oXL79cT7fFxR7dPH:localhost",{"sha256":"abjkiDSg1RkuZrbj2jZoGMlQaaj1Ue3Jhi7I7NlKfXY"}],'
    '["$IVUsaSkm1LBAZYYh:localhost",{"sha256":"X7RUj46hM/8sUHNBIFkStbOauPvbDzjSdH4NibYWnko"}],'
    '["$VS2QT0EeArZYi8wf:localhost",{"sha256":"k9eM6utkCH8vhLW9/oRsH74jOBS/6RVK42iGDFbylno"}]],'
    '"content":{"name":"test3"},"depth":7,"event_id":"$yvN1b43rlmcOs5fY:localhost",'
    '"hashes":{"sha256":"Oh1mwI1jEqZ3tgJ+V1Dmu5nOEGpCE4RFUqyJv2gQXKs"},"origin":"localhost",'
    '"origin_server_ts":1510854416361,"prev_events":[["$FqI6TVvWpcbcnJ97:localhost",'
    '{"sha256":"upCsBqUhNUgT2/+zkzg8TbqdQpWWKQnZpGJc6KcbUC4"}]],"prev_state":[],'
    '"room_id":"!19Mp0U9hjajeIiw1:localhost","sender":"@test:localhost","signatures":{"localhost":'
    '{"ed25519:u9kP":"5IzSuRXkxvbTp0vZhhXYZeOe+619iG3AybJXr7zfNn/4vHz4TH7qSJVQXSaHHvcTcDodAKHnTG1WDulgO5okAQ"}},'
    '"state_key":"","type":"m.room.name"}'
)
GMSL_CREATE_EVENT = parse_event_json(
    '{"auth_events": [], "prev_events": [], "type": "m.room.create", "room_id": "!uXDCzlYgCTHtiWCkEx:jki.re",'
    ' "sender": "@erikj:jki.re", "content": {"room_version": "5", "predecessor": {"room_id":'
    ' "!gdRMqOrTFdOCYHNwOo:half-shot.uk", "event_id": "$LP7ROBc4b+cMc1UE9haIz8q5AK2AIW4eJ90FfKLvyZI"},'
    ' "creator": "@erikj:jki.re"}, "depth": 1, "prev_state": [], "state_key": "", "origin": "jki.re",'
    ' "origin_server_ts": 1560284621137, "hashes": {"sha256": "IX6zuNiJpJPNf70BLleL3HSCpjKeq9Uhu7uUpyDjBmc"},'
    ' "signatures": {"jki.re": {"ed25519:auto": "O4IyFfF2PPtGp5uaDm8t57dZbdh8vc8Q64LgCwvzYRVItAMI0uisfiAFaxkVT7MRpzh6N'
    '2QNN5NMRXZKmgPYDA"}}, "unsigned": {"age": 1321650}}'
)
SYNAPSE_MESSAGE = {
    "auth_events": [
        "$gbHO7IPUHybc7ULFnT7P0r3iWlZFHGmr6zBfEYCUyKw",
        "$hy1eZFYcgNxMFNNBgCD5fyOzyWRcBkxfNcrUI5ZpZlE",
        "$Nt_z68EwFfPqBeHjzEHGsp461Z4EfNEzR-KH5bOYdOY",
    ],
    "prev_events": ["$4FbpZrgPQTwoLD9H5y7jcikucCypUOn78mXhQX7WliY"],
    "type": "m.room.message",
    "room_id": "!DHmIIVvxFASSFgDGzr:localhost:8008",
    "sender": "@tester_b:localhost:8008",
    "content": {"msgtype": "m.text", "body": "invited people can see history", "m.mentions": {}},
    "depth": 24,
    "origin": "localhost:8008",
    "origin_server_ts": 1731769874137,
    "hashes": {"sha256": "FoYV1w3TW/B2mVT0gX2/BZKpCwrrvGXqXFdUhN9LZYU"},
    "signatures": {
        "localhost:8008": {
            "ed25519:a_phSE": "G8cfk/m97sndxMNrEZ2nMMSXkVeJE05G7if4JiVzAwGfD3TwnF/jfSHt2acWrpNqv/aEhZug3WLofc2id+rVBw"
        }
    },
    "unsigned": {"age_ts": 1731769874137},
}
ROCKETCHAT_MEMBER = {
    "type": "m.room.member",
    "auth_events": [
        "$gbm6Tyhskcai9hxHXAh7RCoDlrwl1GFf4pWd1P6ELM4",
        "$g5tzeYmxj1ulmzQv07uDZZztxHhiebe5WH7Gg7npwd0",
        "$LrAkyyTl5j9Pda7DWo8_epIKa0Q0r6Epw2UHQnSIukI",
        "$HFVJ9Ub_2je7bL2LM9uiK1HBYZA0nYDevMT3e-8s_5I",
    ],
    "content": {"avatar_url": "mxc://matrix.org/MyC00lAvatar", "displayname": "@diego:rc1", "membership": "invite"},
    "depth": 8,
    "hashes": {"sha256": "AVnMNw6L0jAq69eJUfDRYfmwRVrkh3qKmAStKSvscsI"},
    "origin_server_ts": 1756156853485,
    "prev_events": ["$HhSZakbJx7fbn5zMxn7QQHCsRFHjEMRa3OIQdCdR2oc"],
    "room_id": "!cIgsCPRFcbabBKlTRk:hs2",
    "sender": "@admin:hs2",
    "unsigned": {"age": 5, "invite_room_state": []},
    "signatures": {},
    "state_key": "@diego:rc1",
}
UNICODE_CREATE = {
    "auth_events": [],
    "content": {"name": "Caf\u00e9 \u2615 \u65e5\u672c", "room_version": "11"},
    "depth": 1,
    "hashes": {"sha256": "x"},
    "origin": "example.org",
    "origin_server_ts": 1,
    "prev_events": [],
    "room_id": "!r:example.org",
    "sender": "@\u00fc:example.org",
    "signatures": {"example.org": {"ed25519:1": "sig"}},
    "state_key": "",
    "type": "m.room.create",
    "unsigned": {"age": 7},
}
# The canonical forms of UNICODE_CREATE, written out by hand: whole (for the content hash) and pruned for
# room version 11 (no origin, signatures, unsigned; create keeps all content).
UNICODE_CREATE_CONTENT_HASHED = (
    '{"auth_events":[],"content":{"name":"Café ☕ 日本","room_version":"11"},"depth":1,"origin":"example.org",'
    '"origin_server_ts":1,"prev_events":[],"room_id":"!r:example.org","sender":"@ü:example.org","state_key":"",'
    '"type":"m.room.create"}'
)
UNICODE_CREATE_REFERENCE_HASHED = (
    '{"auth_events":[],"content":{"name":"Café ☕ 日本","room_version":"11"},"depth":1,"hashes":{"sha256":"x"},'
    '"origin_server_ts":1,"prev_events":[],"room_id":"!r:example.org","sender":"@ü:example.org","state_key":"",'
    '"type":"m.room.create"}'
)


# ---------------------------------------------------------------------------------------------------------
# Content hash


@pytest.mark.parametrize(
    ("event", "expected"),
    [
        (SYNAPSE_MINIMAL, "mq4QfPPpC+QsBd6eqfVsmJIEz8uvMSVK0+AU67PLESk"),
        (SYNAPSE_SIGNED_MESSAGE, "rDCeYBepPlI891h/RkI2/Lkf9bt7u0TxFku4tMs7WKk"),
        (SPEC_MINIMAL, "6tJjLpXtggfke8UxFhAKg82QVkJzvKOVOOSjUDK4ZSI"),
        (SPEC_MESSAGE, "onLKD1bGljeBWQhWZ1kaP9SorVmRQNdN5aM2JYU2n/g"),
        (GMSL_V1_EVENT, "Oh1mwI1jEqZ3tgJ+V1Dmu5nOEGpCE4RFUqyJv2gQXKs"),
        (GMSL_CREATE_EVENT, "IX6zuNiJpJPNf70BLleL3HSCpjKeq9Uhu7uUpyDjBmc"),
        (SYNAPSE_MESSAGE, "FoYV1w3TW/B2mVT0gX2/BZKpCwrrvGXqXFdUhN9LZYU"),
        (ROCKETCHAT_MEMBER, "AVnMNw6L0jAq69eJUfDRYfmwRVrkh3qKmAStKSvscsI"),
        (UNICODE_CREATE, "iB5MqP8kw6l701xgMBJotTlzQfqivQ2XGjLXIHb8NUc"),
        ({"a": "日本語"}, "sBkHf60/CSJeOPGUwF7fg81aWlBPoExVuawfSnj6Jwc"),  # the spec's canonical JSON example
    ],
    ids=[
        "synapse-minimal",
        "synapse-message",
        "spec-minimal",
        "spec-message",
        "gmsl-v1",
        "gmsl-create",
        "synapse-rust-message",
        "rocketchat-member",
        "unicode-create",
        "unicode-spec",
    ],
)
def test_content_hash_vectors(event: dict[str, Any], expected: str) -> None:
    before = copy.deepcopy(event)
    assert content_hash(event) == expected
    assert event == before


def test_unicode_canonical_forms_are_as_written() -> None:
    assert canonical_json(
        {k: v for k, v in UNICODE_CREATE.items() if k not in {"hashes", "signatures", "unsigned"}}
    ) == (UNICODE_CREATE_CONTENT_HASHED.encode("utf-8"))
    pruned = prune_event(UNICODE_CREATE, "11")
    del pruned["signatures"]
    assert canonical_json(pruned) == UNICODE_CREATE_REFERENCE_HASHED.encode("utf-8")


def test_content_hash_ignores_unsigned_signatures_and_hashes_only() -> None:
    base = {"type": "m.room.message", "content": {"body": "hi"}, "origin_server_ts": 1}
    decorated = {**base, "unsigned": {"age": 1}, "signatures": {"s": {"k": "v"}}, "hashes": {"sha256": "old"}}
    assert content_hash(decorated) == content_hash(base)
    assert content_hash({**base, "content": {"body": "ho"}}) != content_hash(base)
    assert content_hash({**base, "event_id": "$x"}) != content_hash(base)


def test_content_hash_refuses_floats() -> None:
    with pytest.raises(CanonicalJsonError, match=r"^content\.n: "):
        content_hash({"type": "m.room.message", "content": {"n": 0.5}})


# ---------------------------------------------------------------------------------------------------------
# Reference hash and event IDs

HASH_ID_VECTORS = [
    (GMSL_CREATE_EVENT, "3", "$RrGxF28UrHLmoASHndYb9Jb/1SFww2ptmtur9INS438"),
    *[(GMSL_CREATE_EVENT, version, "$RrGxF28UrHLmoASHndYb9Jb_1SFww2ptmtur9INS438") for version in ["4", "5", "10"]],
    (SYNAPSE_MESSAGE, "10", "$zRz9jjiT9wZc3Hl9ij_74aCmTjqV3YMlj9sj3Uqxg6o"),
    (SYNAPSE_MESSAGE, "3", "$zRz9jjiT9wZc3Hl9ij/74aCmTjqV3YMlj9sj3Uqxg6o"),
    (ROCKETCHAT_MEMBER, "10", "$iCA3OWE1EGtPVWIyGudgmifuJcIluQw88FuK_gd0FpM"),
    (UNICODE_CREATE, "11", "$4Ri-iHM61JQE_Uq5-IlaYYddTzxEIY539QCeLn5FoGE"),
]


@pytest.mark.parametrize(("event", "room_version", "expected"), HASH_ID_VECTORS)
def test_event_id_vectors(event: dict[str, Any], room_version: str, expected: str) -> None:
    before = copy.deepcopy(event)
    assert event_id_for(event, room_version) == expected
    assert event == before


@pytest.mark.parametrize(("event", "room_version", "expected"), HASH_ID_VECTORS)
def test_reference_hash_is_the_event_id_decoded(event: dict[str, Any], room_version: str, expected: str) -> None:
    digest = reference_hash(event, room_version)
    assert len(digest) == 32
    padded = expected[1:] + "="
    decode = base64.b64decode if room_version == "3" else base64.urlsafe_b64decode
    assert digest == decode(padded)


@pytest.mark.parametrize(("event", "room_version", "expected"), HASH_ID_VECTORS)
def test_event_id_survives_redaction(event: dict[str, Any], room_version: str, expected: str) -> None:
    assert event_id_for(prune_event(event, room_version), room_version) == expected


def test_reference_hash_of_unicode_event_is_sha256_of_its_pruned_canonical_form() -> None:
    assert reference_hash(UNICODE_CREATE, "11") == hashlib.sha256(UNICODE_CREATE_REFERENCE_HASHED.encode()).digest()


def test_v11_pruning_changes_the_id() -> None:
    # The create event keeps all content in version 11 and drops origin and prev_state: another ID.
    assert event_id_for(GMSL_CREATE_EVENT, "11") != event_id_for(GMSL_CREATE_EVENT, "10")


def test_v11_message_id_ignores_origin() -> None:
    without_origin = {key: value for key, value in SYNAPSE_MESSAGE.items() if key != "origin"}
    assert event_id_for(without_origin, "11") == event_id_for(SYNAPSE_MESSAGE, "11")
    assert event_id_for(without_origin, "10") != event_id_for(SYNAPSE_MESSAGE, "10")


@pytest.mark.parametrize("room_version", ["1", "2"])
def test_embedded_event_ids(room_version: str) -> None:
    assert event_id_for(GMSL_V1_EVENT, room_version) == "$yvN1b43rlmcOs5fY:localhost"


@pytest.mark.parametrize("room_version", ["1", "2"])
@pytest.mark.parametrize(
    ("event_id", "message"),
    [(None, "has none"), (5, "not a valid event ID"), ("abc", "not a valid event ID"), ("$", "not a valid event ID")],
)
def test_embedded_event_id_must_be_present_and_valid(room_version: str, event_id: Any, message: str) -> None:
    event = {"type": "m.room.message", "content": {}}
    if event_id is not None:
        event["event_id"] = event_id
    with pytest.raises(EventIdError, match=message):
        event_id_for(event, room_version)


def test_event_id_key_is_hashed_in_v1_v2_but_ignored_from_v3() -> None:
    other = {**GMSL_CREATE_EVENT, "event_id": "$somethingelse"}
    for room_version in ["1", "2"]:
        assert reference_hash(other, room_version) != reference_hash(GMSL_CREATE_EVENT, room_version)
    for room_version in KNOWN_ROOM_VERSIONS[2:]:
        assert reference_hash(other, room_version) == reference_hash(GMSL_CREATE_EVENT, room_version)


def test_reference_hash_ignores_signatures_unsigned_and_age_ts() -> None:
    stripped = {key: value for key, value in SYNAPSE_MESSAGE.items() if key not in {"signatures", "unsigned"}}
    stripped["age_ts"] = 99
    stripped["content"] = {"body": "redacted away anyway"}
    assert reference_hash(stripped, "10") == reference_hash(SYNAPSE_MESSAGE, "10")


@pytest.mark.parametrize("room_version", ["0", "12", "", "v4"])
def test_unknown_room_versions_refused(room_version: str) -> None:
    with pytest.raises(UnknownRoomVersion):
        event_id_for(SYNAPSE_MESSAGE, room_version)
    with pytest.raises(UnknownRoomVersion):
        reference_hash(SYNAPSE_MESSAGE, room_version)
    with pytest.raises(UnknownRoomVersion):
        local_event_id(SYNAPSE_MESSAGE, room_version)


def test_event_id_error_is_a_value_error() -> None:
    assert issubclass(EventIdError, ValueError)


# ---------------------------------------------------------------------------------------------------------
# is_valid_event_id


@pytest.mark.parametrize(
    "event_id",
    [
        "$a",
        "$yvN1b43rlmcOs5fY:localhost",
        "$RrGxF28UrHLmoASHndYb9Jb/1SFww2ptmtur9INS438",
        "$RrGxF28UrHLmoASHndYb9Jb_1SFww2ptmtur9INS438",
        "$" + "a" * 254,
        "$" + "é" * 127,  # 255 bytes
    ],
)
def test_valid_event_ids(event_id: str) -> None:
    assert is_valid_event_id(event_id)


@pytest.mark.parametrize(
    "event_id",
    [
        "",
        "$",
        "a",
        "yvN1b43rlmcOs5fY:localhost",
        "!room:example.org",
        "$" + "a" * 255,  # 256 characters
        "$" + "é" * 128,  # 129 characters but 257 bytes
        "$a b",
        "$a\tb",
        "$a\n",
        "$a\u00a0b",  # no-break space
        "$a\x00b",
        "$\ud800",
    ],
)
def test_invalid_event_ids(event_id: str) -> None:
    assert not is_valid_event_id(event_id)


def test_non_strings_are_not_event_ids() -> None:
    assert not is_valid_event_id(None)  # type: ignore[arg-type]
    assert not is_valid_event_id(b"$abc")  # type: ignore[arg-type]


# ---------------------------------------------------------------------------------------------------------
# local_event_id

UNHASHED_SYNAPSE_MESSAGE = {
    key: value for key, value in SYNAPSE_MESSAGE.items() if key not in {"hashes", "signatures", "unsigned"}
}


def test_local_event_id_reproduces_real_ids() -> None:
    # Synapse computed these IDs after adding the content hash to the event: the same rule.
    assert local_event_id(UNHASHED_SYNAPSE_MESSAGE, "10") == "$zRz9jjiT9wZc3Hl9ij_74aCmTjqV3YMlj9sj3Uqxg6o"
    assert local_event_id(UNHASHED_SYNAPSE_MESSAGE, "3") == "$zRz9jjiT9wZc3Hl9ij/74aCmTjqV3YMlj9sj3Uqxg6o"
    unhashed_create = {
        key: value for key, value in GMSL_CREATE_EVENT.items() if key not in {"hashes", "signatures", "unsigned"}
    }
    assert local_event_id(unhashed_create, "4") == "$RrGxF28UrHLmoASHndYb9Jb_1SFww2ptmtur9INS438"


def test_local_event_id_is_event_id_for_the_hashed_event() -> None:
    hashed = {**UNHASHED_SYNAPSE_MESSAGE, "hashes": {"sha256": content_hash(UNHASHED_SYNAPSE_MESSAGE)}}
    for room_version in KNOWN_ROOM_VERSIONS[2:]:
        assert local_event_id(UNHASHED_SYNAPSE_MESSAGE, room_version) == event_id_for(hashed, room_version)


def test_events_differing_only_in_content_get_different_ids() -> None:
    first = {**UNHASHED_SYNAPSE_MESSAGE, "content": {"msgtype": "m.text", "body": "one"}}
    second = {**UNHASHED_SYNAPSE_MESSAGE, "content": {"msgtype": "m.text", "body": "two"}}
    # Without the content hash the pruned events (empty content) would be the same...
    assert event_id_for(first, "10") == event_id_for(second, "10")
    # ...which is why the content hash goes into ``hashes`` first.
    assert local_event_id(first, "10") != local_event_id(second, "10")


def test_local_event_id_does_not_modify_the_event_and_ignores_stale_fields() -> None:
    event = copy.deepcopy(UNHASHED_SYNAPSE_MESSAGE)
    expected = local_event_id(event, "10")
    assert event == UNHASHED_SYNAPSE_MESSAGE
    stale = {**event, "event_id": "$stale", "hashes": {"sha256": "stale", "other": "x"}, "unsigned": {"age": 3}}
    assert local_event_id(stale, "10") == expected


@pytest.mark.parametrize("room_version", KNOWN_ROOM_VERSIONS[3:])
def test_local_event_ids_are_url_safe_from_v4(room_version: str) -> None:
    event_id = local_event_id({"type": "m.room.message", "content": {"body": "日本語"}, "depth": 1}, room_version)
    assert is_valid_event_id(event_id)
    assert len(event_id) == 44
    assert not set(event_id) & {"+", "/", "="}


@pytest.mark.parametrize("room_version", ["1", "2"])
def test_local_event_id_refused_where_ids_are_not_derived(room_version: str) -> None:
    with pytest.raises(EventIdError, match="chosen by the sending server"):
        local_event_id(UNHASHED_SYNAPSE_MESSAGE, room_version)
