"""``@cached``: declare a cache on an async store method and read through it.

::

    class RoomStore:
        def __init__(self, host):
            self.db = host.database()
            self.caches = host.caches          # the decorated methods find their caches here

        @cached(name="room_members", max_size=1_000, depends_on_room_state=True)
        async def get_room_members(self, room_id: str) -> list[str]:
            ...

    @factstream.hookimpl
    def register_caches(register):
        for spec in cached_specs(RoomStore):
            register(spec)

The method's arguments after ``self`` are the cache key, in order (keyword arguments and defaults
are bound to their positions), so ``key_arity`` is their number; ``*args`` and ``**kwargs`` are
refused. The decorator only *declares* the cache (``RoomStore.get_room_members.spec``): the plugin
registers it like any other, so every process knows it by name, and a process without the plugin
logs invalidations for it as unknown. A key whose components do not have the declared types
(default ``str``) raises :class:`~factstream.caches.keys.BadKey` rather than caching a value under
a key that no invalidation could name.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable, Hashable
from typing import Any, Concatenate, Generic, ParamSpec, TypeVar, overload

from factstream.caches.keys import check_key
from factstream.caches.lru import LruCache
from factstream.errors import FactstreamError
from factstream.plugin.specs import CacheSpec, RoomStateKey

P = ParamSpec("P")
R = TypeVar("R")


def cached(
    name: str,
    *,
    max_size: int = 10_000,
    depends_on_room_state: bool = False,
    room_state_key: RoomStateKey | None = None,
    key_types: tuple[type, ...] = (),
) -> Callable[[Callable[Concatenate[Any, P], Awaitable[R]]], CachedMethod[P, R]]:
    """Cache an async method's results in the cache ``name`` (see the module docstring)."""

    def decorate(fn: Callable[Concatenate[Any, P], Awaitable[R]]) -> CachedMethod[P, R]:
        return CachedMethod(
            fn,
            name=name,
            max_size=max_size,
            depends_on_room_state=depends_on_room_state,
            room_state_key=room_state_key,
            key_types=key_types,
        )

    return decorate


class CachedMethod(Generic[P, R]):
    """The descriptor ``@cached`` makes; ``.spec`` is the cache it declares."""

    def __init__(
        self,
        fn: Callable[Concatenate[Any, P], Awaitable[R]],
        *,
        name: str,
        max_size: int,
        depends_on_room_state: bool,
        room_state_key: RoomStateKey | None,
        key_types: tuple[type, ...],
    ) -> None:
        if not inspect.iscoroutinefunction(fn):
            raise TypeError(f"@cached({name!r}) needs an async method, not {fn!r}")
        signature = inspect.signature(fn)
        params = list(signature.parameters.values())[1:]  # after self
        plain = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
        odd = [p.name for p in params if p.kind not in plain]
        if odd:
            raise TypeError(f"@cached({name!r}) on {fn.__qualname__}: the key cannot include {', '.join(odd)}")
        self.fn = fn
        self.signature = signature
        self.arity = len(params)
        self.spec = CacheSpec(
            name=name,
            max_size=max_size,
            key_arity=self.arity,
            depends_on_room_state=depends_on_room_state,
            room_state_key=room_state_key,
            key_types=key_types,
        )
        self.__doc__ = fn.__doc__
        self.__name__ = getattr(fn, "__name__", name)
        self.__qualname__ = getattr(fn, "__qualname__", name)

    def key(self, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Hashable, ...]:
        """The cache key of a call (arguments after ``self``, in order)."""
        if not kwargs and len(args) == self.arity:
            return args
        bound = self.signature.bind(None, *args, **kwargs)
        bound.apply_defaults()
        return tuple(bound.args[1:])

    @overload
    def __get__(self, obj: None, owner: type | None = None) -> CachedMethod[P, R]: ...

    @overload
    def __get__(self, obj: object, owner: type | None = None) -> BoundCachedMethod[P, R]: ...

    def __get__(self, obj: object | None, owner: type | None = None) -> CachedMethod[P, R] | BoundCachedMethod[P, R]:
        if obj is None:
            return self
        return BoundCachedMethod(self, obj)


class BoundCachedMethod(Generic[P, R]):
    """A ``@cached`` method bound to its store: call it, or reach its cache."""

    __slots__ = ("method", "obj")

    def __init__(self, method: CachedMethod[P, R], obj: Any) -> None:
        self.method = method
        self.obj = obj

    @property
    def cache(self) -> LruCache[R]:
        """The store's cache for this method (from ``store.caches``)."""
        registry = getattr(self.obj, "caches", None)
        if registry is None:
            raise FactstreamError(
                f"{type(self.obj).__name__} has no 'caches' attribute: set it to host.caches so that "
                f"@cached({self.method.spec.name!r}) can find its cache"
            )
        cache: LruCache[R] = registry.get(self.method.spec.name)
        return cache

    async def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        method = self.method
        key = method.key(args, kwargs)
        obj = self.obj

        def load() -> Awaitable[R]:
            check_key(method.spec, key)
            return method.fn(obj, *args, **kwargs)

        return await self.cache.get_or_load(key, load)

    def invalidate_local(self, *key: Hashable) -> bool:
        """Forget one key in this process only (see ``CacheRegistry.invalidate`` for a write)."""
        return self.cache.invalidate(key)


def cached_specs(*holders: object) -> list[CacheSpec]:
    """The caches declared by ``@cached`` methods of the given classes (or instances), in order."""
    specs: list[CacheSpec] = []
    seen: set[str] = set()
    for holder in holders:
        cls = holder if isinstance(holder, type) else type(holder)
        for klass in cls.__mro__:
            for value in vars(klass).values():
                if isinstance(value, CachedMethod) and value.spec.name not in seen:
                    seen.add(value.spec.name)
                    specs.append(value.spec)
    return specs
