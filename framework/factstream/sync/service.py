"""``/sync``: one long poll over every stream a client follows, with one opaque token.

:class:`SyncService` is built by the host when it starts. It holds what a ``/sync`` request needs:

* the token layout (``SyncKeyLayout.load`` over the registered streams that have a ``sync_key``), the
  instance IDs of the token's string form, and the current token (from the streams' ID generators);
* the :class:`~factstream.sync.Notifier` where requests wait, and the
  :class:`~factstream.sync.wakeups.WakeRouter` that wakes them (fed by the host's reader pipeline).

A request (:meth:`SyncService.sync`) goes: parse ``since`` (a malformed token, or one holding a
value that is no sync position, is a :class:`~factstream.sync.TokenError` naming ``since`` and the
field, which the HTTP layer answers with 400); clamp fields from the
future (``bound_future_token``); wait, bounded, until this instance has caught up with the token
(another instance may have minted it): on timeout answer with nothing and ``since`` as
``next_batch``; then ``Notifier.wait_for_events`` with a callback that asks each stream for the
user's items in the range ``(prev, current]``, per writer.

Per stream, the items come from ``StreamSpec.sync_rows`` or, by default, from the stream's rows whose
``user_field`` is the user (a stream with neither shows nobody anything). ``next_batch`` never claims
a range nobody looked at: it is ``since`` advanced to the last range a callback covered, and a stream
that returned ``limit`` items stops at the last item it returned (the response then says
``"limited": true`` and the client syncs again at once).

Before waiting, every stream with its own ``sync_rows`` is also asked once for the empty range at
``since`` (:meth:`SyncService.acknowledge`), whether or not anything is new for it: that is how a
stream hears of a token that acknowledges what it sent (to_device deletes delivered messages there).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from factstream.errors import ConfigError
from factstream.plugin.streams import StreamSpec, SyncRequest
from factstream.replication.stream import ReplicatedStream
from factstream.sync import (
    DatabaseInstanceIds,
    MultiWriterStreamToken,
    Notifier,
    RoomStreamToken,
    StreamToken,
    SyncKey,
    SyncKeyKind,
    SyncKeyLayout,
    TokenError,
    TokenValue,
    bound_future_token,
    current_token_source,
    sync_keys_for_streams,
)
from factstream.sync.readers import SyncItems, default_reader
from factstream.sync.sections import SectionParts
from factstream.sync.wakeups import SyncedStream, WakeRouter, wake_function

if TYPE_CHECKING:
    from factstream.config import Settings
    from factstream.db.database import Database
    from factstream.plugin.api import HostApi
    from factstream.plugin.manager import PluginHost

log = logging.getLogger(__name__)


def check_sync_keys(specs: Sequence[StreamSpec[Any]], replicated: Mapping[str, object], instance: str) -> None:
    """Every sync key must follow a stream this instance replicates (``ConfigError`` otherwise).

    A token field whose stream this process does not follow would stay at 0 here while other
    processes move it, so a client switching instances would wait for ever (or be served rows twice).
    """
    problems = []
    for spec in specs:
        if spec.sync_key is None:
            continue
        if spec.name not in replicated:
            problems.append(
                f"sync key {spec.sync_key!r} follows stream {spec.name!r}, which is not replicated to instance "
                f"{instance!r}"
            )
        elif not spec.positive:
            problems.append(
                f"sync key {spec.sync_key!r} follows stream {spec.name!r}, which is written backwards "
                "(positive=False); backwards streams cannot be synced"
            )
    if problems:
        raise ConfigError("; ".join(problems))


@dataclass
class SyncBatch:
    """What one callback found: items per stream name, the range's end, and limited fields."""

    streams: dict[str, list[Any]]
    upto: StreamToken
    limited: dict[str, TokenValue]
    #: The top-level sections streams filled (``StreamSpec.sync_section``): section -> its body.
    sections: dict[str, Mapping[str, Any]] = field(default_factory=dict)

    def __bool__(self) -> bool:
        return bool(self.streams) or bool(self.sections)


class SyncService:
    """Serves ``/sync`` for one host (see the module docstring)."""

    def __init__(
        self,
        settings: Settings,
        layout: SyncKeyLayout,
        ids: DatabaseInstanceIds,
        synced: Sequence[SyncedStream],
    ) -> None:
        self.settings = settings
        config = settings.http
        self.layout = layout
        self.ids = ids
        self.config = config
        self.synced = list(synced)
        self.current = current_token_source(layout, {s.key: s.stream.id_gen for s in self.synced})
        self.notifier = Notifier(self.current, instance=settings.instance_name)
        self.router = WakeRouter(self.notifier, self.synced)
        self.max_allocated = {s.key: s.stream.id_gen.get_max_allocated_token for s in self.synced}
        self._default_readers = {s.name: default_reader(s, settings.writers_for(s.name)) for s in self.synced}
        self._warned: set[str] = set()
        #: The users with a ``/sync`` in progress here, and how many each (``HostApi.syncing_users``).
        self.syncing: dict[str, int] = {}

    @classmethod
    async def create(
        cls, settings: Settings, plugins: PluginHost, db: Database, streams: Mapping[str, ReplicatedStream]
    ) -> SyncService:
        """Check the sync keys, load (and record) the token layout, and build the service."""
        specs = [reg.spec for reg in plugins.registry.streams]
        check_sync_keys(specs, streams, settings.instance_name)
        keyed = [spec for spec in specs if spec.sync_key is not None]
        layout = await SyncKeyLayout.load(db, sync_keys_for_streams(keyed, settings.writers_for))
        synced = []
        for spec in keyed:
            assert spec.sync_key is not None
            synced.append(SyncedStream(spec, streams[spec.name], spec.sync_key, wake_function(spec)))
        synced.sort(key=lambda s: layout.index(s.key))
        return cls(settings, layout, DatabaseInstanceIds(db), synced)

    # -- requests ----------------------------------------------------------------------------------

    async def parse_token(self, text: str | None) -> StreamToken:
        """The client's ``since``, or the start token; raises only ``TokenError`` for bad input, its
        message naming the parameter and the field (``since: field 2 (room_key): ...``).

        Every field must be a position a stream can be at (see :mod:`factstream.sync.stream_token`):
        a value that is not (a topological room token, a negative or out-of-range position) is
        refused here, before anything compares, waits for or advances it.
        """
        if not text:
            return StreamToken.start(self.layout)
        try:
            return await StreamToken.parse(text, self.layout, self.ids)
        except TokenError as exc:
            raise TokenError(f"since: {exc}") from None

    async def sync(
        self,
        user: str,
        since_text: str | None,
        timeout: float,
        device: str | None = None,
        *,
        api: HostApi,
        filter: Mapping[str, Any] | None = None,
    ) -> dict[str, Any]:
        """:meth:`answer`, counted in :attr:`syncing` while it runs."""
        syncing = self.syncing
        syncing[user] = syncing.get(user, 0) + 1
        try:
            return await self.answer(user, since_text, timeout, device, api=api, filter=filter)
        finally:
            left = syncing[user] - 1
            if left:
                syncing[user] = left
            else:
                del syncing[user]

    async def answer(
        self,
        user: str,
        since_text: str | None,
        timeout: float,
        device: str | None = None,
        *,
        api: HostApi,
        filter: Mapping[str, Any] | None = None,
    ) -> dict[str, Any]:
        """One ``/sync`` for ``user``: the response body (``TokenError`` for a malformed ``since``).

        ``api`` is the plugin API that every stream's ``sync_rows`` gets (``SyncRequest.host``).

        ``timeout`` (seconds) is how long to wait for something new; it is capped at
        ``http.sync_timeout_max_seconds``. ``filter`` is handed to every stream
        (``SyncRequest.filter``). Without ``since``, the first range a stream reads is ``initial``
        (``SyncRequest.initial``): snapshot streams answer with their snapshot there.
        """
        filter = dict(filter or {})
        initial = not since_text
        loop = asyncio.get_running_loop()
        timeout = min(max(timeout, 0.0), self.config.sync_timeout_max_seconds)
        since = await self.parse_token(since_text)
        since = await bound_future_token(since, self.current(), self.max_allocated)
        started = loop.time()
        caught_up = await self.notifier.wait_for_stream_token(since, timeout=self.config.catch_up_timeout_seconds)
        if not caught_up:
            # This instance has not seen what the client has; answering from here could skip facts
            # and waiting longer could hang: say nothing, the client retries (maybe elsewhere).
            log.debug("sync for %s: this instance did not reach the client's token in time", user)
            self.notifier.count_answer("timed_out")
            return {"next_batch": await since.to_string(self.ids), "streams": {}}
        waited_for = loop.time() - started
        if waited_for > 1.0:
            timeout = max(0.0, timeout - waited_for)
        due = await self.acknowledge(api, user, device, since, filter)
        if due:
            # Items a stream owes at the client's own token: answered at once, claiming no range.
            owed: dict[str, Any] = {"next_batch": await since.to_string(self.ids), "streams": due}
            if any(len(items) >= self.config.sync_limit for items in due.values()):
                owed["limited"] = True
            self.notifier.count_answer("immediate")
            return owed

        async def collect(prev: StreamToken, current: StreamToken) -> SyncBatch:
            first = initial and prev is since
            return await self.collect(api, user, device, since, prev, current, filter=filter, initial=first)

        waited = await self.notifier.wait_for_events(user, since, timeout, collect)
        batch = waited.result
        body: dict[str, Any]
        if batch:
            upto = batch.upto
            for key, value in batch.limited.items():
                upto = upto.replace(key, value)
            body = {"next_batch": await advance(since, upto).to_string(self.ids), "streams": batch.streams}
            body.update(batch.sections)
            if batch.limited:
                body["limited"] = True
        else:
            body = {"next_batch": await advance(since, waited.next_token).to_string(self.ids), "streams": {}}
        return body

    async def acknowledge(
        self,
        api: HostApi,
        user: str,
        device: str | None,
        since: StreamToken,
        filter: Mapping[str, Any] | None = None,
    ) -> dict[str, list[Any]]:
        """Tell every stream with its own ``sync_rows`` where the client is: the empty range at ``since``.

        Called once per request, before waiting, whether or not anything is new: the notifier runs
        the ``collect`` callback only when the user's stream moved, and ``collect`` skips a stream
        whose range is empty, so without this call a stream would never hear of a token that
        acknowledges what it already sent (to_device deletes delivered messages here). Each such
        stream gets ``SyncRequest(since=upto=<the client's positions>)``. A stream that reads a range
        returns nothing at no cost; one that keeps per-client state may return items that are due at
        this token: the request then answers with them at once and ``since`` as ``next_batch``, so
        the client's next request, at the same token, settles them. The default readers have no
        state and are not called.
        """
        due: dict[str, list[Any]] = {}
        for synced in self.synced:
            reader = synced.spec.sync_rows
            if reader is None:
                continue
            value = since.get(synced.key)
            at = {w: _position(value, w) for w in self._writers(synced, value)}
            request = self._request(api, synced, user, device, at, dict(at), filter=filter or {}, initial=False)
            items = await reader(request)
            if items and synced.spec.sync_section is None:
                due[synced.name] = list(items)
        return due

    def _request(
        self,
        api: HostApi,
        synced: SyncedStream,
        user: str,
        device: str | None,
        low: dict[str, int],
        upto: dict[str, int],
        *,
        filter: Mapping[str, Any],
        initial: bool,
    ) -> SyncRequest:
        notifier = self.notifier

        def watch_rooms(rooms: Iterable[str]) -> None:
            notifier.watch_rooms(user, rooms, synced.name)

        return SyncRequest(
            api,
            synced.name,
            user,
            device,
            low,
            upto,
            self.config.sync_limit,
            initial=initial,
            filter=filter,
            watch_rooms=watch_rooms,
        )

    async def collect(
        self,
        api: HostApi,
        user: str,
        device: str | None,
        since: StreamToken,
        prev: StreamToken,
        current: StreamToken,
        *,
        filter: Mapping[str, Any] | None = None,
        initial: bool = False,
    ) -> SyncBatch:
        """The user's items in ``(max(prev, since), current]``, per stream (the notifier's callback)."""
        streams: dict[str, list[Any]] = {}
        sections = SectionParts()
        limited: dict[str, TokenValue] = {}
        limit = self.config.sync_limit
        for synced in self.synced:
            key = synced.key
            high = current.get(key)
            writers = self._writers(synced, since.get(key), prev.get(key), high)
            upto = {w: _position(high, w) for w in writers}
            low = {w: min(max(_position(prev.get(key), w), _position(since.get(key), w)), upto[w]) for w in writers}
            if all(low[w] == upto[w] for w in writers):
                continue
            request = self._request(api, synced, user, device, low, upto, filter=filter or {}, initial=initial)
            reader = synced.spec.sync_rows or self._default_readers[synced.name]
            found = await reader(request)
            section = synced.spec.sync_section
            if section is not None:
                if not isinstance(found, Mapping):
                    raise TypeError(f"stream {synced.name}: sync_rows must return a mapping (its sync_section)")
                if found:
                    sections.add(section, synced.name, found)
                continue
            items = list(found)
            if not items:
                continue
            streams[synced.name] = items
            positions = self._limited_positions(synced, low, upto, items, limit)
            if positions is not None:
                limited[key] = _value_at(self.layout.key(key), positions)
        return SyncBatch(streams, current, limited, sections.sections)

    def _writers(self, synced: SyncedStream, *values: TokenValue) -> list[str]:
        names = set(synced.stream.id_gen.get_positions())
        if synced.spec.writers == "configured":
            names.update(self.settings.writers_for(synced.name))
        for value in values:
            if not isinstance(value, int):
                names.update(value.instance_map)
        return sorted(names)

    def _limited_positions(
        self, synced: SyncedStream, low: dict[str, int], upto: dict[str, int], items: list[Any], limit: int
    ) -> dict[str, int] | None:
        """Per writer, how far a stream's items cover the range; None when they cover all of it.

        The default readers say so themselves (:class:`SyncItems`). For a plugin's ``sync_rows``,
        a list of ``limit`` items or more is taken as cut short, and where it stops is read from the
        items' ``stream_id`` and ``instance`` (items in stream order, every row of a position
        included): a writer with items stops at its last one; a writer without items stays where
        it was (for a single-writer field, where everyone is, at the last item).
        """
        if isinstance(items, SyncItems):
            return items.reached
        if len(items) < limit:
            return None
        reached: dict[str, int] = {}
        for item in items:
            if isinstance(item, Mapping):
                pos, instance = item.get("stream_id"), item.get("instance")
                if isinstance(pos, int) and isinstance(instance, str) and instance in upto:
                    reached[instance] = max(pos, reached.get(instance, pos))
        if not reached:
            if synced.name not in self._warned:
                self._warned.add(synced.name)
                log.warning(
                    "stream %s returned %d sync items without 'stream_id' and 'instance': "
                    "cannot resume after them, so the whole range counts as seen",
                    synced.name,
                    len(items),
                )
            return None
        single = self.layout.key(synced.key).kind is SyncKeyKind.INT
        last = max(reached.values())
        return {w: max(low[w], min(upto[w], reached.get(w, last if single else low[w]))) for w in upto}

    # -- lifecycle ---------------------------------------------------------------------------------

    def start(self) -> None:
        """Nothing to start: the reader pipeline feeds the router (kept for the host's lifecycle)."""

    async def close(self) -> None:
        """Nothing to stop: open long polls are answered by ``notifier.close()``."""


def advance(token: StreamToken, other: StreamToken) -> StreamToken:
    """``token`` moved forward, field by field, to wherever ``other`` is further (never backwards)."""
    for key, value in other.items():
        if key.kind is not SyncKeyKind.RETIRED:
            token = token.copy_and_advance(key.name, value)
    return token


def _position(value: TokenValue, writer: str) -> int:
    return value if isinstance(value, int) else value.get_stream_pos_for_instance(writer)


def _value_at(key: SyncKey, positions: dict[str, int]) -> TokenValue:
    """A field's value with every writer at the given position."""
    minimum = min(positions.values())
    if key.kind is SyncKeyKind.INT:
        return minimum
    ahead = {w: p for w, p in positions.items() if p > minimum}
    if key.kind is SyncKeyKind.ROOM:
        return RoomStreamToken(stream=minimum, instance_map=ahead)
    return MultiWriterStreamToken(stream=minimum, instance_map=ahead)
