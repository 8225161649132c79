"""@cached: the declared spec, reading through the registry's cache, keys from arguments."""

from __future__ import annotations

import pytest

from factstream import BadKey, CacheSpec, cached, cached_specs
from factstream.caches.registry import CacheRegistry
from factstream.errors import FactstreamError


class ProfileStore:
    def __init__(self, caches: CacheRegistry) -> None:
        self.caches = caches
        self.reads: list[tuple[object, ...]] = []
        self.names = {"@a:hs": "Alice"}

    @cached(name="display_name", max_size=100)
    async def get_display_name(self, user_id: str) -> str | None:
        self.reads.append((user_id,))
        return self.names.get(user_id)

    @cached(name="room_member_profile", depends_on_room_state=True)
    async def get_member_profile(self, room_id: str, user_id: str) -> str:
        self.reads.append((room_id, user_id))
        return f"{room_id}/{user_id}"

    @cached(name="history_page", key_types=(str, int))
    async def get_page(self, room_id: str, limit: int = 10) -> str:
        self.reads.append((room_id, limit))
        return f"{room_id}:{limit}"

    @cached(name="unread_count", key_types=(str, int))
    async def get_unread(self, user_id: str, since: int) -> int:
        self.reads.append((user_id, since))
        return since * 2


def make_store() -> ProfileStore:
    return ProfileStore(CacheRegistry(cached_specs(ProfileStore)))


def test_the_decorator_declares_a_spec_with_the_arity_of_the_arguments():
    specs = {s.name: s for s in cached_specs(ProfileStore)}

    assert specs["display_name"] == CacheSpec("display_name", max_size=100, key_arity=1)
    assert specs["room_member_profile"].key_arity == 2
    assert specs["room_member_profile"].room_state_key == "room_member"
    assert specs["unread_count"].key_types == (str, int)


async def test_a_second_call_with_the_same_arguments_is_answered_from_the_cache():
    store = make_store()

    assert await store.get_display_name("@a:hs") == "Alice"
    store.names["@a:hs"] = "Alicia"
    assert await store.get_display_name("@a:hs") == "Alice"

    assert store.reads == [("@a:hs",)]
    assert store.caches.get("display_name").hits == 1


async def test_keyword_arguments_and_defaults_make_the_same_key_as_positional_ones():
    store = make_store()

    await store.get_page("!r")
    await store.get_page("!r", limit=10)
    await store.get_page("!r", 10)

    assert store.reads == [("!r", 10)]


async def test_invalidating_the_key_makes_the_next_call_read_again():
    store = make_store()
    await store.get_display_name("@a:hs")
    store.names["@a:hs"] = "Alicia"

    store.caches.invalidate_local("display_name", ("@a:hs",))

    assert await store.get_display_name("@a:hs") == "Alicia"


async def test_an_argument_of_the_wrong_type_is_refused_rather_than_cached():
    store = make_store()

    with pytest.raises(BadKey, match="has a str where a int belongs"):
        await store.get_unread("@a:hs", "5")  # type: ignore[arg-type]
    assert await store.get_unread("@a:hs", 5) == 10
    assert len(store.caches.get("unread_count")) == 1


async def test_a_store_without_a_registry_gets_an_error_saying_what_to_set():
    class Bare:
        @cached(name="thing")
        async def get(self, key: str) -> str:
            return key

    with pytest.raises(FactstreamError, match="has no 'caches' attribute"):
        await Bare().get("x")


async def test_a_cache_the_plugin_did_not_register_is_reported_by_name():
    store = ProfileStore(CacheRegistry([CacheSpec("other")]))

    with pytest.raises(FactstreamError, match=r"no cache named 'display_name'.*known: other"):
        await store.get_display_name("@a:hs")


def test_methods_with_star_arguments_are_refused():
    with pytest.raises(TypeError, match="cannot include rest"):

        class Bad:
            @cached(name="bad")
            async def get(self, *rest: str) -> str:
                return ""
