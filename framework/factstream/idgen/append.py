"""The INSERT that appends one-row facts and reserves their stream IDs in the same statement.

``nextval`` runs inside the ``INSERT``, which saves the round trip of a separate reservation. The
price is that the statement writes its rows before the generator sees the IDs, so the check that a
running writer needs after a failover (every new ID above the highest it has seen allocated, see
:func:`factstream.idgen.recovery.plan_reissue_repair`) is made by the statement itself: it takes the
first ID before any row and inserts its rows only if that ID is above ``%(__floor)s``. Otherwise it
inserts nothing and returns no row; the generator repairs the sequence and runs it again. A re-issued
ID is never written, not even in an uncommitted row: the backing tables usually have a unique index
on the ID column, and a duplicate would abort the caller's transaction. All or nothing keeps the IDs
of one statement in the rows' order.

Checking the first ID is enough: the rows take their IDs in order, each from a later ``nextval`` than
the one before, so every other ID is higher. (Only a ``setval`` back while the statement runs could
break that; a failover ends the statements running on the old server. The tracker would still
refuse such an ID, with an error.) Two shapes, both one round trip and no dearer than a plain insert:

* one row: ``INSERT ... SELECT s.id, ... FROM (SELECT nextval(...) AS id) AS s WHERE s.id > floor``.
  PostgreSQL neither pulls up nor pushes a condition into a subquery whose output is volatile, so
  ``nextval`` runs once;
* several rows: the first ID comes from a one-row ``MATERIALIZED`` CTE, which a one-time filter
  compares with the floor before the arrays are unnested; the first row takes that ID and every other
  row its own ``nextval``, in the rows' order. A refused statement uses up one ID, not one per row.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from factstream.db.database import Connection
from factstream.names import check_name
from factstream.plugin.streams import StreamTable


def append_sql(
    table: StreamTable,
    columns: Sequence[str],
    *,
    sequence: str,
    positive: bool,
    returning: Sequence[str],
    types: Mapping[str, str] | None,
) -> str:
    """The guarded INSERT of ``columns`` into ``table``, returning the ID column and ``returning``.

    ``types`` (column -> PostgreSQL type) selects the several-rows form, whose parameters are
    arrays; ``None`` the one-row form. Parameters: each column, ``__instance`` and ``__floor``.
    """
    names = [check_name("column", c) for c in columns]
    sign = "" if positive else "-"
    targets = ", ".join([table.id_column, table.instance_column, *names])
    insert = f"INSERT INTO {table.table} ({targets}) "
    if types is None:
        sql = (
            f"{insert}SELECT {sign}s.__id, %(__instance)s{''.join(f', %({c})s' for c in names)} "
            f"FROM (SELECT nextval('{sequence}') AS __id) AS s WHERE s.__id > %(__floor)s::bigint"
        )
    else:
        # Arrays need their element type spelled out: psycopg sends strings untyped.
        arrays = ", ".join(f"%({c})s::{types[c]}[]" for c in names)
        next_id = f"nextval('{sequence}')"
        sql = (
            f"WITH first AS MATERIALIZED (SELECT {next_id} AS __id) "
            f"{insert}SELECT {sign}(CASE WHEN u.__n = 1 THEN (SELECT __id FROM first) ELSE {next_id} END), "
            f"%(__instance)s{''.join(f', u.{c}' for c in names)} "
            f"FROM unnest({arrays}) WITH ORDINALITY AS u({', '.join(names)}, __n) "
            "WHERE (SELECT __id FROM first) > %(__floor)s::bigint ORDER BY u.__n"
        )
    return sql + f" RETURNING {table.id_column}{''.join(', ' + check_name('column', f) for f in returning)}"


async def column_types(conn: Connection, table: str) -> dict[str, str]:
    """Every column of ``table`` with its PostgreSQL type, as ``format_type`` spells it."""
    cur = await conn.execute(
        "SELECT attname, format_type(atttypid, atttypmod) FROM pg_attribute "
        "WHERE attrelid = %(t)s::regclass AND attnum > 0 AND NOT attisdropped",
        {"t": table},
    )
    return {str(r[0]): str(r[1]) for r in await cur.fetchall()}
