"""WriterLeases: a lease released by close() can be claimed again at once, by a fresh process."""

from __future__ import annotations

from factstream.db.database import Database
from factstream.idgen.leases import WriterLeases

#: The race lost about one claim in ten on an idle machine, more under load.
ROUNDS = 100


async def test_a_lease_released_by_close_can_be_claimed_again_at_once(db: Database) -> None:
    for i in range(ROUNDS):
        old = WriterLeases(db)
        await old.claim("facts", "main")
        restarted = WriterLeases(db)
        # Its session is open already (it writes another stream), so its claim follows close() at
        # once: a restarted process that connected while the old one was shutting down.
        await restarted.claim("other", f"main{i}")

        await old.close()
        await restarted.claim("facts", "main")  # LeaseHeldError: "already running as instance 'main'"

        assert await WriterLeases(db).alive("facts", ["main"]) == {"main"}
        await restarted.close()
