"""The persisted-upto watermark of a stream, derived from the database alone. Blocking I/O.

An export must never include a fact above the watermark (the largest ID such that every ID at or
below it, from any writer, has completed), or a fact that commits later below it would be lost for
good: the next export starts above the checkpoint. Writers know the watermark from their ID
generators; an export process is not a writer and does not replicate, so it derives a conservative
one from what is durable, using the same rules as :mod:`factstream.idgen.positions` and
:mod:`factstream.idgen.recovery`:

1. ``S``, the sequence head (the highest ID handed out), is read **first**. A writer registers its
   ``stream_positions`` row before it reserves anything, so any writer that reserved an ID at or below
   ``S`` has a row by the time the rows are read next; a writer without a row reserves only IDs above
   ``S``.
2. Each ``stream_positions`` row is a lower bound of that writer's position: every ID the writer
   reserved at or below it has completed (a row is written lazily, after the fact, and never moves
   back). A writer that is **gone** holds nothing unfinished (its transactions died with its
   sessions), and whatever it reserves after a restart comes from the sequence, above ``S``; so it
   bounds nothing below ``S``. Gone means: no PostgreSQL session named ``factstream/<instance>`` (in
   any state, idle included) and no writer lease held, checked after ``S`` was read. Anything else
   counts as alive, so an unknown situation holds the watermark back rather than letting it pass a gap.
3. ``floor = min(S, positions of the writers that are alive)``: every ID at or below it has completed.
4. Above ``floor`` the watermark moves only through an unbroken run of IDs that have a committed row in
   a backing table (a visible row is a completed ID). The first ID without one (in flight, or a
   rollback's gap that the writers' positions have not yet passed) stops it.

The result is never above the watermark any writer computes, and it catches up as soon as the
writers persist their positions (every ``persist_interval``, 0.1 s by default). It may go down
between two calls (a writer coming back), but every value it ever returned stays valid: completed IDs
stay completed. Values are wire tokens: positive, also for backwards streams.
"""

from __future__ import annotations

from typing import Any

import psycopg

from factstream.export.plan import StreamPlan

#: Rows above the floor examined per query while following the run of committed IDs.
RUN_PAGE = 100_000

# Writer leases are advisory locks (see factstream.idgen.leases): namespace key and key format.
_LEASE_NAMESPACE = 0x46535457


def sequence_head(conn: psycopg.Connection[Any], plan: StreamPlan) -> int:
    """The highest ID the stream's sequence has handed out, normalised positive (0 if none)."""
    row = conn.execute(f"SELECT last_value, is_called FROM {plan.sequence}").fetchone()
    assert row is not None
    last, called = int(row[0]), bool(row[1])
    return max(last if called else last - 1, 0)


def stored_positions(conn: psycopg.Connection[Any], plan: StreamPlan) -> dict[str, int]:
    """``stream_positions`` of the stream, normalised positive."""
    factor = 1 if plan.positive else -1
    rows = conn.execute(
        "SELECT instance_name, stream_id FROM stream_positions WHERE stream_name = %(s)s", {"s": plan.positions_key}
    ).fetchall()
    return {str(r[0]): int(r[1]) * factor for r in rows}


def live_writers(conn: psycopg.Connection[Any], plan: StreamPlan, instances: list[str]) -> set[str]:
    """Which of ``instances`` may still hold unfinished IDs: they have a session or hold a lease."""
    if not instances:
        return set()
    rows = conn.execute(
        "SELECT k.name FROM unnest(%(names)s::text[]) AS k(name) WHERE EXISTS ("
        " SELECT 1 FROM pg_stat_activity a WHERE a.datname = current_database()"
        " AND a.application_name = left('factstream/' || k.name, 63) AND a.pid <> pg_backend_pid()"
        ") OR EXISTS ("
        " SELECT 1 FROM pg_locks l WHERE l.locktype = 'advisory' AND l.classid = %(ns)s AND l.objsubid = 2"
        " AND l.granted AND l.database = (SELECT oid FROM pg_database WHERE datname = current_database())"
        " AND l.objid = (hashtext(%(prefix)s || k.name)::bigint & 4294967295)::oid)",
        {"names": sorted(instances), "ns": _LEASE_NAMESPACE, "prefix": f"{plan.positions_key}:"},
    ).fetchall()
    return {str(r[0]) for r in rows}


def committed_run(conn: psycopg.Connection[Any], plan: StreamPlan, floor: int) -> int:
    """The end of the unbroken run of IDs above ``floor`` (normalised) that have committed rows."""
    ids = []
    for t in plan.tables:
        norm = t.id_column if plan.positive else f"-{t.id_column}"
        cond = f"{t.id_column} > %(w)s" if plan.positive else f"{t.id_column} < -%(w)s::bigint"
        ids.append(f"SELECT {norm}::bigint AS id FROM {t.table} WHERE {cond}")
    # IDs are distinct and sorted, so id - row_number() is non-decreasing and equals the floor exactly
    # along the leading run of consecutive IDs.
    sql = (
        "SELECT count(*), max(id) FROM ("
        f" SELECT id, row_number() OVER (ORDER BY id) AS n FROM (SELECT DISTINCT id FROM ({' UNION ALL '.join(ids)})"
        " AS u ORDER BY id LIMIT %(page)s) AS d"
        ") AS r WHERE id - n = %(w)s"
    )
    upto = floor
    while True:
        row = conn.execute(sql, {"w": upto, "page": RUN_PAGE}).fetchone()
        assert row is not None
        count, top = int(row[0]), row[1]
        if not count:
            return upto
        upto = int(top)
        if count < RUN_PAGE:
            return upto


def persisted_upto(conn: psycopg.Connection[Any], plan: StreamPlan) -> int:
    """The stream's watermark (a wire token) by the rules in the module docstring."""
    head = sequence_head(conn, plan)  # first: see rule 1
    stored = stored_positions(conn, plan)
    alive = live_writers(conn, plan, list(stored))
    floor = min([head, *(p for w, p in stored.items() if w in alive)])
    return committed_run(conn, plan, floor)
