"""The database handle the host and plugins use at run time: pooled psycopg 3 connections,
transactions with completion callbacks, and SQLAlchemy Core statements compiled once.

Why not SQLAlchemy's async engine for execution: measured on this project's machines, its
asyncio adaptation layer (pool checkout and a greenlet switch per statement) cut single-fact appends
from about 1,650 to 970 facts/s. Statements are still built with SQLAlchemy Core (or written as SQL
strings) and migrations still run through SQLAlchemy and alembic; only execution goes straight to
psycopg's async pool. See docs/decisions.md.

Stream IDs reserved inside a transaction must be marked complete *after* the transaction has
committed (or rolled back): a reader told about the ID earlier could look for the row before it is
visible and move past it. :meth:`Database.transaction` runs completion callbacks after ``COMMIT``
has returned.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from typing import Any

import psycopg
from psycopg.rows import TupleRow
from psycopg_pool import AsyncConnectionPool
from sqlalchemy.dialects.postgresql import psycopg as pg_dialect
from sqlalchemy.sql import ClauseElement

from factstream.db.engine import libpq_url

log = logging.getLogger(__name__)

Connection = psycopg.AsyncConnection[TupleRow]
Cursor = psycopg.AsyncCursor[TupleRow]
Completion = Callable[[bool], None]

_DIALECT = pg_dialect.dialect()  # type: ignore[no-untyped-call]
_compiled: dict[int, tuple[ClauseElement, Any]] = {}


def compile_statement(statement: str | ClauseElement, params: Mapping[str, Any] | None) -> tuple[str, Any]:
    """SQL and parameters for psycopg: strings pass through; Core statements are compiled once."""
    if isinstance(statement, str):
        return statement, params
    entry = _compiled.get(id(statement))
    if entry is None or entry[0] is not statement:
        if len(_compiled) > 2000:
            _compiled.clear()
        entry = (statement, statement.compile(dialect=_DIALECT))
        _compiled[id(statement)] = entry
    compiled = entry[1]
    return compiled.string, compiled.construct_params(dict(params or {}))


async def execute(conn: Connection, statement: str | ClauseElement, params: Mapping[str, Any] | None = None) -> Cursor:
    """Run one statement on ``conn``; returns the cursor (``await cur.fetchall()``)."""
    sql, args = compile_statement(statement, params)
    return await conn.execute(sql, args)


class Transaction:
    """An open transaction: run statements; register what must happen once it ends.

    ``conn`` is public (plugins use it, see docs/writing-plugins.md): the transaction's psycopg
    ``AsyncConnection``, for what :meth:`execute` does not offer, such as pipeline mode
    (``async with txn.conn.pipeline():``, several statements in one round trip), binary cursors,
    ``executemany`` or ``COPY``. The transaction's outcome belongs to the block that opened it
    (:meth:`Database.transaction`): code given a transaction never commits, rolls back, closes
    ``conn`` or changes its autocommit or isolation, or the completion callbacks would be told the
    wrong outcome; :meth:`execute_and_commit` is the one way to commit early.
    """

    def __init__(self, conn: Connection) -> None:
        #: The transaction's psycopg connection (see the class docstring for what may be done with it).
        self.conn = conn
        self._on_complete: list[Completion] = []
        self._after_commit: list[Callable[[], None]] = []
        #: Set once :meth:`execute_and_commit` has committed: the block's end then has nothing to commit.
        self.committed = False

    async def execute(self, statement: str | ClauseElement, params: Mapping[str, Any] | None = None) -> Cursor:
        """Execute a statement (SQL with ``%(name)s`` placeholders, or SQLAlchemy Core) in this transaction."""
        self._check_open()
        return await execute(self.conn, statement, params)

    async def execute_and_commit(
        self, statement: str | ClauseElement, params: Mapping[str, Any] | None = None
    ) -> Cursor:
        """Execute the transaction's last statement and ``COMMIT`` in one round trip; returns its cursor.

        Statements sent before it in an open ``conn.pipeline()`` go in the same round trip. If any of
        them fails, nothing is committed and the error is raised here (the block then rolls back). Once
        this returns, the transaction has committed: the completion callbacks get ``True`` even if the
        rest of the block raises, and nothing more may be executed in it.
        """
        self._check_open()
        sql, args = compile_statement(statement, params)
        conn = self.conn
        async with conn.pipeline():
            cur = await conn.execute(sql, args)
            await conn.commit()  # queued behind the statement; the pipeline's sync sends both
        self.committed = True
        return cur

    def _check_open(self) -> None:
        if self.committed:
            raise psycopg.ProgrammingError(
                "the transaction has committed (execute_and_commit): nothing more runs in it"
            )

    def on_complete(self, callback: Completion) -> None:
        """Call ``callback(committed)`` once the transaction has committed (True) or rolled back (False)."""
        self._on_complete.append(callback)

    def after_commit(self, callback: Callable[[], None]) -> None:
        """Call ``callback()`` once the transaction has committed (not on rollback)."""
        self._after_commit.append(callback)

    def _finish(self, committed: bool) -> None:
        for callback in self._on_complete:
            _safely(callback, committed)
        if committed:
            for after in self._after_commit:
                _safely(after)


def _safely(callback: Callable[..., None], *args: bool) -> None:
    try:
        callback(*args)
    except Exception:  # a callback must not turn a committed transaction into an error
        log.exception("transaction completion callback %r failed", callback)


class Database:
    """Pooled access to the one PostgreSQL database, for one instance.

    Every session is named ``factstream/<instance_name>`` in PostgreSQL (``application_name``): that
    is how other processes tell whether this instance is gone (see ``factstream.idgen.leases``).
    """

    def __init__(
        self, url: str, *, instance_name: str | None = None, pool_size: int = 10, connect_timeout: float = 5.0
    ) -> None:
        self.url = url
        self.instance_name = instance_name
        self.application_name = f"factstream/{instance_name}" if instance_name else "factstream"
        self.connect_kwargs: dict[str, Any] = {
            "application_name": self.application_name,
            "connect_timeout": max(1, int(connect_timeout)),
        }
        self.pool: AsyncConnectionPool[Connection] = AsyncConnectionPool(
            libpq_url(url),
            min_size=1,
            max_size=pool_size,
            kwargs=self.connect_kwargs,
            open=False,
            timeout=max(connect_timeout, 30.0),
            name=self.application_name,
        )
        self._opened = False

    @classmethod
    def from_url(
        cls, url: str, *, instance_name: str | None = None, pool_size: int = 10, connect_timeout: float = 5.0
    ) -> Database:
        return cls(url, instance_name=instance_name, pool_size=pool_size, connect_timeout=connect_timeout)

    async def open(self) -> None:
        """Open the pool (done on first use too)."""
        if not self._opened:
            self._opened = True
            await self.pool.open()

    async def connect(self, *, autocommit: bool = True) -> Connection:
        """A new dedicated connection outside the pool (the caller closes it)."""
        return await psycopg.AsyncConnection.connect(libpq_url(self.url), autocommit=autocommit, **self.connect_kwargs)

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[Transaction]:
        """A transaction that commits when the block ends normally and rolls back if it raises.

        Completion callbacks run after the outcome is known; if ``COMMIT`` itself fails the outcome
        counts as a rollback.
        """
        await self.open()
        async with self.pool.connection() as conn:
            txn = Transaction(conn)
            try:
                yield txn
                if not txn.committed:
                    await conn.commit()
            except BaseException:
                if txn.committed:  # the block raised after execute_and_commit: the data is stored
                    txn._finish(committed=True)
                    raise
                try:
                    await conn.rollback()
                finally:
                    txn._finish(committed=False)
                raise
            txn._finish(committed=True)

    @asynccontextmanager
    async def autocommit(self) -> AsyncIterator[Connection]:
        """A pooled connection in autocommit mode (each statement is its own transaction)."""
        await self.open()
        async with self.pool.connection() as conn:
            await conn.set_autocommit(True)
            try:
                yield conn
            finally:
                await conn.set_autocommit(False)

    async def fetchall(self, statement: str | ClauseElement, params: Mapping[str, Any] | None = None) -> list[TupleRow]:
        """Run one statement in autocommit mode and return its rows."""
        async with self.autocommit() as conn:
            cur = await execute(conn, statement, params)
            return await cur.fetchall() if cur.description else []

    async def close(self) -> None:
        if self._opened:
            await self.pool.close()
            self._opened = False
