"""The presence writer: every process's syncing users in, each user's online, unavailable or offline out.

It runs on the stream's one writer (``stream_writers.presence``, ``main`` by default). Its inputs:

* ``USER_SYNC <instance> <user> <device> start|end <ms>`` from every process serving ``/sync`` (this one
  included, without going over the wire; ``factstream_presence.reporter``): who is syncing where;
* ``CLEAR_USER_SYNC <instance>`` from a process that stops, and the host's ``forget`` of a process that
  is gone (its TCP link closed, or its instance lease ended: it died): its users stop syncing there;
* ``PUT /presence/{user}/status``: a user sets their state and status message.

Its rule, applied on every input and every ``check_interval_ms`` (the reference's):

* a user who starts syncing while offline comes online, active now;
* online without activity for ``idle_timeout_ms`` (5 minutes) becomes ``unavailable``;
* syncing nowhere for ``sync_online_timeout_ms`` (30 s) since the last sync ended or the last activity
  (whichever is later) becomes ``offline``
  (so a process that dies takes its users offline at most about that long after the host learns it is
  gone: docs/plugins/presence.md says how long in all);
* ``currently_active`` is true while the last activity is less than a minute old.

A change of state, status message or ``currently_active`` is one row at the user's next position (the
table keeps each user's latest row only): that is what readers and ``/sync`` see.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, replace
from typing import Any

from factstream import HostApi
from factstream_presence.rows import STREAM, TABLE, PresenceRow
from factstream_presence.settings import PresenceSettings

#: ``currently_active`` while the last activity is less than this old (the reference's granularity).
ACTIVE_WINDOW_MS = 60_000

_LOAD = f"""
SELECT user_id, state, last_active_ts, last_federation_update_ts, last_user_sync_ts, status_msg, currently_active
FROM {TABLE} WHERE user_id = %(user)s
"""
_DROP = f"DELETE FROM {TABLE} WHERE user_id = %(user)s"
_NOT_OFFLINE = f"""
SELECT user_id, state, last_active_ts, last_federation_update_ts, last_user_sync_ts, status_msg, currently_active
FROM {TABLE} WHERE state <> 'offline'
"""


def now_ms() -> int:
    return time.time_ns() // 1_000_000


@dataclass(frozen=True)
class Presence:
    """A user's presence as the writer holds it (what a row carries)."""

    state: str = "offline"
    last_active_ts: int = 0
    last_user_sync_ts: int = 0
    status_msg: str | None = None
    currently_active: bool = False

    def row(self, user: str) -> PresenceRow:
        return PresenceRow(
            user, self.state, self.last_active_ts, 0, self.last_user_sync_ts, self.status_msg, self.currently_active
        )

    def visible(self) -> tuple[str, str | None, bool]:
        """What a change of makes a row: the state, the message and ``currently_active``."""
        return self.state, self.status_msg, self.currently_active


def _held(row: tuple[Any, ...]) -> Presence:
    """The writer's :class:`Presence` of a ``presence_stream`` row (the columns of ``_LOAD``)."""
    return Presence(*(row[i] for i in (1, 2, 4, 5, 6)))


class PresenceWriter:
    """The writer's state and rule (module docstring); ``host.state(PresenceWriter)`` on the writer only."""

    def __init__(self, host: HostApi) -> None:
        self.host = host
        self.settings = host.plugin_settings(PresenceSettings)
        self.stream = host.stream(STREAM, PresenceRow)
        self.users: dict[str, Presence] = {}
        #: Per instance, the users syncing there.
        self.syncing: dict[str, set[str]] = {}
        self.clock = now_ms
        self._lock = asyncio.Lock()

    def syncing_anywhere(self, user: str) -> bool:
        return any(user in users for users in self.syncing.values())

    async def _presence(self, user: str) -> Presence:
        known = self.users.get(user)
        if known is None:
            rows = await self.host.database().fetchall(_LOAD, {"user": user})
            known = _held(rows[0]) if rows else Presence()
            self.users[user] = known
        return known

    async def load(self) -> None:
        """Hold every user not offline in the table (a writer that starts again takes over the users its
        last run left online, whose timeouts it applies from now on)."""
        async with self._lock:
            for row in await self.host.database().fetchall(_NOT_OFFLINE, {}):
                self.users.setdefault(row[0], _held(row))

    async def _store(self, user: str, new: Presence) -> None:
        old = self.users.get(user, Presence())
        self.users[user] = new
        if new.visible() == old.visible():
            return
        async with self.host.database().transaction() as txn:
            await txn.execute(_DROP, {"user": user})
            await self.stream.append(txn, new.row(user))

    # -- inputs ------------------------------------------------------------------------------------

    async def user_sync(self, instance: str, user: str, syncing: bool) -> None:
        """``USER_SYNC``: ``user`` started or stopped syncing on ``instance``."""
        async with self._lock:
            now = self.clock()
            current = await self._presence(user)
            if syncing:
                self.syncing.setdefault(instance, set()).add(user)
                if current.state == "offline":
                    current = replace(current, state="online", last_active_ts=now)
            else:
                self.syncing.get(instance, set()).discard(user)
            await self._store(user, self._timed(replace(current, last_user_sync_ts=now), user, now))

    async def clear(self, instance: str) -> None:
        """``CLEAR_USER_SYNC``, or ``instance`` is gone: nobody syncs there any more (since now)."""
        async with self._lock:
            now = self.clock()
            for user in sorted(self.syncing.pop(instance, set())):
                current = await self._presence(user)
                await self._store(user, replace(current, last_user_sync_ts=now))

    async def set_presence(self, user: str, state: str, status_msg: str | None) -> None:
        """``PUT /presence/{user}/status``: online is activity now; the message is kept as given."""
        async with self._lock:
            now = self.clock()
            current = await self._presence(user)
            active = now if state == "online" else current.last_active_ts
            new = replace(current, state=state, status_msg=status_msg, last_active_ts=active)
            await self._store(user, self._timed(new, user, now))

    # -- the timeouts ------------------------------------------------------------------------------

    def _timed(self, p: Presence, user: str, now: int) -> Presence:
        """``p`` with the timeouts of the rule applied at ``now``."""
        if p.state == "offline":
            return replace(p, currently_active=False)
        last_seen = max(p.last_user_sync_ts, p.last_active_ts)  # a status set by PUT is activity too
        if not self.syncing_anywhere(user) and now - last_seen >= self.settings.sync_online_timeout_ms:
            return replace(p, state="offline", currently_active=False)
        if p.state == "online" and now - p.last_active_ts >= self.settings.idle_timeout_ms:
            p = replace(p, state="unavailable")
        return replace(p, currently_active=p.state == "online" and now - p.last_active_ts < ACTIVE_WINDOW_MS)

    async def check(self) -> int:
        """Apply the timeouts to every user not offline; returns how many changed."""
        changed = 0
        async with self._lock:
            now = self.clock()
            for user, current in sorted(self.users.items()):
                new = self._timed(current, user, now)
                if new != current:
                    changed += new.visible() != current.visible()
                    await self._store(user, new)
        return changed

    async def run(self) -> None:
        """Check the timeouts every ``check_interval_ms`` (the host's task on the writer)."""
        await self.load()
        while True:
            await asyncio.sleep(self.settings.check_interval_ms / 1000)
            await self.check()
