"""The host as plugins see it: :class:`HostApi`, its :class:`StreamWriter` per stream, its :class:`Caches`.

Every hook that runs in a host process (``startup``, ``shutdown``), every rows handler, every route handler
and every :class:`~factstream.SyncRequest` is handed a ``HostApi``. It is a Protocol: the running
host implements it (``factstream.host.facade``), a plugin's tests may implement it too, and mypy checks
plugins against it. Nothing else of the host is public: a plugin that reaches past this interface
relies on internals that change between releases.

What a plugin gets, and the rules it can rely on:

* **Who runs**: ``instance_name``, ``main_instance``, ``writes(stream)`` and ``settings`` (what
  plugins may read of the core configuration: :class:`~factstream.HostSettings`).
* **Storage**: ``database()`` (transactions, queries) and ``caches`` (named caches, invalidation).
* **Writing a stream**: ``stream(name, RowType)`` returns a typed :class:`StreamWriter`. Appending
  through it reserves the stream ID inside the caller's transaction; when the transaction commits, the
  rows go through this process's reader pipeline with ``local=True`` (cache invalidations declared
  with ``InvalidationSpec``, rows handlers, waking ``/sync`` long polls), exactly as replicated
  rows do on every other process. A plugin therefore declares its invalidations once.
* **Waiting**: ``wait_for_stream_position`` (read-your-writes across processes).
* **Writer IDs in tokens**: ``instance_ids(names)`` and ``instance_names(ids)`` map instance names to
  the small integers that multi-writer tokens (``m5~2.8``) use, the same in every process (the
  ``instance_map`` table): what a plugin needs to read and write tokens of its own in that form.
* **State**: ``state(factory)`` gives one object per host and factory (a store, a cache of its own),
  made on first use; ``plugin_settings(Model)`` the plugin's validated ``plugins.<name>`` section.
* **Tasks**: ``spawn(coroutine, name=...)`` runs a background task the host cancels when it stops,
  before the ``shutdown`` hooks run.
* **Hooks plugins define** (``register_hookspecs``): ``call_hook(spec, **kwargs)`` calls every
  implementation, ``call_first(spec, **kwargs)`` stops at the first answer; both take the spec
  function (typed by its signature), await coroutines and name the plugin that failed.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Coroutine, Hashable, Iterable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, ParamSpec, Protocol, TypeVar

import msgspec
from pydantic import BaseModel

from factstream.caches.lru import LruCache
from factstream.config import HostSettings
from factstream.db.database import Database, Transaction

if TYPE_CHECKING:
    from factstream.replication import wire

RowT = TypeVar("RowT", bound=msgspec.Struct)
#: A writer takes rows of its type (and nothing else): contravariant in it.
RowT_contra = TypeVar("RowT_contra", bound=msgspec.Struct, contravariant=True)
T = TypeVar("T")
P = ParamSpec("P")
R = TypeVar("R")
ModelT = TypeVar("ModelT", bound=BaseModel)

#: What a kept stream's keeper answers: ``(updates as (position, row) pairs, upto, limited)``.
KeptUpdates = tuple[list[tuple[int, RowT]], int, bool]
Keeper = Callable[[int, int, int], Awaitable[KeptUpdates[RowT]] | KeptUpdates[RowT]]
"""A kept stream's keeper (``host.kept_stream(name, Row, keeper)``): ``(from exclusive, upto inclusive,
limit) -> (updates, upto, limited)``, sync or async; ``updates`` are ``(position, row)`` pairs in order."""


class Caches(Protocol):
    """This process's named caches (``host.caches``); see docs/caches.md.

    ``*_local`` methods forget entries in this process only. The others write a row on the
    ``caches`` stream inside the caller's transaction, so every process forgets the entries once the
    transaction commits (this one right after the commit).
    """

    def __contains__(self, name: object) -> bool: ...

    def __iter__(self) -> Iterator[LruCache[Any]]: ...

    def names(self) -> list[str]: ...

    def lookup(self, name: str) -> LruCache[Any] | None: ...

    def get(self, name: str) -> LruCache[Any]: ...

    def invalidate_local(self, name: str, key: Sequence[Hashable]) -> bool: ...

    def invalidate_all_local(self, name: str) -> int: ...

    def invalidate_room_state_local(
        self, room_id: str, members_changed: Sequence[str] = (), *, every_member: bool = False
    ) -> None: ...

    async def invalidate(self, txn: Transaction, name: str, key: Sequence[Hashable]) -> list[int]: ...

    async def invalidate_many(self, txn: Transaction, name: str, keys: Iterable[Sequence[Hashable]]) -> list[int]: ...

    async def invalidate_all(self, txn: Transaction, name: str) -> list[int]: ...

    async def invalidate_room_state(
        self, txn: Transaction, room_id: str, members_changed: Sequence[str] = ()
    ) -> list[int]: ...


class StreamWriter(Protocol[RowT_contra]):
    """Writes one stream's facts (``host.stream(name, RowType)``), typed by the stream's row type.

    Every method takes the caller's open transaction: the facts are written, and their IDs reserved,
    in it. They are complete when it commits (or rolls back), and only then do they count towards
    this writer's position. Stream IDs are positive for a normal stream and negative for a backwards
    one; the returned IDs follow the given rows' order. Only a configured writer of the stream may
    write (``is_writer``); others get :class:`~factstream.IdGeneratorError` naming the writers.
    """

    @property
    def name(self) -> str:
        """The stream's name."""
        ...

    @property
    def is_writer(self) -> bool:
        """Whether this instance may write the stream."""
        ...

    @property
    def writers(self) -> tuple[str, ...]:
        """The configured writers (empty for a stream every instance writes)."""
        ...

    def current_token(self) -> int:
        """The stream's watermark in this process: every fact at or before it is complete."""
        ...

    def positions(self) -> dict[str, int]:
        """Each writer's position as this process has seen it: every fact *of that writer* at or
        before it is complete. A writer missing here is at :meth:`current_token` (the minimum).

        What a reader of a stream with several writers needs to read past a slow writer: a fact of
        writer ``w`` at ``pos`` is readable here once ``pos <= positions().get(w, current_token())``,
        however far behind the other writers are (the per-writer positions of a room token).
        """
        ...

    async def append(
        self, txn: Transaction, row: RowT_contra, *, table: str = "", columns: Mapping[str, object] | None = None
    ) -> int:
        """Insert ``row`` into a backing table (default: the stream's first) and return its stream ID.

        The table gets the row's fields as columns of the same names, plus ``columns`` (values for
        the table's other columns); the ID and instance columns are filled in by the writer.
        """
        ...

    async def append_many(
        self,
        txn: Transaction,
        rows: Sequence[RowT_contra],
        *,
        table: str = "",
        columns: Sequence[Mapping[str, object]] | None = None,
    ) -> list[int]:
        """:meth:`append` for many rows in one statement: one stream ID each, in order.

        ``columns``, when given, holds one mapping per row with the same keys in each.
        """
        ...

    async def reserve(self, txn: Transaction, rows: Sequence[RowT_contra]) -> list[int]:
        """Stream IDs for ``rows`` the plugin stores itself (one each, in order), inside ``txn``.

        For streams whose facts are not one table row each: the plugin writes its tables with the
        returned IDs. The rows given here are what this process's pipeline sees when ``txn`` commits,
        so they should be what the stream's update function returns for those IDs.
        """
        ...

    async def reserve_groups(self, txn: Transaction, groups: Sequence[Sequence[RowT_contra]]) -> list[int]:
        """:meth:`reserve` with one stream ID per *group* of rows (in order), for several rows per ID.

        For a stream whose facts carry more than one row at one ID (the events stream's ``ev`` row
        and the ``state`` rows it caused): this process's pipeline, and so its rows handlers,
        sees each group's rows together at the group's ID. Every group needs at least one row.
        """
        ...


class KeptStreamWriter(Protocol[RowT_contra]):
    """Writes a kept stream's facts (``host.kept_stream(name, RowType, keeper)``): no table, no transaction.

    The plugin keeps its facts itself (in memory, say) and tells the host of each change with
    :meth:`write`, which moves this writer's position one on: the rows go to this process's rows
    handlers and long polls, and to every other process over replication. The keeper it gave reads
    them back for the streamer and for readers catching up (see docs/writing-plugins.md, "Streams
    without a table").
    """

    @property
    def name(self) -> str:
        """The stream's name."""
        ...

    @property
    def is_writer(self) -> bool:
        """Whether this instance writes the stream (only then may it :meth:`write`)."""
        ...

    @property
    def epoch(self) -> int:
        """Where this writer's run started: every position it hands out is above it, and every position
        of an earlier run is at or below it (0 on an instance that does not write the stream)."""
        ...

    def current_token(self) -> int:
        """This writer's position: the position of its last :meth:`write` (the epoch before any)."""
        ...

    def write(self, rows: Sequence[RowT_contra]) -> int:
        """Record one change, made of ``rows`` (at least one), at the next position; returns it.

        Call it after the plugin's own state holds the change, so that the keeper, asked from then
        on, answers it. Raises :class:`~factstream.IdGeneratorError` on an instance that does not
        write the stream.
        """
        ...


class HostApi(Protocol):
    """A running host, as every hook, route handler and ``SyncRequest`` sees it (module docstring)."""

    @property
    def instance_name(self) -> str:
        """This process's instance name."""
        ...

    @property
    def main_instance(self) -> str:
        """The instance that runs the TCP replication server and owns unconfigured streams."""
        ...

    @property
    def settings(self) -> HostSettings:
        """The part of the core configuration plugins may read (:class:`~factstream.HostSettings`)."""
        ...

    @property
    def caches(self) -> Caches:
        """This process's named caches."""
        ...

    def database(self) -> Database:
        """The database (a pool of connections shared by the core and every plugin)."""
        ...

    def writes(self, stream: str) -> bool:
        """Whether this instance is a writer of ``stream`` (raises ``KeyError`` for an unknown one)."""
        ...

    def stream(self, name: str, row_type: type[RowT]) -> StreamWriter[RowT]:
        """The writer of stream ``name``, whose row type must be ``row_type`` (checked)."""
        ...

    def kept_stream(
        self, name: str, row_type: type[RowT], keeper: Keeper[RowT] | None = None
    ) -> KeptStreamWriter[RowT]:
        """The writer of kept stream ``name`` (``StreamSpec(kept=True)``), whose row type must be ``row_type``.

        ``keeper`` (on the writer; ignored elsewhere) is ``(from, upto, limit) -> (updates, upto,
        limited)``, sync or async: the facts the plugin holds with positions in ``(from, upto]``, as
        ``(position, row)`` pairs in position order, at most about ``limit`` of them (never splitting
        one position's rows), ``upto`` the last position covered and ``limited`` whether more remain.
        Asked from below :attr:`KeptStreamWriter.epoch` it answers everything it holds. The first
        call with a keeper sets it; the plugin usually makes it in ``startup``.
        """
        ...

    def syncing_users(self) -> Mapping[str, int]:
        """The users with a ``/sync`` request in progress on this instance (waiting or answering), and how
        many each: what a presence plugin reports as "syncing here". A read-only view, live."""
        ...

    def send_command(self, command: wire.Command) -> None:
        """Send a replication command some plugin handles (``register_command_handlers``): handled here
        if this instance writes the handler's stream, sent to the instances that do. Raises
        :class:`~factstream.FactstreamError` for a command no plugin handles or one that speaks for another
        instance (see ``factstream.plugin.commands``)."""
        ...

    async def wait_for_stream_position(self, instance: str, stream: str, position: int, timeout: float = 5.0) -> bool:
        """Wait until this process has seen ``stream`` from ``instance`` up to ``position``.

        True when reached (at once for this process's own writes), False after ``timeout`` seconds.
        """
        ...

    async def instance_ids(self, names: Iterable[str]) -> dict[str, int]:
        """The token ID of each instance name (one is recorded for a name that has none yet)."""
        ...

    async def instance_names(self, ids: Iterable[int]) -> dict[int, str]:
        """The instance name behind each token ID; an ID no instance has is left out."""
        ...

    def state(self, factory: Callable[[HostApi], T]) -> T:
        """The object ``factory(host)`` made on the first call for this host; the same one after."""
        ...

    def spawn(self, coroutine: Coroutine[Any, Any, None], *, name: str) -> asyncio.Task[None]:
        """Run ``coroutine`` as a task the host owns: cancelled (and awaited) when the host stops.

        An exception other than cancellation is logged with the task's name.
        """
        ...

    def plugin_settings(self, model: type[ModelT]) -> ModelT:
        """The validated settings a plugin registered ``model`` for (``register_settings``)."""
        ...

    async def call_hook(self, spec: Callable[P, R], /, *args: P.args, **kwargs: P.kwargs) -> list[R]:
        """Call every implementation of ``spec``, a hook a plugin defined; their results other than None.

        ``spec`` is the ``@factstream.hookspec`` function itself (imported from the plugin that
        defines it), so mypy checks the arguments and the result against its signature. Pass the
        arguments by name; each implementation gets those it names. Implementations run one at a
        time in hook order (``tryfirst`` first, ``trylast`` last, the others the plugin loaded last
        first); an awaitable result is awaited before the next one runs. An implementation that
        raises stops the call with :class:`~factstream.PluginError` naming the plugin and the hook.
        A hook no loaded plugin defines (or a core hook) raises ``KeyError``.
        """
        ...

    async def call_first(self, spec: Callable[P, R], /, *args: P.args, **kwargs: P.kwargs) -> R | None:
        """:meth:`call_hook` up to the first implementation whose (awaited) result is not None: that result.

        None if every implementation returned None, or none exists. For ``firstresult=True`` hooks,
        where a ``trylast`` implementation is the default answer; the spec's return type (``T | None``)
        is the result's.
        """
        ...
