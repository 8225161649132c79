"""A stream's PostgreSQL sequence: reserving IDs, reading the head, and repairing it.

Sequences ignore transactions: ``nextval`` is never rolled back, so an ID, once handed out, is never
handed out again, and a rolled-back fact leaves a gap that readers step over. Reserving several IDs at
once uses ``generate_series`` in one round trip; the IDs of one batch are not necessarily contiguous
when other processes reserve at the same time.
"""

from __future__ import annotations

from factstream.db.database import Connection
from factstream.names import check_name


class PostgresSequence:
    """Operations on one sequence (name validated, so it is safe to interpolate)."""

    def __init__(self, name: str) -> None:
        self.name = check_name("sequence", name)
        self._next_one = f"SELECT nextval('{name}')"
        self._next_many = f"SELECT nextval('{name}') FROM generate_series(1, %(n)s)"
        self._head = f"SELECT last_value, is_called FROM {name}"

    async def next_ids(self, conn: Connection, n: int) -> list[int]:
        """Reserve ``n`` IDs (ascending)."""
        if n == 1:
            cur = await conn.execute(self._next_one)
            row = await cur.fetchone()
            assert row is not None
            return [int(row[0])]
        cur = await conn.execute(self._next_many, {"n": n})
        return sorted(int(r[0]) for r in await cur.fetchall())

    async def last_allocated(self, conn: Connection) -> int:
        """The highest ID handed out so far (0 if none)."""
        cur = await conn.execute(self._head)
        row = await cur.fetchone()
        assert row is not None
        last_value, is_called = int(row[0]), bool(row[1])
        return last_value if is_called else last_value - 1

    async def exists(self, conn: Connection) -> bool:
        cur = await conn.execute(
            "SELECT 1 FROM pg_class WHERE relkind = 'S' AND relname = %(name)s", {"name": self.name}
        )
        return await cur.fetchone() is not None

    async def set_last(self, conn: Connection, value: int) -> None:
        """Make ``value`` the last ID handed out; the next ``nextval`` returns ``value + 1``.

        Only ever moves forward (``GREATEST`` with the current head), so two processes repairing at
        once cannot move it back.
        """
        await conn.execute(
            f"SELECT setval('{self.name}', GREATEST(%(v)s, (SELECT CASE WHEN is_called THEN last_value "
            f"ELSE last_value - 1 END FROM {self.name})), true)",
            {"v": value},
        )


def create_sequence_sql(name: str) -> list[str]:
    """SQL for a migration creating a stream sequence whose first handed-out ID is 2.

    The sequence is created and then advanced once with ``SELECT nextval``; ``START WITH 2`` would be
    wrong: until the first ``nextval``, ``last_value`` reads 2 and a reader would take 2 as written.
    """
    check_name("sequence", name)
    return [f"CREATE SEQUENCE {name}", f"SELECT nextval('{name}')"]
