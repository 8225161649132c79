"""Small integer IDs for instance names, as used in the string form of multi-writer tokens.

A token such as ``m56~2.58`` names writer ``2``, not ``"event_persister-2"``: tokens travel in
every /sync URL, so they should be short, and an ID must mean the same instance in every process
and after every restart. The mapping therefore lives in the ``instance_map`` table (created by the
core migration) and an ID, once assigned, never changes.

Two implementations of :class:`InstanceIds`:

* :class:`DatabaseInstanceIds`: reads and records IDs in ``instance_map``; caches both directions
  (an ID never changes, so the cache never goes stale).
* :class:`MemoryInstanceIds`: the same in memory, with synchronous ``id_for``/``name_for`` for pure
  code and tests (``token.serialize(ids.id_for)``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from factstream.db.database import Database


class InstanceIds(Protocol):
    """Resolves instance names to token IDs and back (see the module docstring)."""

    async def get_id(self, instance_name: str) -> int:
        """The ID of ``instance_name``, assigning one the first time the name is seen."""
        ...

    async def get_name(self, instance_id: int) -> str:
        """The name behind ``instance_id``; ``LookupError`` if no instance has that ID."""
        ...

    async def id_lookup(self, names: Iterable[str]) -> Callable[[str], int]:
        """A synchronous name -> ID function, valid at least for ``names``."""
        ...

    async def name_lookup(self, ids: Iterable[int]) -> Callable[[int], str]:
        """A synchronous ID -> name function for ``ids``; unknown IDs raise ``LookupError`` when called."""
        ...


class _CachedInstanceIds:
    """Both directions cached; subclasses say how a miss is resolved."""

    def __init__(self) -> None:
        self._ids: dict[str, int] = {}
        self._names: dict[int, str] = {}

    def _remember(self, name: str, instance_id: int) -> None:
        self._ids[name] = instance_id
        self._names[instance_id] = name

    async def get_id(self, instance_name: str) -> int:
        cached = self._ids.get(instance_name)
        return cached if cached is not None else await self._load_id(instance_name)

    async def get_name(self, instance_id: int) -> str:
        cached = self._names.get(instance_id)
        return cached if cached is not None else await self._load_name(instance_id)

    async def id_lookup(self, names: Iterable[str]) -> Callable[[str], int]:
        for name in names:
            await self.get_id(name)
        return self._ids.__getitem__

    async def name_lookup(self, ids: Iterable[int]) -> Callable[[int], str]:
        for instance_id in ids:
            # An unknown ID is reported by the parser, which knows which field it was in.
            with contextlib.suppress(LookupError):
                await self.get_name(instance_id)
        return self._names.__getitem__

    async def _load_id(self, instance_name: str) -> int:
        raise NotImplementedError

    async def _load_name(self, instance_id: int) -> str:
        raise NotImplementedError


class MemoryInstanceIds(_CachedInstanceIds):
    """IDs assigned in memory, 1, 2, 3, ... in order of first use (or given up front).

    For pure code and tests; a real host uses :class:`DatabaseInstanceIds` so that every process
    agrees.
    """

    def __init__(self, known: dict[str, int] | None = None) -> None:
        super().__init__()
        for name, instance_id in (known or {}).items():
            self._remember(name, instance_id)

    def id_for(self, instance_name: str) -> int:
        """The ID of ``instance_name``, assigning the next free one if it has none."""
        instance_id = self._ids.get(instance_name)
        if instance_id is None:
            instance_id = max(self._names, default=0) + 1
            self._remember(instance_name, instance_id)
        return instance_id

    def name_for(self, instance_id: int) -> str:
        """The name behind ``instance_id`` (``KeyError`` if none)."""
        return self._names[instance_id]

    async def _load_id(self, instance_name: str) -> int:
        return self.id_for(instance_name)

    async def _load_name(self, instance_id: int) -> str:
        return self.name_for(instance_id)


_SELECT_ID = "SELECT instance_id FROM instance_map WHERE instance_name = %(name)s"
_INSERT = (
    "INSERT INTO instance_map (instance_name) VALUES (%(name)s) "
    "ON CONFLICT (instance_name) DO NOTHING RETURNING instance_id"
)
_SELECT_NAME = "SELECT instance_name FROM instance_map WHERE instance_id = %(id)s"


class DatabaseInstanceIds(_CachedInstanceIds):
    """IDs recorded in the ``instance_map`` table, shared by every process on the database.

    A name is looked up first and inserted only when missing: the ID column is a ``SERIAL``, and an
    ``INSERT ... ON CONFLICT DO NOTHING`` consumes a sequence value even when it conflicts, so
    inserting on every lookup would make IDs (and tokens) grow for nothing. When two processes insert
    the same new name at once, the unique index lets one win; the other's insert returns no row and it
    reads the winner's ID, so both agree.
    """

    def __init__(self, db: Database) -> None:
        super().__init__()
        self.db = db

    async def load(self) -> None:
        """Read every known mapping into the cache (optional: misses are looked up one by one)."""
        for instance_id, name in await self.db.fetchall("SELECT instance_id, instance_name FROM instance_map"):
            self._remember(str(name), int(instance_id))

    async def _load_id(self, instance_name: str) -> int:
        rows = await self.db.fetchall(_SELECT_ID, {"name": instance_name})
        if not rows:
            rows = await self.db.fetchall(_INSERT, {"name": instance_name})
        if not rows:  # another process inserted it between our select and our insert
            rows = await self.db.fetchall(_SELECT_ID, {"name": instance_name})
        instance_id = int(rows[0][0])
        self._remember(instance_name, instance_id)
        return instance_id

    async def _load_name(self, instance_id: int) -> str:
        rows = await self.db.fetchall(_SELECT_NAME, {"id": instance_id})
        if not rows:
            raise LookupError(f"no instance has ID {instance_id}")
        name = str(rows[0][0])
        self._remember(name, instance_id)
        return name
