"""The running host's implementation of :class:`~factstream.HostApi`, what every plugin is handed.

It is a thin facade over the host's parts (``factstream.host.parts``) that exposes only the plugin API:
plugins never see the replication handler, the ID generators or the sync service. Its stream writers
hand every committed row to the reader pipeline's local side (``factstream.host.pipeline.LocalRows``).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Coroutine, Iterable, Mapping, Sequence
from types import MappingProxyType
from typing import Any, ParamSpec, TypeVar

import msgspec
from pydantic import BaseModel, ValidationError

from factstream.caches.registry import CacheRegistry
from factstream.config import ENV_PREFIX, HostSettings, Settings
from factstream.db.database import Database, Transaction
from factstream.errors import ConfigError, FactstreamError
from factstream.host.pipeline import LocalRows
from factstream.idgen.generator import IdGeneratorError, MultiWriterIdGenerator
from factstream.idgen.kept import KeptPositions
from factstream.plugin.api import HostApi, Keeper, KeptStreamWriter, StreamWriter
from factstream.plugin.manager import PluginHost
from factstream.plugin.registry import Registry
from factstream.replication import wire
from factstream.replication.commands import CommandRouter
from factstream.replication.handler import ReplicationHandler
from factstream.replication.stream import ReplicatedStream
from factstream.sync.instance_ids import DatabaseInstanceIds

log = logging.getLogger(__name__)

RowT = TypeVar("RowT", bound=msgspec.Struct)
T = TypeVar("T")
P = ParamSpec("P")
R = TypeVar("R")
ModelT = TypeVar("ModelT", bound=BaseModel)


def load_plugin_settings(
    settings: Settings, registry: Registry, loaded: Iterable[str]
) -> dict[type[BaseModel], BaseModel]:
    """Validate every plugin's ``plugins.<name>`` section against the model it registered.

    Raises :class:`ConfigError` naming the plugin and the key for a bad value, a section for a loaded
    plugin that takes no settings, or a section that is not a mapping. A section naming no loaded
    plugin is logged (the plugin may be blocked on this instance) and ignored.
    """
    sections = dict(settings.plugins)
    out: dict[type[BaseModel], BaseModel] = {}
    for reg in registry.settings:
        raw = sections.pop(reg.plugin, None) or {}
        try:
            out[reg.spec.model] = reg.spec.model.model_validate(raw)
        except ValidationError as exc:
            raise ConfigError(_describe(reg.plugin, exc)) from None
    names = set(loaded)
    takes_none = sorted(name for name in sections if name in names)
    if takes_none:
        raise ConfigError(
            "; ".join(f"plugins.{name}: plugin {name!r} takes no settings (it registers none)" for name in takes_none)
        )
    for name in sorted(sections):
        log.warning("configuration section plugins.%s names no loaded plugin; ignored", name)
    return out


def _describe(plugin: str, exc: ValidationError) -> str:
    problems = []
    for err in exc.errors():
        loc = [str(p) for p in err["loc"]]
        key = ".".join(["plugins", plugin, *loc])
        env = ENV_PREFIX + "__".join(["PLUGINS", plugin, *loc]).upper()
        msg = "unknown key" if err["type"] == "extra_forbidden" else err["msg"].removeprefix("Value error, ")
        value = err.get("input")
        shown = "" if err["type"] in {"extra_forbidden", "missing"} or isinstance(value, dict) else f" (got {value!r})"
        problems.append(f"{key} (env {env}): {msg}{shown}")
    return f"invalid settings of plugin {plugin!r}: " + "; ".join(problems)


class KeptWriter(KeptStreamWriter[RowT]):
    """A kept stream's writer in this process (see :class:`~factstream.KeptStreamWriter`)."""

    def __init__(self, stream: ReplicatedStream, sink: LocalRows) -> None:
        assert isinstance(stream.id_gen, KeptPositions) and stream.kept is not None
        self._stream = stream
        self._gen = stream.id_gen
        self._sink = sink
        self._row_type = stream.spec.row_type

    @property
    def name(self) -> str:
        return self._stream.name

    @property
    def is_writer(self) -> bool:
        return self._gen.is_writer

    @property
    def epoch(self) -> int:
        return self._gen.epoch

    def current_token(self) -> int:
        return self._gen.get_current_token_for_writer(self._gen.instance_name)

    def write(self, rows: Sequence[RowT]) -> int:
        if not rows:
            raise IdGeneratorError(f"stream {self.name!r}: a change needs at least one row")
        for row in rows:
            if type(row) is not self._row_type:
                raise TypeError(f"stream {self.name!r} takes {self._row_type.__name__} rows, not {row!r}")
        position = self.current_token() + 1
        if self._gen.is_writer:
            # Pending before the position moves (as a table writer's rows are before their commit
            # completes): the pipeline delivers them once the position passes them.
            self._sink.completed(self.name, [position] * len(rows), list(rows), True)
        return self._gen.next()


class TableStreamWriter(StreamWriter[RowT]):
    """A stream's writer in this process (see :class:`~factstream.StreamWriter`)."""

    def __init__(self, stream: ReplicatedStream, sink: LocalRows) -> None:
        if not isinstance(stream.id_gen, MultiWriterIdGenerator):
            raise FactstreamError(
                f"stream {stream.name!r} is kept by its writer (kept=True): write it with host.kept_stream"
            )
        self._stream = stream
        self._gen = stream.id_gen
        self._sink = sink
        self._fields = stream.fields
        self._first_table = stream.spec.tables[0].table

    @property
    def name(self) -> str:
        return self._stream.name

    @property
    def is_writer(self) -> bool:
        return self._gen.is_writer

    @property
    def writers(self) -> tuple[str, ...]:
        return tuple(self._gen.writers)

    def current_token(self) -> int:
        return self._gen.get_current_token()

    def positions(self) -> dict[str, int]:
        return self._gen.get_positions()

    async def append(
        self, txn: Transaction, row: RowT, *, table: str = "", columns: Mapping[str, object] | None = None
    ) -> int:
        values = self._values(row, columns)
        ids = self._on_complete(txn, [row])
        ids += await self._gen.append_many_txn(txn, table or self._first_table, [values])
        return ids[0]

    async def append_many(
        self,
        txn: Transaction,
        rows: Sequence[RowT],
        *,
        table: str = "",
        columns: Sequence[Mapping[str, object]] | None = None,
    ) -> list[int]:
        if not rows:
            return []
        if columns is not None and len(columns) != len(rows):
            raise IdGeneratorError(f"stream {self.name!r}: {len(rows)} rows but {len(columns)} column mappings")
        values = [self._values(row, None if columns is None else columns[i]) for i, row in enumerate(rows)]
        ids = self._on_complete(txn, list(rows))
        ids += await self._gen.append_many_txn(txn, table or self._first_table, values)
        return list(ids)

    async def reserve(self, txn: Transaction, rows: Sequence[RowT]) -> list[int]:
        if not rows:
            return []
        ids = self._on_complete(txn, list(rows))
        ids += await self._gen.get_next_mult_txn(txn, len(rows))
        return list(ids)

    async def reserve_groups(self, txn: Transaction, groups: Sequence[Sequence[RowT]]) -> list[int]:
        if not groups:
            return []
        if not all(groups):
            raise IdGeneratorError(f"stream {self.name!r}: every group of rows needs at least one row")
        sizes = [len(g) for g in groups]
        ids = self._on_complete(txn, [r for g in groups for r in g], sizes)
        ids += await self._gen.get_next_mult_txn(txn, len(groups))
        return list(ids)

    def _values(self, row: RowT, columns: Mapping[str, object] | None) -> dict[str, object]:
        if type(row) is not self._stream.spec.row_type:
            raise TypeError(f"stream {self.name!r} takes {self._stream.spec.row_type.__name__} rows, not {row!r}")
        values: dict[str, object] = {f: getattr(row, f) for f in self._fields}
        if columns:
            clash = sorted(set(columns) & set(values))
            if clash:
                raise IdGeneratorError(f"stream {self.name!r}: columns {clash} are fields of the row; set them there")
            values.update(columns)
        return values

    def _on_complete(self, txn: Transaction, rows: list[Any], sizes: list[int] | None = None) -> list[int]:
        """Hand ``rows`` to the pipeline when ``txn`` ends; returns the list their IDs go into.

        Registered *before* the IDs are reserved, so it runs before the ID generator's own completion
        (which moves the position and notifies): the rows are pending by the time the position passes
        them, and none can be delivered ahead of an earlier one.
        """
        ids: list[int] = []
        factor = self._stream.factor
        sink, name = self._sink, self.name

        def completed(committed: bool) -> None:
            if ids:
                if sizes is None:
                    tokens = [i * factor for i in ids]
                else:  # one ID per group: every row of a group at its ID
                    tokens = [i * factor for i, n in zip(ids, sizes, strict=True) for _ in range(n)]
                sink.completed(name, tokens, rows, committed)

        txn.on_complete(completed)
        return ids


class HostFacade(HostApi):
    """The running host as plugins see it (module docstring)."""

    def __init__(
        self,
        settings: Settings,
        plugins: PluginHost,
        db: Database,
        streams: Mapping[str, ReplicatedStream],
        caches: CacheRegistry,
        local_rows: LocalRows,
        handler: ReplicationHandler,
        plugin_settings: Mapping[type[BaseModel], BaseModel],
        commands: CommandRouter,
        syncing: dict[str, int],
    ) -> None:
        self._config = settings
        self._plugins = plugins
        self._db = db
        self._streams = streams
        self._caches = caches
        #: Where the stream writers hand their committed rows (the reader pipeline's local side).
        self._local_rows = local_rows
        self._handler = handler
        self._commands = commands
        self._syncing = syncing
        self._plugin_settings = dict(plugin_settings)
        self._settings = HostSettings(settings)
        self._state: dict[object, object] = {}
        self._writers: dict[str, TableStreamWriter[Any]] = {}
        self._kept: dict[str, KeptWriter[Any]] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        #: Instance name <-> token ID (``instance_map``), cached: an ID never changes.
        self._instance_ids = DatabaseInstanceIds(db)

    @property
    def instance_name(self) -> str:
        return self._config.instance_name

    @property
    def main_instance(self) -> str:
        return self._config.main_instance

    @property
    def settings(self) -> HostSettings:
        return self._settings

    @property
    def caches(self) -> CacheRegistry:
        return self._caches

    def database(self) -> Database:
        return self._db

    def _replicated(self, stream: str) -> ReplicatedStream:
        streams = self._streams
        try:
            return streams[stream]
        except KeyError:
            raise KeyError(f"unknown stream {stream!r} (streams: {', '.join(streams) or 'none'})") from None

    def writes(self, stream: str) -> bool:
        return self._replicated(stream).id_gen.is_writer

    def stream(self, name: str, row_type: type[RowT]) -> StreamWriter[RowT]:
        writer = self._writers.get(name)
        if writer is None:
            writer = self._writers[name] = TableStreamWriter(self._replicated(name), self._local_rows)
        actual = writer._stream.spec.row_type
        if actual is not row_type:
            raise FactstreamError(f"stream {name!r} has row type {actual.__name__}, not {row_type.__name__}")
        return writer

    def syncing_users(self) -> Mapping[str, int]:
        return MappingProxyType(self._syncing)

    def send_command(self, command: wire.Command) -> None:
        self._commands.send(command)

    def kept_stream(
        self, name: str, row_type: type[RowT], keeper: Keeper[RowT] | None = None
    ) -> KeptStreamWriter[RowT]:
        stream = self._replicated(name)
        if stream.kept is None:
            raise FactstreamError(f"stream {name!r} has tables: write it with host.stream, not host.kept_stream")
        if stream.spec.row_type is not row_type:
            raise FactstreamError(
                f"stream {name!r} has row type {stream.spec.row_type.__name__}, not {row_type.__name__}"
            )
        writer = self._kept.get(name)
        if writer is None:
            writer = self._kept[name] = KeptWriter(stream, self._local_rows)
        if keeper is not None and stream.kept.keeper is None:
            stream.kept.keeper = keeper
        return writer

    async def wait_for_stream_position(self, instance: str, stream: str, position: int, timeout: float = 5.0) -> bool:
        return await self._handler.wait_for_stream_position(instance, stream, position, timeout)

    async def instance_ids(self, names: Iterable[str]) -> dict[str, int]:
        wanted = list(dict.fromkeys(names))
        lookup = await self._instance_ids.id_lookup(wanted)
        return {name: lookup(name) for name in wanted}

    async def instance_names(self, ids: Iterable[int]) -> dict[int, str]:
        wanted = list(dict.fromkeys(ids))
        lookup = await self._instance_ids.name_lookup(wanted)
        out: dict[int, str] = {}
        for instance_id in wanted:
            with contextlib.suppress(LookupError):
                out[instance_id] = lookup(instance_id)
        return out

    def state(self, factory: Callable[[HostApi], T]) -> T:
        try:
            return self._state[factory]  # type: ignore[return-value]
        except KeyError:
            value = self._state[factory] = factory(self)
            return value

    def spawn(self, coroutine: Coroutine[Any, Any, None], *, name: str) -> asyncio.Task[None]:
        task = asyncio.get_running_loop().create_task(coroutine, name=name)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)
        return task

    def _task_done(self, task: asyncio.Task[None]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("background task %s failed", task.get_name(), exc_info=task.exception())

    def plugin_settings(self, model: type[ModelT]) -> ModelT:
        try:
            return self._plugin_settings[model]  # type: ignore[return-value]
        except KeyError:
            raise FactstreamError(f"no plugin registered settings model {model.__name__} (register_settings)") from None

    async def call_hook(self, spec: Callable[P, R], /, *args: P.args, **kwargs: P.kwargs) -> list[R]:
        return await self._plugins.call_hook(spec, *args, **kwargs)

    async def call_first(self, spec: Callable[P, R], /, *args: P.args, **kwargs: P.kwargs) -> R | None:
        return await self._plugins.call_first(spec, *args, **kwargs)

    async def cancel_tasks(self) -> None:
        """Cancel and await every spawned task (the host calls this before the ``shutdown`` hooks)."""
        tasks = list(self._tasks)
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        self._tasks.clear()
