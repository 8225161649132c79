"""The stream change cache against a full log of changes: whenever it answers, it answers exactly."""

from __future__ import annotations

import pytest
from factstream_events.shared.changes import ChangeCache
from hypothesis import given, settings
from hypothesis import strategies as st

ENTITIES = st.sampled_from([f"!r{i}" for i in range(12)])


def truth(log, entity, since):
    return any(e == entity and s > since for e, s in log)


@settings(max_examples=200, deadline=None)
@given(
    changes=st.lists(st.tuples(ENTITIES, st.integers(1, 3)), max_size=80),
    size=st.integers(1, 10),
    start=st.integers(0, 5),
    queries=st.lists(st.tuples(ENTITIES, st.integers(0, 200)), max_size=20),
)
def test_answers_are_exact_or_unsure(changes, size, start, queries):
    cache = ChangeCache("t", start, max_entries=size)
    log = []
    position = start
    for entity, step in changes:
        # writers may deliver a little out of order: an ID up to 2 below the last one
        stream_id = max(start + 1, position + step - 2)
        position = max(position, stream_id)
        cache.changed(entity, stream_id)
        log.append((entity, stream_id))
    assert len(cache) <= size
    for entity, since in queries:
        if since >= cache.earliest:
            assert cache.has_changed_since(entity, since) == truth(log, entity, since)
            assert cache.changed_since([entity], since) == ({entity} if truth(log, entity, since) else set())
        else:
            assert cache.has_changed_since(entity, since)
            assert cache.changed_since([entity], since) is None


@settings(max_examples=100, deadline=None)
@given(
    stored=st.lists(st.tuples(ENTITIES, st.integers(1, 100)), max_size=40),
    live=st.lists(st.tuples(ENTITIES, st.integers(101, 150)), max_size=10),
    window=st.integers(1, 40),
)
def test_prefill_merges_with_what_arrived_meanwhile(stored, live, window):
    cache = ChangeCache("t", 100)
    for entity, stream_id in live:
        cache.changed(entity, stream_id)
    newest = sorted(stored, key=lambda c: c[1], reverse=True)[:window]
    floor = min(s for _, s in newest) if len(newest) == window and len(stored) > window else 0
    cache.prefill(newest, floor)
    log = stored + live
    assert cache.earliest == min(100, floor)
    for entity in {e for e, _ in log}:
        for since in range(cache.earliest, 151, 7):
            assert cache.has_changed_since(entity, since) == truth(log, entity, since)


def test_bad_size_is_refused():
    with pytest.raises(ValueError, match="max_entries"):
        ChangeCache("t", 0, max_entries=0)


def test_unsure_before_answers_unsure_for_earlier_positions_and_keeps_later_changes():
    cache = ChangeCache("t", 10)
    cache.changed("a", 12)
    cache.changed("b", 20)
    cache.unsure_before(15)
    assert cache.earliest == 15 and cache.last_change("a") is None and cache.last_change("b") == 20
    assert cache.has_changed_since("c", 14) and cache.changed_since(["c"], 14) is None
    assert not cache.has_changed_since("c", 15) and cache.changed_since(["b", "c"], 15) == {"b"}
    cache.unsure_before(5)  # never moves back
    assert cache.earliest == 15
