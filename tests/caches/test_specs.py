"""CacheSpec: key types, room-state keys and reserved names are validated when the spec is made."""

from __future__ import annotations

import pytest

from factstream import CacheSpec


def test_key_types_default_to_strings():
    assert CacheSpec("c", key_arity=2).key_types == (str, str)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"key_arity": 2, "key_types": (str,)}, "key_types must give str or int for each of the 2"),
        ({"key_arity": 1, "key_types": (float,)}, "key_types must give str or int"),
        ({"key_arity": 2, "depends_on_room_state": True, "room_state_key": "room"}, "needs keys of 1 str"),
        ({"key_arity": 1, "key_types": (int,), "depends_on_room_state": True}, "needs keys of 1 str"),
        ({"key_arity": 3, "depends_on_room_state": True}, "say which keys room-state changes invalidate"),
        ({"room_state_key": "room"}, "room_state_key needs depends_on_room_state=True"),
        ({"depends_on_room_state": True, "room_state_key": "house"}, "room_state_key must be one of"),
    ],
)
def test_inconsistent_specs_are_refused(kwargs, message):
    with pytest.raises(ValueError, match=message):
        CacheSpec("c", **kwargs)


@pytest.mark.parametrize(("arity", "mode"), [(0, "all"), (1, "room"), (2, "room_member")])
def test_the_room_state_key_follows_from_the_arity_when_left_out(arity, mode):
    assert CacheSpec("c", key_arity=arity, depends_on_room_state=True).room_state_key == mode


@pytest.mark.parametrize("name", ["cs_cache_fake", "ph_cache_fake", "dr_cache_fake"])
def test_special_names_cannot_be_registered_as_caches(name):
    with pytest.raises(ValueError, match="reserved"):
        CacheSpec(name)
