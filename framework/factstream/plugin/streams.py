"""The Stream contract: what a plugin declares about one stream.

A stream is an append-only log of facts with integer stream IDs. The spec says where its rows live
(one or more backing tables, each with the column holding the stream ID and the column naming the
writer instance), which Postgres sequence hands out its IDs, whether IDs grow upwards (normal) or
downwards (a backfill stream: -2, -3, ...), who may write it, and the row type sent over replication
(a ``msgspec.Struct`` whose fields, in order, are the wire array).

A spec is generic in its row type (``StreamSpec[LikeRow]``, inferred from ``row_type``), and so is
what reacts to its rows: a :class:`RowHandlerSpec` pairs a stream spec with a handler of that row
type, so mypy checks a handler against the stream it is registered for.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Generic, Literal, Protocol, TypeVar

import msgspec

from factstream.names import check_name

if TYPE_CHECKING:
    from factstream.db.database import Database
    from factstream.plugin.api import HostApi

WritersMode = Literal["configured", "any"]

#: The keys of every ``/sync`` body, which no stream's ``sync_section`` may take.
RESERVED_SYNC_KEYS = frozenset({"next_batch", "streams", "limited"})

#: A stream's row type: a ``msgspec.Struct`` subclass.
RowT = TypeVar("RowT", bound=msgspec.Struct)
#: A rows handler takes rows of its type or of any subtype: contravariant in it.
RowT_contra = TypeVar("RowT_contra", bound=msgspec.Struct, contravariant=True)

#: One update: the fact's stream ID as sent on the wire (positive, also for backwards streams) and a
#: row of the stream's row type.
Update = tuple[int, Any]

#: ``(db, instance, from_token exclusive, upto_token inclusive, limit) -> (updates, upto_token, limited)``.
#: Updates are sorted by token. ``limit`` is a target: when the function stops early it returns
#: ``limited=True`` and an ``upto_token`` such that every row with a token at or below it was returned,
#: so the rows of one token are never split between two calls.
UpdateFunction = Callable[["Database", str, int, int, int], Awaitable[tuple[list[Update], int, bool]]]


@dataclass(frozen=True)
class Wake:
    """Whose long polls a row wakes: users directly, and every user in the given rooms."""

    users: tuple[str, ...] = ()
    rooms: tuple[str, ...] = ()


@dataclass(frozen=True)
class SyncRequest:
    """One user's ``/sync`` for one stream: the rows after ``since`` up to ``upto``, per writer.

    ``since`` and ``upto`` map each writer instance of the stream to a wire token (the positions the
    client's token and the new token hold for that writer); a writer missing from ``since`` is at 0.
    ``device`` is the requesting device, if the client named one. ``host`` is the running host
    (:class:`~factstream.HostApi`: ``host.database()``, ``host.caches``, ``host.state(...)``). At most ``limit``
    items should be returned; ``limited`` in the response then tells the client to sync again.

    ``initial``: the client holds nothing yet (no ``since``) and this is the
    request's first range: a stream that answers with a snapshot (a room's state and latest events)
    rather than a log gives it here. ``filter``: the request's ``filter`` (a JSON object; ``{}`` when
    none was given), for the stream to read its own part of. ``watch_rooms(rooms)``: tell the
    notifier which rooms this user follows, so that ``Wake(rooms=...)`` of a later row reaches them
    (a stream whose rows wake rooms calls it on every request: it costs nothing when nothing changed).
    """

    host: HostApi
    stream: str
    user: str
    device: str | None
    since: dict[str, int]
    upto: dict[str, int]
    limit: int = 1000
    initial: bool = False
    filter: Mapping[str, Any] = field(default_factory=dict)
    watch_rooms: Callable[[Iterable[str]], None] | None = None


#: ``async (SyncRequest) -> list`` of JSON-able items, or the section (``sync_section``): see ``StreamSpec.sync_rows``.
SyncRowsFunction = Callable[[SyncRequest], Awaitable[list[Any]] | Awaitable[Mapping[str, Any]]]


@dataclass(frozen=True)
class StreamTable:
    """A backing table of a stream: ``id_column`` holds the stream ID, ``instance_column`` the writer."""

    table: str
    instance_column: str
    id_column: str

    def __post_init__(self) -> None:
        for what, value in (("table", self.table), ("column", self.instance_column), ("column", self.id_column)):
            check_name(what, value)


class AnyStreamSpec:
    """A :class:`StreamSpec` of any row type: what ``register_streams``'s ``register`` takes.

    Not generic on purpose. Were ``register`` typed ``(StreamSpec[RowT]) -> None``, mypy would infer
    a spec built inside the call (``register(StreamSpec(...))``) from that context, as a
    ``StreamSpec[Any]``, and check nothing; against a base that is not generic, every spec is
    checked where it is built (its ``wake`` against its ``row_type``, say).
    """


@dataclass(frozen=True)
class StreamSpec(AnyStreamSpec, Generic[RowT]):
    """Everything the core needs to generate IDs for, replicate and export one stream.

    * ``name``: the replication stream name (``RDATA <name> ...``), unique across plugins.
    * ``row_type``: a ``msgspec.Struct``; its fields in declaration order form the wire array. The
      spec is generic in it: ``StreamSpec(name="likes", row_type=LikeRow, ...)`` is a
      ``StreamSpec[LikeRow]``.
    * ``tables``: the backing tables (several for streams such as events).
    * ``sequence``: the Postgres sequence (default ``<name>_seq``); ``positions_key``: the key in
      ``stream_positions`` (default the name).
    * ``positive``: ``False`` for a backwards stream whose IDs are -2, -3, ... (wire tokens positive)
    * ``writers``: ``"configured"`` (the instances listed under ``stream_writers`` in the config) or
      ``"any"`` (every instance writes its own facts).
    * ``sync_key``: the field of the sync token that follows this stream, if clients sync it.
    * ``user_field``: the row field naming the user a row belongs to (``"user_id"``). By default a
      row wakes that user's long polls and only that user sees it in ``/sync``.
    * ``wake``: ``row -> Wake(users, rooms)``, overriding the default from ``user_field``: whose long
      polls a row wakes (on every instance, for replicated and local rows alike).
    * ``sync_rows``: ``async (SyncRequest) -> list`` of JSON-able items for one user's ``/sync``,
      overriding the default (the stream's rows in the request's range whose ``user_field`` is the
      user, as ``{"stream_id", "instance", **fields}``). It is also called once per ``/sync``, before
      waiting, with the empty range at the client's token (``since == upto``): a stream that keeps
      per-client state acknowledges there what the client has (a reader of ranges returns nothing).
      A stream with a ``sync_key`` and neither ``user_field`` nor ``sync_rows`` shows nobody
      anything: visibility is never implicit.
    * ``sync_section``: the top-level key of the ``/sync`` body that this stream's ``sync_rows`` fills
      (``"rooms"`` for room events). Its ``sync_rows`` then returns a mapping, not a list: the
      section itself (an empty mapping: nothing new), covering the whole range it was given. Without
      it, the items go under ``streams.<name>``. Streams may share a section: their parts are merged
      (``factstream.sync.sections``), so a plugin adds ``rooms.join.<room>.ephemeral`` to the events
      plugin's rooms without either knowing of the other.
    * ``room_tokens``: the stream's token field is a room token (``s<pos>``, ``t<topo>-<pos>`` or
      ``m…``), so that the position in ``next_batch`` reads as the same tokens that page a room.
    * ``kept``: the stream has no table: its writer keeps the facts (in memory or wherever it likes) and
      hands the host a keeper that reads them (``host.kept_stream``); ``tables`` is then empty, there
      is no sequence, no export and no default ``/sync`` reader (give ``sync_rows``), and a position
      is the writer's count from the start of its run (docs/writing-plugins.md, "Streams without a
      table").
    """

    name: str
    row_type: type[RowT]
    tables: tuple[StreamTable, ...]
    sequence: str = ""
    positions_key: str = ""
    positive: bool = True
    writers: WritersMode = "configured"
    sync_key: str | None = None
    description: str = ""
    update_function: UpdateFunction | None = None
    user_field: str | None = None
    wake: Callable[[RowT], Wake] | None = None
    sync_rows: SyncRowsFunction | None = None
    sync_section: str | None = None
    room_tokens: bool = False
    kept: bool = False

    def __post_init__(self) -> None:
        check_name("stream", self.name)
        if not (isinstance(self.row_type, type) and issubclass(self.row_type, msgspec.Struct)):
            raise ValueError(f"stream {self.name!r}: row_type must be a msgspec.Struct subclass, not {self.row_type!r}")
        tables = tuple(self.tables)
        if self.kept:
            self._check_kept(tables)
        elif not tables or not all(isinstance(t, StreamTable) for t in tables):
            raise ValueError(
                f"stream {self.name!r}: tables must be a non-empty sequence of StreamTable "
                "(a stream whose writer keeps its facts says kept=True)"
            )
        object.__setattr__(self, "tables", tables)
        object.__setattr__(self, "sequence", check_name("sequence", self.sequence or f"{self.name}_seq"))
        object.__setattr__(self, "positions_key", check_name("positions key", self.positions_key or self.name))
        if self.writers not in ("configured", "any"):
            raise ValueError(f"stream {self.name!r}: writers must be 'configured' or 'any', not {self.writers!r}")
        if self.sync_key is not None:
            check_name("sync key", self.sync_key)
        if self.user_field is not None and self.user_field not in self.row_type.__struct_fields__:
            raise ValueError(
                f"stream {self.name!r}: user_field {self.user_field!r} is not a field of "
                f"{self.row_type.__name__} (fields: {', '.join(self.row_type.__struct_fields__)})"
            )
        if self.sync_section is not None:
            check_name("sync section", self.sync_section)
            if self.sync_section in RESERVED_SYNC_KEYS:
                raise ValueError(
                    f"stream {self.name!r}: sync_section {self.sync_section!r} is a key of every /sync body already"
                )
            if self.sync_rows is None:
                raise ValueError(f"stream {self.name!r}: a sync_section is filled by sync_rows, which is missing")
        for what in ("wake", "sync_rows"):
            value = getattr(self, what)
            if value is not None and not callable(value):
                raise ValueError(f"stream {self.name!r}: {what} must be callable")

    def _check_kept(self, tables: tuple[StreamTable, ...]) -> None:
        what = f"stream {self.name!r} is kept by its writer (kept=True)"
        if tables:
            raise ValueError(f"{what}: it has no tables, not {', '.join(repr(getattr(t, 'table', t)) for t in tables)}")
        if self.update_function is not None:
            raise ValueError(
                f"{what}: its updates come from the keeper its writer gives host.kept_stream, not update_function"
            )
        if not self.positive:
            raise ValueError(f"{what}: its positions grow upwards (positive=True)")
        if self.sync_key is not None and self.sync_rows is None:
            raise ValueError(f"{what}: a sync_key needs sync_rows (there is no table to read a user's rows from)")

    @property
    def row_fields(self) -> tuple[str, ...]:
        """The row type's field names in wire order."""
        return tuple(self.row_type.__struct_fields__)

    def updates(self) -> UpdateFunction:
        """The stream's update function: the plugin's own, or one reading the backing tables."""
        return self.update_function or table_update_function(self)


class RowsHandler(Protocol[RowT_contra]):
    """``handler(host, instance, token, rows, local)``: react to one token's rows of one stream.

    ``rows`` are the stream's rows (of its row type) that ``instance`` wrote at ``token`` (the wire
    token: positive also for backwards streams); ``local`` is True for rows this process wrote
    itself. It returns None, or an awaitable (an ``async def`` handler) that is awaited before the
    next handler, and the next token, see rows. The parameters are positional: name them as you like.
    """

    def __call__(
        self, host: HostApi, instance: str, token: int, rows: Sequence[RowT_contra], local: bool, /
    ) -> Awaitable[None] | None: ...


class AnyRowsHandlerSpec:
    """A :class:`RowsHandlerSpec` of any row type: what ``register_rows_handlers``'s ``register`` takes
    (not generic, so that mypy checks each spec where it is built: see :class:`AnyStreamSpec`)."""


@dataclass(frozen=True)
class RowsHandlerSpec(AnyRowsHandlerSpec, Generic[RowT]):
    """``handler`` reacts to every token's rows of ``stream``, in every host process.

    ``stream`` is the stream's spec (the one its plugin registers, imported from that plugin), so the
    handler's row type is checked against the stream's by mypy: a ``RowsHandler[EventsRow]`` for a
    ``StreamSpec[LikeRow]`` is a type error. At start-up the host checks it again: a stream
    registered with another row type than ``stream``'s stops the start naming both plugins. A
    handler for a stream no plugin registered is never called (its plugin may be installed later).

    ``reset``, for a kept stream (``StreamSpec.kept``): ``reset(host, writer, epoch)``, called in every
    process that does not write the stream when ``writer`` started a new run at ``epoch``, before that
    run's facts are handed to ``handler``: forget what ``writer`` said before (the facts the writer
    kept went with its process). It may return an awaitable, which is awaited first.
    """

    stream: StreamSpec[RowT]
    handler: RowsHandler[RowT]
    reset: Callable[[HostApi, str, int], Awaitable[None] | None] | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.stream, StreamSpec):
            raise ValueError(f"rows handler: stream must be a StreamSpec, not {self.stream!r}")
        if not callable(self.handler):
            raise ValueError(f"rows handler of stream {self.stream.name!r}: handler must be callable")
        if self.reset is not None and not (callable(self.reset) and self.stream.kept):
            raise ValueError(
                f"rows handler of stream {self.stream.name!r}: reset must be callable, and only a kept stream "
                "(kept=True) resets"
            )


RegisterStream = Callable[[AnyStreamSpec], None]
"""The ``register`` callable of ``register_streams``: takes one `StreamSpec` per call."""
RegisterRowsHandler = Callable[[AnyRowsHandlerSpec], None]
"""The ``register`` callable of ``register_rows_handlers``: takes one `RowsHandlerSpec` per call."""


#: How many tokens one page of :func:`table_update_function` reads at most, in multiples of its limit.
PAGE_SPAN = 4


def table_update_function(spec: StreamSpec[Any]) -> UpdateFunction:
    """An update function reading rows straight from the backing tables.

    Every backing table must have a column for each field of the row type (same names). Rows are read
    for one writer (``instance_column``), in token order (a token's rows table by table, each table's
    in the order they were stored); when more than ``limit`` rows are waiting,
    the rows of the last token are completed with a second query so that no token is split.

    A page reads at most ``PAGE_SPAN * limit`` tokens of the range (answering ``limited`` at the
    window's end when it holds fewer rows than ``limit``), so its cost is bounded whatever plan
    PostgreSQL picks. Without the bound, a table never analyzed (a new stream bulk-loaded before
    autovacuum came by) made the planner estimate a handful of rows for a range of a million, and
    every page of a catch-up read the whole remaining range (bitmap scan, then a top-N sort): 650 ms
    a page of 2,000 where the index scan takes 1.
    """
    fields = spec.row_fields
    selects = []
    for i, t in enumerate(spec.tables):
        columns = ", ".join(f"{t.table}.{f}" for f in fields)
        wire_id = t.id_column if spec.positive else f"-{t.id_column}"
        selects.append(
            f"SELECT {wire_id} AS token, {i} AS table_order, {t.table}.ctid AS row_order"
            f"{', ' if fields else ''}{columns} FROM {t.table} "
            f"WHERE {t.instance_column} = %(instance)s AND {wire_id} > %(low)s AND {wire_id} <= %(high)s"
        )
    union = " UNION ALL ".join(selects)
    # The rows of one token in a fixed order, the same on every read: table by table, each table's
    # in the order they were stored (an append-only table's rows keep their place), as the writer
    # sent them live. Ordered by the token alone, a sort could return them in any order.
    order = "ORDER BY token, table_order, row_order"
    page = f"SELECT * FROM ({union}) AS u {order} LIMIT %(limit)s"
    rest = f"SELECT * FROM ({union}) AS u WHERE token = %(token)s {order}"
    row_type = spec.row_type

    async def update(
        db: Database, instance: str, from_token: int, upto_token: int, limit: int
    ) -> tuple[list[Update], int, bool]:
        if from_token >= upto_token:
            return [], upto_token, False
        high = min(upto_token, from_token + PAGE_SPAN * limit)
        params = {"instance": instance, "low": from_token, "high": high, "limit": limit}
        rows = await db.fetchall(page, params)
        if len(rows) < limit:
            return [(int(r[0]), row_type(*r[3:])) for r in rows], high, high < upto_token
        last = int(rows[-1][0])
        kept = [r for r in rows if int(r[0]) < last]
        kept += await db.fetchall(rest, {**params, "token": last})
        return [(int(r[0]), row_type(*r[3:])) for r in kept], last, True

    return update
