"""The database handle the host and plugins use: pooled async connections and transactions with
completion callbacks.

Stream IDs reserved inside a transaction must be marked complete *after* the transaction has committed
(or rolled back): a reader told about the ID earlier could look for the row before it is visible and
move past it. SQLAlchemy's Core events fire before the commit reaches the server, so factstream runs
its own callbacks from :meth:`Database.transaction`, after ``COMMIT`` has returned.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

from sqlalchemy import Executable
from sqlalchemy.engine import CursorResult
from sqlalchemy.ext.asyncio import AsyncConnection, AsyncEngine

from factstream.db.engine import create_engine

log = logging.getLogger(__name__)

Completion = Callable[[bool], None]


class Transaction:
    """An open transaction: run statements on :attr:`conn`; register what must happen once it ends."""

    def __init__(self, conn: AsyncConnection) -> None:
        self.conn = conn
        self._on_complete: list[Completion] = []
        self._after_commit: list[Callable[[], None]] = []

    async def execute(self, statement: Executable, parameters: Any = None) -> CursorResult[Any]:
        """Execute a statement in this transaction."""
        return await self.conn.execute(statement, parameters)

    async def raw(self) -> Any:
        """The underlying psycopg ``AsyncConnection`` (for ``COPY``), in this same transaction."""
        raw = await self.conn.get_raw_connection()
        return raw.driver_connection

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
    """Pooled access to the one PostgreSQL database."""

    def __init__(self, engine: AsyncEngine, url: str) -> None:
        self.engine = engine
        self.url = url

    @classmethod
    def from_url(
        cls, url: str, *, instance_name: str | None = None, pool_size: int = 10, connect_timeout: float = 5.0
    ) -> Database:
        """A pooled database; every session is named ``factstream/<instance_name>`` in PostgreSQL
        (``application_name``), which is how other processes tell whether this instance is gone."""
        engine = create_engine(
            url,
            pool_size=pool_size,
            connect_timeout=connect_timeout,
            application_name=f"factstream/{instance_name}" if instance_name else "factstream",
        )
        return cls(engine, url)

    @asynccontextmanager
    async def transaction(self) -> AsyncIterator[Transaction]:
        """A transaction that commits when the block ends normally and rolls back if it raises.

        Completion callbacks run after the outcome is known; if ``COMMIT`` itself fails the outcome
        counts as a rollback.
        """
        async with self.engine.connect() as conn:
            txn = Transaction(conn)
            try:
                await conn.begin()
                yield txn
                await conn.commit()
            except BaseException:
                try:
                    await conn.rollback()
                finally:
                    txn._finish(committed=False)
                raise
            txn._finish(committed=True)

    @asynccontextmanager
    async def autocommit(self) -> AsyncIterator[AsyncConnection]:
        """A pooled connection in autocommit mode (each statement is its own transaction)."""
        async with self.engine.connect() as conn:
            await conn.execution_options(isolation_level="AUTOCOMMIT")
            yield conn

    async def close(self) -> None:
        await self.engine.dispose()
