"""``StateMap``, the flat read-only view ``Reads.state_ids`` returns over a stored state: it must answer
every mapping question exactly as the flat dict of the same state would (property-based)."""

from __future__ import annotations

import pytest
from factstream_events.rules.statemath import StateMap, flatten
from hypothesis import given
from hypothesis import strategies as st

keys = st.text(alphabet="abcm.@:!_", max_size=6)
states = st.dictionaries(keys, st.dictionaries(keys, st.text(min_size=1, max_size=8), max_size=5), max_size=5)


@given(states, st.lists(st.tuples(keys, keys), max_size=6))
def test_a_state_map_answers_as_the_flat_dict(state, probes):
    flat = flatten(state)
    view = StateMap(state)
    assert view == flat and flat == view
    assert len(view) == len(flat)
    assert list(view) == list(flat)  # the same order: type by type, as stored
    assert dict(view.items()) == flat and sorted(view.values()) == sorted(flat.values())
    for key in [*flat, *probes]:
        assert (key in view) == (key in flat)
        assert view.get(key) == flat.get(key)
    for odd in ("m.room.member", ("a",), ("a", "b", "c"), None):
        assert odd not in view


def test_a_state_map_is_read_only():
    view = StateMap({"m.room.member": {"@a:hs": "$1"}})
    assert not hasattr(view, "__setitem__") and not hasattr(view, "pop")
    assert view[("m.room.member", "@a:hs")] == "$1"
    with pytest.raises(KeyError):
        view[("m.room.member", "@b:hs")]
