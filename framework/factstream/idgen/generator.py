"""``MultiWriterIdGenerator``: stream IDs for one stream, from one process's point of view.

It hands out IDs from the stream's PostgreSQL sequence, tracks which of them have completed, and
keeps this process's view of every writer's position and of the watermark below which every fact
is complete (see :mod:`factstream.idgen.positions` for the rules and why they are safe).

Lifecycle: construct, ``await start()`` (reads the durable state, repairs the sequence if it is
behind, claims this writer's lease), use, ``await close()`` (persists the final position, releases
the lease). Not thread-safe: use it from one event loop.

This module holds the lifecycle, reserving and appending (with the completions they report) and
reading positions. Reading the durable state and repairing the sequence, at start-up and when a
reservation is handed a re-issued ID, are :class:`~factstream.idgen.durable.DurableStateMixin`'s;
the row capture contract is :class:`~factstream.idgen.capture.RowCapture`.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

from factstream.db.database import Database, Transaction
from factstream.idgen import metrics
from factstream.idgen.append import append_sql, column_types
from factstream.idgen.capture import RowCapture
from factstream.idgen.durable import DEFAULT_REPAIR_MARGIN, DurableStateMixin
from factstream.idgen.errors import IdGeneratorError
from factstream.idgen.leases import LeaseHeldError, WriterLeases
from factstream.idgen.persist import PositionPersister, upsert_position_sql
from factstream.idgen.positions import PositionTracker
from factstream.idgen.recovery import initial_tracker, plan_sequence_repair
from factstream.idgen.sequence import PostgresSequence
from factstream.names import check_name
from factstream.plugin.streams import StreamTable

if TYPE_CHECKING:
    from factstream.config import Settings
    from factstream.plugin.streams import StreamSpec

__all__ = ["IdGeneratorError", "MultiWriterIdGenerator", "RowCapture"]

log = logging.getLogger(__name__)


class MultiWriterIdGenerator(DurableStateMixin):
    """Stream IDs for one stream with any number of writers (see the module docstring).

    ``writers`` lists the instances allowed to write; an empty list means anyone may write. Every
    writing instance persists its position (lazily). ``positive=False`` makes a backwards stream
    (IDs -2, -3, ...; a new sequence is advanced once): every value going in and out is negative,
    the sequence and the bookkeeping stay positive.
    """

    def __init__(
        self,
        db: Database,
        *,
        stream_name: str,
        sequence_name: str,
        tables: Sequence[StreamTable | tuple[str, str, str]],
        writers: Sequence[str],
        instance_name: str,
        positive: bool = True,
        positions_key: str | None = None,
        leases: WriterLeases | None = None,
        persist_interval: float = 0.1,
        repair_margin: int = DEFAULT_REPAIR_MARGIN,
    ) -> None:
        self.db = db
        self.stream_name = check_name("stream", stream_name)
        self.positions_key = positions_key or stream_name
        self.sequence = PostgresSequence(sequence_name)
        self.tables = [t if isinstance(t, StreamTable) else StreamTable(*t) for t in tables]
        if not self.tables:
            raise IdGeneratorError(f"stream {stream_name!r} has no backing tables")
        self.writers = list(writers)
        self.instance_name = instance_name
        self.positive = positive
        self.factor = 1 if positive else -1
        self.leases = leases
        self.persist_interval = persist_interval
        self.repair_margin = repair_margin
        self._tracker: PositionTracker | None = None
        self._persister: PositionPersister | None = None
        self._listeners: list[Callable[[], None]] = []
        self._counted: list[str] = []
        self._dead: list[str] = []
        self._append_sql: dict[tuple[str, tuple[str, ...], bool, tuple[str, ...] | None], str] = {}
        self.repaired_from: int | None = None
        #: Set by replication on a writer (see :class:`RowCapture`).
        self.capture: RowCapture | None = None
        #: The highest ID (positive) anyone could have reserved before :meth:`start`: facts up to it
        #: may have been committed by an earlier process under this instance name.
        self.reserved_before_start = 0

    @classmethod
    def from_spec(
        cls, db: Database, spec: StreamSpec[Any], settings: Settings, *, leases: WriterLeases | None = None
    ) -> MultiWriterIdGenerator:
        """The generator for a registered stream, with writers taken from the configuration."""
        return cls(
            db,
            stream_name=spec.name,
            sequence_name=spec.sequence,
            tables=list(spec.tables),
            writers=settings.writers_for(spec.name) if spec.writers == "configured" else [],
            instance_name=settings.instance_name,
            positive=spec.positive,
            positions_key=spec.positions_key,
            leases=leases,
        )

    # -- lifecycle ---------------------------------------------------------------------------------

    @property
    def is_writer(self) -> bool:
        return not self.writers or self.instance_name in self.writers

    async def start(self) -> MultiWriterIdGenerator:
        """Load positions from the database (repairing a sequence that is behind); returns self.

        A writer first claims its lease and registers its ``stream_positions`` row, so that any
        process starting later counts it before it has reserved anything.
        """
        if self.leases is not None and self.is_writer:
            try:
                await self.leases.claim(self.positions_key, self.instance_name)
            except LeaseHeldError as exc:
                raise IdGeneratorError(str(exc)) from None
        async with self.db.autocommit() as conn:
            if not await self.sequence.exists(conn):
                raise IdGeneratorError(
                    f"stream {self.stream_name!r}: sequence {self.sequence.name!r} does not exist; "
                    "run `factstream migrate` (the plugin's migration must create it)"
                )
            state = await self._read_state(conn, with_rows=False)
            repair = plan_sequence_repair(state, self.repair_margin)
            if repair is not None:
                await self._repair(conn, repair)
                self.repaired_from = repair.old_last
            state = await self._read_state(conn, with_rows=True)
            self.reserved_before_start = max(state.sequence_last, state.table_max)
            self._tracker = initial_tracker(
                local=self.instance_name, writers=self.writers, state=state, counted=self._counted, dead=self._dead
            )
            if self.is_writer:
                # Register before the first reservation: a process starting later must count us.
                await conn.execute(
                    upsert_position_sql(self.positive),
                    {
                        "s": self.positions_key,
                        "i": self.instance_name,
                        "p": self.get_current_token_for_writer(self.instance_name),
                    },
                )
        if self.is_writer:
            self._persister = PositionPersister(
                self.db,
                self.positions_key,
                self.instance_name,
                lambda: self.get_current_token_for_writer(self.instance_name),
                positive=self.positive,
                interval=self.persist_interval,
            )
        metrics.count_stream(self.stream_name)
        metrics.track(self)
        return self

    async def close(self) -> None:
        """Persist the final position; the lease is released by whoever owns the leases."""
        if self._persister is not None:
            await self._persister.close()
        metrics.untrack(self)

    # -- reserving ---------------------------------------------------------------------------------

    def _check_writer(self) -> None:
        if not self.is_writer:
            raise IdGeneratorError(
                f"instance {self.instance_name!r} tried to reserve an ID on stream {self.stream_name!r}, "
                f"whose writers are {', '.join(map(repr, self.writers))}; add it under "
                f"stream_writers.{self.stream_name} in the configuration to let it write"
            )

    @asynccontextmanager
    async def get_next(self) -> AsyncIterator[int]:
        """Reserve one ID; it completes when the block exits, whether it succeeded or raised."""
        async with self.get_next_mult(1) as ids:
            yield ids[0]

    @asynccontextmanager
    async def get_next_mult(self, n: int) -> AsyncIterator[list[int]]:
        """Reserve ``n`` IDs (ascending in the stream's direction); all complete when the block exits."""
        self._check_writer()
        tracker = self.tracker
        token = tracker.begin_fetch()
        ids: list[int] = []
        try:
            async with self.db.autocommit() as conn:
                ids = await self._next_ids(conn, n, token)
        finally:
            tracker.end_fetch(token, ids)
        try:
            yield [i * self.factor for i in ids]
        finally:
            if self.capture is not None:
                self.capture.uncaptured(ids)  # whether rows were committed is unknown here
            self._complete(ids)

    async def get_next_txn(self, txn: Transaction) -> int:
        """Reserve one ID inside ``txn``; it completes when ``txn`` commits or rolls back.

        The fact's rows must be written in that same transaction.
        """
        return (await self.get_next_mult_txn(txn, 1))[0]

    async def get_next_mult_txn(self, txn: Transaction, n: int) -> list[int]:
        """Reserve ``n`` IDs inside ``txn``; they complete when ``txn`` commits or rolls back."""
        self._check_writer()
        if not isinstance(txn, Transaction):
            raise IdGeneratorError(
                "get_next_txn needs the Transaction from Database.transaction(), which completes the IDs "
                f"after COMMIT; got {type(txn).__name__}"
            )
        tracker = self.tracker
        token = tracker.begin_fetch()
        ids: list[int] = []
        try:
            ids = await self._next_ids(txn.conn, n, token)
        finally:
            tracker.end_fetch(token, ids)
        txn.on_complete(lambda committed: self._complete(ids, committed))
        return [i * self.factor for i in ids]

    async def append_txn(self, txn: Transaction, table: str, values: Mapping[str, Any]) -> int:
        """Write a one-row fact into backing table ``table`` inside ``txn``; return its stream ID.

        The ID is reserved by the ``INSERT`` itself (``nextval`` in its ``VALUES``), saving the
        round trip of a separate reservation; the bookkeeping is the same as :meth:`get_next_txn`
        (in flight while the statement runs, complete when ``txn`` commits or rolls back). ``values``
        are the row's other columns; the stream ID and instance columns are filled in.
        """
        return (await self.append_many_txn(txn, table, [values]))[0]

    async def append_many_txn(self, txn: Transaction, table: str, rows: Sequence[Mapping[str, Any]]) -> list[int]:
        """Write one-row facts (one stream ID each) into ``table`` with one statement; return the IDs.

        Every row must have the same columns. The IDs follow the rows' order. Columns are sent as
        arrays (``unnest``), so their values must share one PostgreSQL type per column.
        """
        self._check_writer()
        if not rows:
            return []
        ref = next((t for t in self.tables if t.table == table), None)
        if ref is None:
            raise IdGeneratorError(
                f"stream {self.stream_name!r} has no backing table {table!r} "
                f"(its tables: {', '.join(t.table for t in self.tables)})"
            )
        names = tuple(rows[0])
        if any(tuple(r) != names for r in rows):
            raise IdGeneratorError(f"stream {self.stream_name!r}: every appended row needs the columns {names}")
        single = len(rows) == 1
        capture = self.capture
        fields = capture.fields_for(table) if capture is not None else None
        key = (table, names, single, fields)
        sql = self._append_sql.get(key)
        if sql is None:
            types = None
            if not single:
                types = await column_types(txn.conn, ref.table)
                unknown = [c for c in names if c not in types]
                if unknown:
                    raise IdGeneratorError(f"table {ref.table!r} has no column(s) {', '.join(map(repr, unknown))}")
            sql = append_sql(
                ref, names, sequence=self.sequence.name, positive=self.positive, returning=fields or (), types=types
            )
            self._append_sql[key] = sql
        if single:
            params: dict[str, Any] = dict(rows[0])
        else:
            params = {c: [r[c] for r in rows] for c in names}
        params["__instance"] = self.instance_name
        tracker = self.tracker
        token = tracker.begin_fetch()
        params["__floor"] = token
        ids: list[int] = []
        try:
            cur = await txn.conn.execute(sql, params)
            returned = await cur.fetchall()
            attempt = 0
            while not returned:
                # The statement refused an ID at or below the floor and wrote nothing (see idgen/append.py).
                await self._repair_reissued(txn.conn, token, None, attempt)
                attempt += 1
                cur = await txn.conn.execute(sql, params)
                returned = await cur.fetchall()
            ids = sorted(int(r[0]) * self.factor for r in returned)
        finally:
            tracker.end_fetch(token, ids)
        if fields is None:
            txn.on_complete(lambda committed: self._complete(ids, committed))
        else:
            txn.on_complete(lambda committed: self._complete(ids, committed, returned))
        return [i * self.factor for i in ids]

    def _complete(self, ids: list[int], committed: bool = False, rows: list[tuple[Any, ...]] | None = None) -> None:
        """The IDs are done. First the capture gets their ``rows`` if they surely committed, or else
        learns that it lacks them: a rollback, but also a COMMIT whose outcome is unknown (cancelled
        or cut off while waiting for the answer) may have stored rows."""
        if not ids:
            return
        capture = self.capture
        if capture is not None:
            try:
                if committed and rows is not None:
                    capture.captured(rows)
                else:
                    capture.uncaptured(ids)
            except Exception:
                log.exception("row capture of stream %s failed", self.stream_name)
                capture.uncaptured(ids)
        self.tracker.complete(ids)
        if self._persister is not None:
            self._persister.mark_dirty()
        for listener in self._listeners:
            try:
                listener()
            except Exception:
                log.exception("completion listener of stream %s failed", self.stream_name)

    async def flush_position(self) -> None:
        """Write this writer's position to ``stream_positions`` now (it is otherwise written lazily)."""
        if self._persister is not None:
            await self._persister.flush()

    @property
    def position_writes(self) -> int:
        """How many times this writer's position was written to ``stream_positions`` since start."""
        return self._persister.writes if self._persister is not None else 0

    def add_completion_listener(self, callback: Callable[[], None]) -> None:
        """Call ``callback()`` after every completion (the replication streamer's wake-up)."""
        self._listeners.append(callback)

    # -- reading -----------------------------------------------------------------------------------

    def get_current_token(self) -> int:
        """The watermark: every fact at or before it, from any writer, is complete."""
        return self.tracker.persisted_upto * self.factor

    def get_persisted_upto_position(self) -> int:
        """Same as :meth:`get_current_token`."""
        return self.get_current_token()

    def get_current_token_for_writer(self, instance: str) -> int:
        """The maximal view of ``instance``'s position (for this instance: what it announces)."""
        return self.tracker.position_for_writer(instance) * self.factor

    def get_slowest_writer_token(self) -> int:
        """The position of the stream's slowest writer as this instance sees it (a token, as
        :meth:`get_current_token_for_writer`); this instance counts among the writers only when it
        writes the stream."""
        me = self.instance_name
        seen = {w: self.get_current_token_for_writer(w) for w in set(self.tracker.positions()) | {me}}
        writers = [at for w, at in seen.items() if w != me or self.is_writer]
        return min(at * self.factor for at in writers or seen.values()) * self.factor

    def get_minimal_local_current_token(self) -> int:
        """The position of this instance's own completed writes."""
        return self.tracker.minimal_local_position() * self.factor

    def wrote_after(self, token: int) -> bool:
        """Whether this instance completed an ID after ``token`` (in the stream's direction) since it
        started, or its own position is after it: see :meth:`PositionTracker.wrote_above`."""
        return self.tracker.wrote_above(token * self.factor)

    def get_positions(self) -> dict[str, int]:
        """Every known writer's position (writers that never wrote or announced may be missing)."""
        return {w: p * self.factor for w, p in self.tracker.positions().items()}

    def advance(self, instance: str, token: int) -> None:
        """Replication says ``instance`` has reached ``token``. Never moves anything backwards."""
        value = token * self.factor
        if value <= 0:
            raise ValueError(f"stream {self.stream_name!r}: position {token} is on the wrong side of zero")
        self.tracker.advance(instance, value)
        if self._persister is not None:
            self._persister.mark_dirty()

    async def get_max_allocated_token(self) -> int:
        """The highest ID the sequence has handed out (used to clamp tokens from the future)."""
        async with self.db.autocommit() as conn:
            return max(await self.sequence.last_allocated(conn), 0) * self.factor

    async def check_retired_writers(self) -> list[str]:
        """Forget writers that are neither configured nor alive; returns their names.

        A writer that was removed from the configuration (or announced itself without being
        configured) keeps bounding the watermark until its lease shows it is gone.
        """
        if self.leases is None:
            return []
        tracker = self.tracker
        extra = [w for w in tracker.positions() if w != self.instance_name and w not in self.writers]
        if not extra:
            return []
        alive = await self.leases.alive(self.positions_key, extra)
        gone = [w for w in extra if w not in alive]
        for writer in gone:
            tracker.forget_writer(writer)
        return gone

    def __repr__(self) -> str:
        return f"<MultiWriterIdGenerator {self.stream_name} on {self.instance_name}>"
