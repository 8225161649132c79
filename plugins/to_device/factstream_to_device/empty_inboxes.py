"""Where each device's inbox is known to be empty, so that an idle device's ``/sync`` costs no query.

The host asks the ``to_device`` stream on every ``/sync``, at the client's token, also when nothing
is new (``SyncService.acknowledge``). Asking the database each time (read what was delivered, delete
up to the token, read what is still pending) would cost three statements per long poll, and most of
them find nothing. So each process keeps, per device and writer, a position at or below which the
inbox holds nothing. It is learnt from the database:

* a delete of the device's messages up to ``P``;
* a read of the device's pending messages up to ``P`` that found none from the writer (and was not cut
  short by the limit).

Such a fact stays true for ever. ``P`` never passes the writer's position, where every ID at or below
it has completed, so no message at or below ``P`` can be added later. Deletes, wherever they run,
only make an inbox emptier. Nothing needs invalidating, and another process's deliveries do not
matter.

The call at the client's token concerns only positions at or below the token: once a position at or
past it is known, that call needs no query, whatever was written since. Positions above the token are
read only when the user's stream moved, which the notifier already knows per user. The reference
reaches the same end with the last position it deleted up to per device and a stream change cache
per user; this needs no per-row bookkeeping on the replication path.

The map is bounded: past ``MAX_DEVICES`` devices it is emptied, which only sends each device back to
the database once.
"""

from __future__ import annotations

from collections.abc import Mapping

from factstream import HostApi

MAX_DEVICES = 100_000


class EmptyInboxes:
    """Per device and writer, the position at or below which the inbox is known to be empty.

    One per host process: ``host.state(EmptyInboxes)``.
    """

    def __init__(self, host: HostApi | None = None) -> None:
        self._clear: dict[tuple[str, str], dict[str, int]] = {}

    def clear_upto(self, user: str, device: str) -> Mapping[str, int]:
        """Per writer, the position at or below which the device's inbox holds nothing (0: unknown)."""
        return self._clear.get((user, device), {})

    def cleared(self, user: str, device: str, positions: Mapping[str, int]) -> None:
        """Record that the device's inbox holds nothing at or below ``positions[writer]``."""
        if not positions:
            return
        clear = self._clear.get((user, device))
        if clear is None:
            if len(self._clear) >= MAX_DEVICES:
                self._clear = {}
            clear = self._clear[(user, device)] = {}
        for writer, position in positions.items():
            if position > clear.get(writer, 0):
                clear[writer] = position
