"""A generator's durable state, and repairing its sequence: :class:`DurableStateMixin`.

At start-up :class:`~factstream.idgen.generator.MultiWriterIdGenerator` reads the durable state
(the sequence first, then the stored positions, the writers' leases and the backing tables) and
repairs a sequence that is behind IDs already used. While running, every reservation takes its IDs
from the sequence here, and an ID at or below one already seen allocated (the sequence went back, as
after a failover) makes it repair the sequence again and retry. What to repair, and why it is safe,
is decided by the pure functions of :mod:`factstream.idgen.recovery`; this module does the reading
and writing.
"""

from __future__ import annotations

import logging

from factstream.db.database import Connection
from factstream.idgen import metrics
from factstream.idgen.errors import IdGeneratorError
from factstream.idgen.leases import WriterLeases
from factstream.idgen.positions import PositionTracker
from factstream.idgen.recovery import DurableState, SequenceRepair, counted_writers, plan_reissue_repair
from factstream.idgen.sequence import PostgresSequence
from factstream.plugin.streams import StreamTable

# Logs under the generator's name, which docs/idgen.md documents for the repair warnings.
log = logging.getLogger("factstream.idgen.generator")

#: How far past the highest known ID a repaired sequence jumps (see ``plan_sequence_repair``).
DEFAULT_REPAIR_MARGIN = 10_000

#: How many times one reservation repairs a sequence that re-issues IDs before it gives up.
REISSUE_ATTEMPTS = 3


class DurableStateMixin:
    """Reading the durable state and repairing the sequence (see the module docstring).

    A base of :class:`~factstream.idgen.generator.MultiWriterIdGenerator`, whose constructor sets
    the attributes below (``_counted`` and ``_dead`` are set again here, by :meth:`_read_state`).
    """

    stream_name: str
    positions_key: str
    sequence: PostgresSequence
    tables: list[StreamTable]
    writers: list[str]
    instance_name: str
    positive: bool
    factor: int
    leases: WriterLeases | None
    repair_margin: int
    _tracker: PositionTracker | None
    _counted: list[str]
    _dead: list[str]

    async def _read_state(self, conn: Connection, *, with_rows: bool) -> DurableState:
        """Read the durable state, the sequence first (see ``initial_tracker`` for why)."""
        f = self.factor
        sequence_last = max(await self.sequence.last_allocated(conn), 0)
        stored = await self._stored_positions(conn)

        alive: set[str] | None = None
        others = [w for w in stored if w not in self.writers and w != self.instance_name]
        self._dead = []
        if self.leases is not None:
            configured = [w for w in self.writers if w != self.instance_name]
            alive = await self.leases.alive(self.positions_key, others + configured) | {self.instance_name}
            self._dead = [w for w in configured if w not in alive]
            dead = [w for w in others if w not in alive]
            if dead and with_rows:
                await conn.execute(
                    "DELETE FROM stream_positions WHERE stream_name = %(s)s AND instance_name = ANY(%(w)s)",
                    {"s": self.positions_key, "w": dead},
                )
                stored = {w: p for w, p in stored.items() if w not in dead}
        self._counted = counted_writers(self.writers, stored, alive)
        floor = min((stored[w] for w in self._counted if w in stored), default=None)

        table_max = 0
        rows: list[tuple[int, str]] = []
        for t in self.tables:
            table_max = max(table_max, await self._table_max(conn, t))
            if with_rows and floor is not None:
                cmp = ">" if self.positive else "<"
                cur = await conn.execute(
                    f"SELECT {t.id_column}, {t.instance_column} FROM {t.table} WHERE {t.id_column} {cmp} %(v)s",
                    {"v": floor * f},
                )
                rows += [(int(r[0]) * f, str(r[1])) for r in await cur.fetchall()]
        return DurableState(sequence_last=sequence_last, table_max=table_max, stored_positions=stored, rows_above=rows)

    async def _stored_positions(self, conn: Connection) -> dict[str, int]:
        cur = await conn.execute(
            "SELECT instance_name, stream_id FROM stream_positions WHERE stream_name = %(s)s", {"s": self.positions_key}
        )
        return {str(r[0]): int(r[1]) * self.factor for r in await cur.fetchall()}

    async def _table_max(self, conn: Connection, table: StreamTable) -> int:
        agg = "MAX" if self.positive else "-MIN"
        cur = await conn.execute(f"SELECT COALESCE({agg}({table.id_column}), 0) FROM {table.table}")
        row = await cur.fetchone()
        return int(row[0]) if row else 0

    # -- repairing the sequence --------------------------------------------------------------------

    async def _repair(self, conn: Connection, repair: SequenceRepair) -> None:
        log.warning(
            "stream %s: sequence %s is behind IDs already used (%s); moving it from %d to %d",
            self.stream_name,
            self.sequence.name,
            repair.reason,
            repair.old_last,
            repair.new_last,
        )
        await self.sequence.set_last(conn, repair.new_last)
        metrics.SEQUENCE_REPAIRS.labels(stream=self.stream_name).inc()

    async def _repair_reissued(self, conn: Connection, seen: int, reissued: int | None, attempt: int) -> None:
        """The sequence handed this running process an ID at or below ``seen``, the highest ID it
        had seen allocated when it asked: the sequence went back (a failover), and the ID may
        already be committed. Move the sequence past every ID known (:func:`plan_reissue_repair`),
        or give up after :data:`REISSUE_ATTEMPTS` repairs. The refused IDs are never used.

        ``conn`` may be inside the caller's transaction: ``setval`` is not transactional, so the
        repair stands even if that transaction rolls back.
        """
        if attempt >= REISSUE_ATTEMPTS:
            raise IdGeneratorError(
                f"stream {self.stream_name!r}: sequence {self.sequence.name!r} still hands out IDs at or below "
                f"{seen}, which this process has already seen allocated, after {attempt} repairs; is something "
                "setting it back? (Or, for an append, a BEFORE INSERT trigger dropped every row: not supported.)"
            )
        sequence_last = max(await self.sequence.last_allocated(conn), 0)
        table_max = max([await self._table_max(conn, t) for t in self.tables])
        state = DurableState(sequence_last, table_max, await self._stored_positions(conn))
        seen = max(seen, self.tracker.max_seen)
        await self._repair(conn, plan_reissue_repair(state, self.repair_margin, seen=seen, reissued=reissued))
        metrics.SEQUENCE_REISSUES.labels(stream=self.stream_name).inc()

    async def _next_ids(self, conn: Connection, n: int, seen: int) -> list[int]:
        """``n`` IDs from the sequence, all above ``seen`` (from ``begin_fetch``).

        Refused IDs were only reserved, never written, so repairing and asking again is invisible
        to the caller (but for the gap they leave).
        """
        ids = await self.sequence.next_ids(conn, n)
        attempt = 0
        while ids and ids[0] <= seen:  # ascending: the first is the lowest
            await self._repair_reissued(conn, seen, ids[0], attempt)
            attempt += 1
            ids = await self.sequence.next_ids(conn, n)
        return ids

    @property
    def tracker(self) -> PositionTracker:
        if self._tracker is None:
            raise IdGeneratorError(f"the ID generator of stream {self.stream_name!r} was used before start()")
        return self._tracker
