"""Applying replicated rows: the caches stream (per key, whole cache, cs_cache_fake fan-out), plugin
invalidation specs, and bad rows, which are logged with the row and skipped."""

from __future__ import annotations

import logging

import msgspec
import pytest

from factstream import CacheSpec, InvalidationSpec
from factstream.caches.apply import InvalidationApplier
from factstream.caches.invalidate import MEMBERS_PER_ROW, room_state_rows
from factstream.caches.registry import CacheRegistry


class Row(msgspec.Struct, frozen=True):
    """The caches stream's row shape (the plugin's CacheInvalidationRow has these fields)."""

    cache_func: str
    keys: list[object] | None
    invalidation_ts: int | None = 0


class NoteRow(msgspec.Struct, frozen=True):
    author: str
    room: str = ""


SPECS = [
    CacheSpec("display_name"),
    CacheSpec("unread", key_arity=2, key_types=(str, int)),
    CacheSpec("room_members", depends_on_room_state=True),  # (room_id,)
    CacheSpec("rooms_for_user", depends_on_room_state=True, room_state_key="member"),  # (user_id,)
    CacheSpec("member_profile", key_arity=2, depends_on_room_state=True),  # (room_id, user_id)
    CacheSpec("shared_rooms", key_arity=2, depends_on_room_state=True, room_state_key="all"),
    CacheSpec("notes_by_author"),
]


def make(invalidations: list[InvalidationSpec] | None = None) -> tuple[CacheRegistry, InvalidationApplier]:
    caches = CacheRegistry(SPECS)
    return caches, InvalidationApplier(caches, invalidations or [], caches_stream="caches")


def fill(caches: CacheRegistry, name: str, *keys: tuple[object, ...]) -> None:
    for key in keys:
        caches.get(name).set(key, "cached")


def test_a_row_with_keys_invalidates_that_key_only():
    caches, applier = make()
    fill(caches, "display_name", ("@a:hs",), ("@b:hs",))

    applier.apply("caches", [Row("display_name", ["@a:hs"])])

    assert caches.get("display_name").keys() == [("@b:hs",)]


def test_a_row_with_null_keys_clears_the_whole_cache():
    caches, applier = make()
    fill(caches, "display_name", ("@a:hs",), ("@b:hs",))
    fill(caches, "notes_by_author", ("@a:hs",))

    applier.apply("caches", [Row("display_name", None)])

    assert len(caches.get("display_name")) == 0
    assert len(caches.get("notes_by_author")) == 1


def test_int_key_components_travel_as_text_and_are_converted_back():
    caches, applier = make()
    fill(caches, "unread", ("@a:hs", 5), ("@a:hs", 6))

    applier.apply("caches", [Row("unread", ["@a:hs", "5"])])

    assert caches.get("unread").keys() == [("@a:hs", 6)]


def test_room_state_rows_chunk_members_fifty_to_a_row():
    members = [f"@u{i}:hs" for i in range(120)]

    rows = room_state_rows("!r:hs", members)

    assert [len(keys or []) - 1 for _, keys in rows] == [50, 50, 20]
    assert all(name == "cs_cache_fake" and keys and keys[0] == "!r:hs" for name, keys in rows)
    assert [m for _, keys in rows for m in (keys or [])[1:]] == members
    assert MEMBERS_PER_ROW == 50
    assert room_state_rows("!r:hs", []) == [("cs_cache_fake", ["!r:hs"])]


def test_cs_cache_fake_for_120_members_clears_every_state_dependent_cache_of_that_room_only():
    caches, applier = make()
    changed = [f"@u{i}:hs" for i in range(120)]
    fill(caches, "room_members", ("!r:hs",), ("!other:hs",))
    fill(caches, "rooms_for_user", *[(m,) for m in changed], ("@bystander:hs",))
    others = [("!r:hs", "@bystander:hs"), ("!other:hs", "@u1:hs")]
    fill(caches, "member_profile", *[("!r:hs", m) for m in changed], *others)
    fill(caches, "display_name", ("@u1:hs",))

    applier.apply("caches", [Row(name, keys) for name, keys in room_state_rows("!r:hs", changed)])

    assert caches.get("room_members").keys() == [("!other:hs",)]
    assert caches.get("rooms_for_user").keys() == [("@bystander:hs",)]
    assert caches.get("member_profile").keys() == [("!r:hs", "@bystander:hs"), ("!other:hs", "@u1:hs")]
    assert caches.get("display_name").keys() == [("@u1:hs",)]  # does not depend on room state


def test_cs_cache_fake_clears_caches_whose_keys_cannot_be_derived():
    caches, applier = make()
    fill(caches, "shared_rooms", ("@a:hs", "@b:hs"))

    applier.apply("caches", [Row("cs_cache_fake", ["!r:hs"])])

    assert len(caches.get("shared_rooms")) == 0


def test_cs_cache_fake_without_members_clears_the_room_key_but_no_member_keys():
    caches, applier = make()
    fill(caches, "room_members", ("!r:hs",))
    fill(caches, "member_profile", ("!r:hs", "@a:hs"))

    applier.apply("caches", [Row("cs_cache_fake", ["!r:hs"])])

    assert len(caches.get("room_members")) == 0
    assert len(caches.get("member_profile")) == 1


@pytest.mark.parametrize(
    ("row", "reason"),
    [
        (Row("no_such_cache", ["x"]), "no cache named 'no_such_cache'"),
        (Row("display_name", ["@a:hs", "extra"]), "2 key component(s), the cache's keys have 1"),
        (Row("display_name", [5]), "key component 5 is not a str"),
        (Row("unread", ["@a:hs", "five"]), "key component 'five' is not an int"),
        (Row("display_name", ["@a:hs", ["nested"]]), "key component(s)"),
        (Row("cs_cache_fake", None), "cs_cache_fake needs keys"),
        (Row("cs_cache_fake", []), "cs_cache_fake needs keys"),
        (Row("cs_cache_fake", ["!r:hs", 7]), "keys must be strings"),
        (Row("ph_cache_fake", ["!r:hs"]), "not supported"),
    ],
)
def test_a_bad_row_is_logged_with_the_row_and_skipped_and_the_next_rows_still_apply(row, reason, caplog):
    caches, applier = make()
    fill(caches, "display_name", ("@a:hs",), ("@b:hs",))

    with caplog.at_level(logging.WARNING, logger="factstream.caches.apply"):
        applier.apply("caches", [row, Row("display_name", ["@b:hs"])])

    assert caches.get("display_name").keys() == [("@a:hs",)]
    assert applier.skipped == 1
    [record] = caplog.records
    assert repr(row) in record.getMessage()
    assert reason in record.getMessage()


def test_plugin_invalidation_specs_invalidate_the_keys_each_row_names():
    def by_author(row: NoteRow) -> list[tuple[str]]:
        return [(row.author,)]

    caches, applier = make([InvalidationSpec("notes", "notes_by_author", by_author)])
    fill(caches, "notes_by_author", ("@a:hs",), ("@b:hs",))

    applier.apply("notes", [NoteRow("@a:hs")])

    assert caches.get("notes_by_author").keys() == [("@b:hs",)]


def test_an_invalidation_spec_returning_none_clears_its_cache():
    caches, applier = make([InvalidationSpec("notes", "notes_by_author", lambda row: None)])
    fill(caches, "notes_by_author", ("@a:hs",))

    applier.apply("notes", [NoteRow("@x:hs")])

    assert len(caches.get("notes_by_author")) == 0


@pytest.mark.parametrize(
    ("keys_of", "reason"),
    [
        (lambda row: [(row.author, "extra")], "has 2 component(s)"),
        (lambda row: [(len(row.author),)], "has a int where a str belongs"),
        (lambda row: [row.author], "a key must be a tuple, not str"),
        (lambda row: [(row.missing,)], "AttributeError"),
    ],
)
def test_bad_keys_from_an_invalidation_spec_are_logged_with_the_row_and_skipped(keys_of, reason, caplog):
    caches, applier = make(
        [
            InvalidationSpec("notes", "notes_by_author", keys_of),
            InvalidationSpec("notes", "display_name", lambda row: [(row.author,)]),
        ]
    )
    fill(caches, "display_name", ("@a:hs",))

    with caplog.at_level(logging.WARNING, logger="factstream.caches.apply"):
        applier.apply("notes", [NoteRow("@a:hs")])

    assert len(caches.get("display_name")) == 0  # the other spec still ran
    [record] = caplog.records
    assert "NoteRow(author='@a:hs'" in record.getMessage()
    assert reason in record.getMessage()


def test_rows_of_a_stream_without_invalidations_touch_nothing():
    caches, applier = make()
    fill(caches, "display_name", ("@a:hs",))

    applier.apply("notes", [NoteRow("@a:hs")])

    assert len(caches.get("display_name")) == 1
    assert applier.streams() == ["caches"]


def test_a_room_state_change_of_every_member_clears_the_member_caches_and_only_that_rooms_key():
    caches, _ = make()
    fill(caches, "room_members", ("!a:hs",), ("!b:hs",))
    fill(caches, "rooms_for_user", ("@u:hs",), ("@v:hs",))
    fill(caches, "member_profile", ("!a:hs", "@u:hs"), ("!b:hs", "@v:hs"))
    fill(caches, "display_name", ("@u:hs",))

    caches.invalidate_room_state_local("!a:hs", every_member=True)

    assert caches.get("room_members").keys() == [("!b:hs",)]
    assert caches.get("rooms_for_user").keys() == [] and caches.get("member_profile").keys() == []
    assert caches.get("display_name").keys() == [("@u:hs",)]
