"""A demo store for the cache tests: values in a table, read through ``@cached`` caches.

Caches (all read ``cachedemo_values``):

* ``demo_values(key)``: the value stored under ``key``;
* ``demo_room_members(room)``: room-state dependent, keyed by room (value under ``members:<room>``);
* ``demo_member_rooms(user)``: room-state dependent, keyed by member (``rooms:<user>``);
* ``demo_member_profile(room, user)``: room-state dependent, keyed by both (``profile:<room>:<user>``);
* ``demo_notes_by_author(author)``: invalidated by rows of the ``notes`` stream (an
  ``InvalidationSpec``) when the notes plugin is installed too.

``host.state(DemoStore)`` gives each host its store. With ``FACTSTREAM_CACHEDEMO_CONTROL=PATH`` the
plugin also runs a driver for real-process tests (a task of the host's, ``host.spawn``): it polls
``PATH`` for JSON commands addressed to its instance (``{"id", "instance", "op", ...}``) and appends
one JSON result per command to ``PATH.out``. (These switches are environment variables rather than
plugin settings: ``FACTSTREAM_CACHEDEMO_NOTES`` decides what the plugin registers, before any
settings are read.)
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import msgspec
from factstream_caches import CacheInvalidationRow

import factstream
from factstream import Caches, CacheSpec, HostApi, InvalidationSpec, MigrationSpec, cached, cached_specs

POLL_SECONDS = 0.01


class DemoStore:
    """Reads values through caches; writes them with invalidations in the same transaction.

    One per host: ``host.state(DemoStore)``.
    """

    def __init__(self, host: HostApi) -> None:
        self.host = host
        self.caches: Caches = host.caches
        self.loads = 0

    async def _read(self, key: str) -> str | None:
        self.loads += 1
        rows = await self.host.database().fetchall("SELECT value FROM cachedemo_values WHERE key = %(k)s", {"k": key})
        return str(rows[0][0]) if rows else None

    @cached(name="demo_values", max_size=1_000)
    async def get_value(self, key: str) -> str | None:
        return await self._read(key)

    @cached(name="demo_room_members", depends_on_room_state=True)
    async def get_room_members(self, room_id: str) -> str | None:
        return await self._read(f"members:{room_id}")

    @cached(name="demo_member_rooms", depends_on_room_state=True, room_state_key="member")
    async def get_member_rooms(self, user_id: str) -> str | None:
        return await self._read(f"rooms:{user_id}")

    @cached(name="demo_member_profile", depends_on_room_state=True)
    async def get_member_profile(self, room_id: str, user_id: str) -> str | None:
        return await self._read(f"profile:{room_id}:{user_id}")

    async def _upsert(self, txn: factstream.Transaction, values: dict[str, str]) -> None:
        for key, value in values.items():
            await txn.execute(
                "INSERT INTO cachedemo_values (key, value) VALUES (%(k)s, %(v)s) "
                "ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                {"k": key, "v": value},
            )

    async def set_value(self, key: str, value: str) -> list[int]:
        """Write a value and invalidate its key everywhere; returns the caches-stream IDs."""
        async with self.host.database().transaction() as txn:
            await self._upsert(txn, {key: value})
            return await self.caches.invalidate(txn, "demo_values", (key,))

    async def set_values_clearing_all(self, values: dict[str, str]) -> list[int]:
        async with self.host.database().transaction() as txn:
            await self._upsert(txn, values)
            return await self.caches.invalidate_all(txn, "demo_values")

    async def change_room_state(self, room_id: str, members: list[str], values: dict[str, str]) -> list[int]:
        async with self.host.database().transaction() as txn:
            await self._upsert(txn, values)
            return await self.caches.invalidate_room_state(txn, room_id, members)


@factstream.hookimpl
def register_caches(register: Callable[[CacheSpec], None]) -> None:
    for spec in cached_specs(DemoStore):
        register(spec)
    register(CacheSpec("demo_notes_by_author", max_size=100))


def _note_author(row: msgspec.Struct) -> Iterable[tuple[str]]:
    """The key a row of the notes stream makes stale: its author."""
    return [(str(getattr(row, "author", "")),)]


@factstream.hookimpl
def register_invalidations(register: Callable[[InvalidationSpec], None]) -> None:
    if os.environ.get("FACTSTREAM_CACHEDEMO_NOTES"):
        register(InvalidationSpec(stream="notes", cache="demo_notes_by_author", keys=_note_author))


@factstream.hookimpl
def register_migrations(register: Callable[[MigrationSpec], None]) -> None:
    register(MigrationSpec.from_package("factstream_cachedemo.migrations"))


# -- the driver for real processes ---------------------------------------------------------------------


@factstream.hookimpl
def startup(host: HostApi) -> None:
    control = os.environ.get("FACTSTREAM_CACHEDEMO_CONTROL")
    if control:
        host.spawn(_drive(host, Path(control)), name="cachedemo")


def _commands(control: Path) -> list[dict[str, Any]]:
    try:
        lines = control.read_text().splitlines()
    except FileNotFoundError:
        return []
    out = []
    for line in lines:
        with contextlib.suppress(ValueError):  # a line being written
            out.append(json.loads(line))
    return out


def _answer(out: Path, result: dict[str, Any]) -> None:
    with open(out, "a", encoding="utf-8") as f:
        f.write(json.dumps(result) + "\n")


async def _drive(host: HostApi, control: Path) -> None:
    done: set[str] = set()
    out = Path(f"{control}.out")
    while True:
        for command in _commands(control):
            if command.get("instance") != host.instance_name or command["id"] in done:
                continue
            done.add(command["id"])
            try:
                result = await _run(host, command)
            except Exception as exc:
                result = {"error": f"{type(exc).__name__}: {exc}"}
            _answer(out, {"id": command["id"], **result})
        await asyncio.sleep(POLL_SECONDS)


async def _run(host: HostApi, command: dict[str, Any]) -> dict[str, Any]:
    store = host.state(DemoStore)
    op = command["op"]
    if op == "read":  # through the cache; "hit" says whether it was answered from it
        cache = host.caches.get(command["cache"])
        before = cache.hits
        if command.get("wait_for") is not None:
            await host.wait_for_stream_position("main", "caches", command["wait_for"], timeout=10)
        value = await getattr(store, command["method"])(*command["args"])
        return {"value": value, "hit": cache.hits > before}
    if op == "keys":
        return {"keys": {c.name: list(map(list, c.keys())) for c in host.caches}}
    if op == "watch":  # the time at which a cached key disappears
        cache = host.caches.get(command["cache"])
        key = tuple(command["key"])
        deadline = time.monotonic() + 10
        while key in cache and time.monotonic() < deadline:
            await asyncio.sleep(0.0005)
        return {"gone": key not in cache, "at": time.time()}
    if op == "set":
        ids = await store.set_value(command["key"], command["value"])
        return {"stream_ids": ids, "committed_at": time.time()}
    if op == "set_all":
        return {"stream_ids": await store.set_values_clearing_all(command["values"]), "committed_at": time.time()}
    if op == "room_state":
        ids = await store.change_room_state(command["room"], command["members"], command.get("values", {}))
        return {"stream_ids": ids, "committed_at": time.time()}
    if op == "bad_row":  # a row no cache can take, written straight into the caches stream
        writer = host.stream("caches", CacheInvalidationRow)
        async with host.database().transaction() as txn:
            row = CacheInvalidationRow(command["cache_func"], command["keys"], 0)
            sid = await writer.append(txn, row)
        return {"stream_ids": [sid]}
    raise ValueError(f"unknown op {op!r}")
