"""Every process's report of who syncs there: ``USER_SYNC`` to the presence writer.

Each process serving ``/sync`` (the writer too) looks at the users with a ``/sync`` in progress here
(``host.syncing_users()``) every second. A user seen for the first time is reported ``start``; a user
gone for ``stop_syncing_delay_ms`` (the reference's 10 s: a client's next long poll comes well within
it) is reported ``end``. Whenever the replication link (re)connects, every user still syncing here is
reported again (``resend``): a writer that forgot this process (its link broke) learns them back. A
process that stops sends ``CLEAR_USER_SYNC``.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

from factstream import ClearUserSyncCommand, HostApi, UserSyncCommand
from factstream_presence.settings import PresenceSettings
from factstream_presence.writer import now_ms

#: How often the users syncing here are looked at, in seconds.
LOOK_SECONDS = 1.0


class PresenceReporter:
    """This process's syncing users, as reported to the presence writer (module docstring)."""

    def __init__(self, host: HostApi) -> None:
        self.host = host
        self.delay_ms = host.plugin_settings(PresenceSettings).stop_syncing_delay_ms
        #: Users reported syncing here -> when they were last seen syncing (ms).
        self.reported: dict[str, int] = {}

    def _command(self, user: str, syncing: bool, now: int) -> UserSyncCommand:
        return UserSyncCommand(self.host.instance_name, user, None, syncing, now)

    def look(self) -> None:
        """Report who started and who stopped syncing here since the last look."""
        now = now_ms()
        syncing = self.host.syncing_users()
        for user in syncing:
            if user not in self.reported:
                self.host.send_command(self._command(user, True, now))
            self.reported[user] = now
        for user, seen in list(self.reported.items()):
            if user not in syncing and now - seen >= self.delay_ms:
                del self.reported[user]
                self.host.send_command(self._command(user, False, now))

    def again(self) -> Iterator[UserSyncCommand]:
        """``resend``: every user syncing here, once more."""
        now = now_ms()
        for user in sorted(self.reported):
            yield self._command(user, True, now)

    def stopping(self) -> None:
        """This process stops: nobody syncs here any more."""
        self.reported.clear()
        self.host.send_command(ClearUserSyncCommand(self.host.instance_name))

    async def run(self) -> None:
        while True:
            await asyncio.sleep(LOOK_SECONDS)
            self.look()
