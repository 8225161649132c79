"""The default ``/sync`` readers: a stream's rows whose ``user_field`` is the requesting user.

A stream without its own ``sync_rows`` is read here: straight from its backing tables with the user
filter in SQL (the usual case), or through its update function with the filter in Python. Both cut
a response at the limit on a position boundary and say, in :attr:`SyncItems.reached`, how far each
writer's range was covered, so that ``next_batch`` never claims rows nobody looked at.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgspec

from factstream.plugin.streams import StreamSpec, SyncRequest
from factstream.sync.wakeups import SyncedStream


class SyncItems(list[Any]):
    """A default reader's items; ``reached`` is set when they were cut short at the limit.

    ``reached`` then gives, for every writer of the request, the position up to which the items
    cover that writer's range (all rows of a position are included, never split).
    """

    reached: dict[str, int] | None = None


# -- the default reader: the stream's rows whose user_field is the user ------------------------------------


def default_reader(synced: SyncedStream, configured_writers: Sequence[str]) -> Any:
    spec = synced.spec
    field = spec.user_field
    if field is None:

        async def nobody(request: SyncRequest) -> list[Any]:
            return []  # neither user_field nor sync_rows: visibility is never implicit

        return nobody
    if spec.update_function is None:
        return _table_reader(spec, field)
    return _update_function_reader(synced, field)


def _item(token: int, instance: str, row: msgspec.Struct) -> dict[str, Any]:
    return {"stream_id": token, "instance": instance, **msgspec.structs.asdict(row)}


def _cut(request: SyncRequest, items: list[tuple[int, str, Any]], cut: int | None) -> SyncItems:
    """Sorted items as a :class:`SyncItems`; ``cut``: the last position included when limited."""
    items.sort(key=lambda i: i[0])
    out = SyncItems(_item(token, instance, row) for token, instance, row in items)
    if cut is not None:
        out.reached = {w: max(request.since.get(w, 0), min(high, cut)) for w, high in request.upto.items()}
    return out


def _table_reader(spec: StreamSpec[Any], user_field: str) -> Any:
    """Rows straight from the backing tables, filtered by user in SQL (index ``user_field`` for speed).

    One query over every writer's range, in position order, so that a response cut at the limit
    stops at one position for all writers.
    """
    fields = spec.row_fields
    row_type = spec.row_type

    def query(writers: int) -> tuple[str, str]:
        selects = []
        for t in spec.tables:
            ranges = " OR ".join(
                f"({t.instance_column} = %(w{i})s AND {t.id_column} > %(l{i})s AND {t.id_column} <= %(h{i})s)"
                for i in range(writers)
            )
            columns = ", ".join(f"{t.table}.{f}" for f in fields)
            selects.append(
                f"SELECT {t.id_column} AS token, {t.instance_column} AS instance, {columns} FROM {t.table} "
                f"WHERE {t.table}.{user_field} = %(user)s AND ({ranges})"
            )
        union = " UNION ALL ".join(selects)
        return (
            f"SELECT * FROM ({union}) AS u ORDER BY token LIMIT %(limit)s",
            f"SELECT * FROM ({union}) AS u WHERE token = %(token)s",
        )

    queries: dict[int, tuple[str, str]] = {}

    async def read(request: SyncRequest) -> list[Any]:
        ranged = [w for w in sorted(request.upto) if request.since.get(w, 0) < request.upto[w]]
        if not ranged:
            return []
        if len(ranged) not in queries:
            queries[len(ranged)] = query(len(ranged))
        page, rest = queries[len(ranged)]
        params: dict[str, Any] = {"user": request.user, "limit": request.limit}
        for i, w in enumerate(ranged):
            params.update({f"w{i}": w, f"l{i}": request.since.get(w, 0), f"h{i}": request.upto[w]})
        db = request.host.database()
        rows = await db.fetchall(page, params)
        cut = None
        if len(rows) >= request.limit:
            # Never split the rows of one position between two responses.
            cut = int(rows[-1][0])
            rows = [r for r in rows if int(r[0]) < cut] + await db.fetchall(rest, {**params, "token": cut})
        return _cut(request, [(int(r[0]), str(r[1]), row_type(*r[2:])) for r in rows], cut)

    return read


def _update_function_reader(synced: SyncedStream, user_field: str) -> Any:
    """Rows from the stream's own update function, filtered by user in Python (a page at a time)."""
    stream = synced.stream

    async def read(request: SyncRequest) -> list[Any]:
        items: list[tuple[int, str, Any]] = []
        stopped: list[int] = []
        for instance in sorted(request.upto):
            low, high = request.since.get(instance, 0), request.upto[instance]
            found = 0
            while low < high:
                updates, upto, limited = await stream.get_updates_since(instance, low, high)
                mine = [(t, instance, r) for t, r in updates if getattr(r, user_field) == request.user]
                items.extend(mine)
                found += len(mine)
                low = upto
                if not limited:
                    break
                if found >= request.limit:
                    stopped.append(upto)  # this writer's rows after ``upto`` were not read
                    break
        if len(items) < request.limit and not stopped:
            return _cut(request, items, None)
        # Keep the first ``limit`` items in position order, and nothing past a writer not read to the end.
        items.sort(key=lambda i: i[0])
        cut = items[request.limit - 1][0] if len(items) >= request.limit else items[-1][0]
        if stopped:
            cut = min(cut, *stopped)
        return _cut(request, [i for i in items if i[0] <= cut], cut)

    return read
