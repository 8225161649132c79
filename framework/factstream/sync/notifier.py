"""The notifier: long-polling /sync requests wait here until something they care about happens.

Model. Each user that has (recently had) a waiting request owns a *user stream*: the token as of
the last notification that concerned the user, and the set of futures of that user's waiting
requests. ``on_new_event(key, token, users=..., rooms=...)`` finds the user streams of the named
users and of every member of the named rooms (``set_user_rooms`` keeps that index), computes the
current token **once**, stores it in each of those streams and resolves their futures. So a
notification costs O(listeners of the touched users), however many requests wait in total.

Why the *current* token rather than the one passed in: the passed token says where one stream got
to; the waiter needs a token for the whole sync response, and every stream up to the current token
is visible in this process (readers advance positions before they notify).

``wait_for_events`` runs the caller's callback ``(prev, current) -> result`` every time the user's
stream moves; an empty (falsy) result means "nothing for this client in that range", so it waits
again from ``current``, until a non-empty result or the timeout. The token it returns is the last
``current`` a callback covered, which is what the response's ``next_batch`` must be: never past a
range nobody looked at.

Single event loop: call every method from the loop that runs the waits. User streams without
waiters are dropped after ``idle_expiry`` seconds (10 minutes by default) so that memory follows
active users, not every user ever seen; the room index is the caller's to maintain.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Generic, Literal, TypeVar

from prometheus_client import Counter, Gauge

from factstream import metrics
from factstream.sync.stream_token import StreamToken, TokenValue

log = logging.getLogger(__name__)

R = TypeVar("R")

#: A sync handler's work for one range: ``(prev, current) -> result``; falsy means nothing new.
WaitCallback = Callable[[StreamToken, StreamToken], Awaitable[R]]

#: Registered by :func:`register_metrics` when a host starts, not on import (see :mod:`factstream.metrics`).
OPEN_WAITS = Gauge("factstream_sync_open_waits", "Requests waiting in Notifier.wait_for_events", registry=None)
WAKEUPS = Counter("factstream_sync_wakeups", "Waiting requests woken by Notifier.on_new_event", registry=None)
LONG_POLLS = Counter(
    "factstream_sync_long_polls",
    "/sync requests answered, by outcome: immediate (something at once), woken (something after waiting), "
    "timed_out (nothing: the timeout ran out, or this instance was behind the client's token)",
    ["outcome", "instance"],
    registry=None,
)
#: The ``outcome`` labels of :data:`LONG_POLLS`.
Outcome = Literal["immediate", "woken", "timed_out"]
OUTCOMES: tuple[Outcome, ...] = ("immediate", "woken", "timed_out")

DEFAULT_IDLE_EXPIRY = 600.0


def register_metrics() -> None:
    """Register the notifier's gauge and counter in the default registry (once per process)."""
    metrics.register(OPEN_WAITS, WAKEUPS, LONG_POLLS)


@dataclass(frozen=True)
class WaitResult(Generic[R]):
    """What :meth:`Notifier.wait_for_events` found.

    ``result`` is the callback's last result (``None`` if the callback never ran because nothing
    happened for the user); ``next_token`` is the token to hand back as ``next_batch``.
    """

    result: R | None
    next_token: StreamToken
    #: Whether the wait listened for a notification (an answer found at once did not).
    waited: bool = False

    @property
    def timed_out(self) -> bool:
        """True when the wait ended with nothing for the client."""
        return not self.result

    @property
    def outcome(self) -> Outcome:
        """How the long poll ended, as :data:`LONG_POLLS` counts it."""
        return "timed_out" if self.timed_out else "woken" if self.waited else "immediate"


class _UserStream:
    __slots__ = ("current_token", "listeners", "user", "waits")

    def __init__(self, user: str, token: StreamToken) -> None:
        self.user = user
        self.current_token = token
        self.listeners: set[asyncio.Future[StreamToken]] = set()
        # Requests inside wait_for_events (waiting or running their callback): a stream is idle,
        # and may expire, only when this is 0.
        self.waits = 0


class Notifier:
    """Wakes waiting /sync requests (see the module docstring).

    ``current_token`` returns this process's current token (``current_token_source`` builds one);
    ``clock`` returns seconds and is used for expiry only (waits use the event loop's clock).
    """

    def __init__(
        self,
        current_token: Callable[[], StreamToken],
        *,
        idle_expiry: float = DEFAULT_IDLE_EXPIRY,
        clock: Callable[[], float] = time.monotonic,
        instance: str = "",
    ) -> None:
        self.current_token = current_token
        # Labelled once: every outcome shows on /metrics at 0, and counting is one increment.
        self._outcomes = {outcome: LONG_POLLS.labels(outcome=outcome, instance=instance) for outcome in OUTCOMES}
        self.idle_expiry = idle_expiry
        self.clock = clock
        self._streams: dict[str, _UserStream] = {}
        # Streams without listeners, oldest first, with the time they became idle: expiry pops
        # from the front, so it costs O(expired), never a scan of every user.
        self._idle: OrderedDict[str, float] = OrderedDict()
        self._room_users: dict[str, set[str]] = {}
        self._user_rooms: dict[str, frozenset[str]] = {}
        #: Per user, the rooms each stream watches (:meth:`watch_rooms`); the user is indexed under their union.
        self._watched: dict[str, dict[str, frozenset[str]]] = {}
        self._any_event: asyncio.Future[None] | None = None
        self._open_waits = 0
        self._closed = False

    # -- room membership ---------------------------------------------------------------------------

    def set_user_rooms(self, user: str, rooms: Iterable[str]) -> None:
        """Record the rooms ``user`` is in, so that ``on_new_event(rooms=...)`` reaches them."""
        new = frozenset(rooms)
        old = self._user_rooms.get(user, frozenset())
        for room in old - new:
            members = self._room_users.get(room)
            if members is not None:
                members.discard(user)
                if not members:
                    del self._room_users[room]
        for room in new - old:
            self._room_users.setdefault(room, set()).add(user)
        if new:
            self._user_rooms[user] = new
        else:
            self._user_rooms.pop(user, None)

    def watch_rooms(self, user: str, rooms: Iterable[str], key: str = "") -> None:
        """:meth:`set_user_rooms`, for a request that just read the user's rooms: when a room is new to
        the index, the user's stream moves to the current token and the user's waiting requests are
        woken, so that every wait of the user reads once more. An event of that room notified before
        the room was indexed reached nobody; this read covers it (the wait's range never goes below
        the client's token, so nothing repeats). The request that called this reads again too: its
        stream moved while its callback ran.

        ``key`` names who watches (the stream): each stream's rooms are kept apart and the user is
        indexed under their union, so streams that watch different rooms (a plugin's own keys, the
        rooms one stream shows and another does not) do not undo each other's watch and wake each
        other for ever.
        """
        watched = self._watched.setdefault(user, {})
        watched[key] = frozenset(rooms)
        new = frozenset().union(*watched.values())
        added = not new <= self._user_rooms.get(user, frozenset())
        self.set_user_rooms(user, new)
        stream = self._streams.get(user)
        if added and stream is not None:
            self._move(stream, self.current_token())

    def forget_user(self, user: str) -> None:
        """Drop ``user``'s room memberships (its waiting requests, if any, keep waiting)."""
        self._watched.pop(user, None)
        self.set_user_rooms(user, ())

    def user_rooms(self, user: str) -> frozenset[str]:
        """The rooms recorded for ``user``."""
        return self._user_rooms.get(user, frozenset())

    # -- notifying ---------------------------------------------------------------------------------

    def on_new_event(
        self,
        stream_key: str,
        token: TokenValue | None = None,
        *,
        users: Iterable[str] = (),
        rooms: Iterable[str] = (),
    ) -> int:
        """Something new in stream ``stream_key`` concerns ``users`` and the members of ``rooms``.

        Call it after the new facts are visible in this process (positions advanced). ``token`` is
        for logging only. Returns the number of waiting requests woken.
        """
        targets: list[_UserStream] = []
        seen: set[str] = set()
        for user in users:
            self._collect(user, seen, targets)
        for room in rooms:
            for user in self._room_users.get(room, ()):
                self._collect(user, seen, targets)
        self._wake_token_waiters()
        if not targets:
            return 0
        current = self.current_token()
        woken = 0
        for stream in targets:
            woken += self._move(stream, current)
        if woken:
            WAKEUPS.inc(woken)
            log.debug("stream %s at %s woke %d request(s)", stream_key, token, woken)
        self.expire_idle()
        return woken

    def wake_everyone(self, stream_key: str, token: TokenValue | None = None) -> int:
        """Wake every waiting request (what every user sees of ``stream_key`` may have changed: a kept
        stream's writer restarted); returns how many."""
        self._wake_token_waiters()
        current = self.current_token()
        woken = sum(self._move(stream, current) for stream in list(self._streams.values()))
        if woken:
            WAKEUPS.inc(woken)
        log.info("stream %s at %s woke every waiting request (%d)", stream_key, token, woken)
        return woken

    @staticmethod
    def _move(stream: _UserStream, current: StreamToken) -> int:
        """Move ``stream`` to ``current`` and wake its waiting requests; returns how many."""
        stream.current_token = current
        woken = 0
        for future in stream.listeners:
            if not future.done():
                future.set_result(current)
                woken += 1
        stream.listeners.clear()
        return woken

    def _collect(self, user: str, seen: set[str], out: list[_UserStream]) -> None:
        if user not in seen:
            seen.add(user)
            stream = self._streams.get(user)
            if stream is not None:
                out.append(stream)

    def _wake_token_waiters(self) -> None:
        future, self._any_event = self._any_event, None
        if future is not None and not future.done():
            future.set_result(None)

    # -- waiting -----------------------------------------------------------------------------------

    async def wait_for_events(
        self, user: str, since_token: StreamToken, timeout: float, callback: WaitCallback[R]
    ) -> WaitResult[R]:
        """Wait up to ``timeout`` seconds for something for ``user`` after ``since_token``.

        Runs ``callback(prev, current)`` at once if the user's stream is already past
        ``since_token`` (it is whenever the stream was just created and anything moved since the
        client's token), then again after every wake-up while it returns an empty result. Returns
        the last result and the token that result (or the empty ranges before it) covered.
        ``since_token`` should already be bounded and caught up (``bound_future_token``,
        :meth:`wait_for_stream_token`).
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + max(timeout, 0.0)
        stream = self._user_stream(user)
        prev = since_token
        result: R | None = None
        waited = False
        stream.waits += 1
        self._open_waits += 1
        OPEN_WAITS.inc()
        try:
            while True:
                current = stream.current_token
                if current == prev:
                    if self._closed:
                        break
                    remaining = deadline - loop.time()
                    if remaining <= 0:
                        break
                    waited = True
                    woken = await self._listen(stream, remaining)
                    if woken is None:
                        break
                    current = woken
                    if current == prev:
                        continue
                result = await callback(prev, current)
                prev = current
                if result:
                    break
        finally:
            self._open_waits -= 1
            OPEN_WAITS.dec()
            stream.waits -= 1
            if not stream.waits:
                self._idle[stream.user] = self.clock()
        answer = WaitResult(result, prev, waited)
        self.count_answer(answer.outcome)
        return answer

    def count_answer(self, outcome: Outcome) -> None:
        """Count a ``/sync`` answer in :data:`LONG_POLLS` (:meth:`wait_for_events` counts its own;
        the service counts the answers it gives without waiting here)."""
        self._outcomes[outcome].inc()

    async def _listen(self, stream: _UserStream, timeout: float) -> StreamToken | None:
        """The token the next notification of ``stream`` brings, or None after ``timeout``."""
        future: asyncio.Future[StreamToken] = asyncio.get_running_loop().create_future()
        stream.listeners.add(future)
        try:
            return await asyncio.wait_for(future, timeout)
        except TimeoutError:
            return None
        finally:
            stream.listeners.discard(future)

    async def wait_for_stream_token(self, token: StreamToken, timeout: float = 10.0, poll: float = 0.5) -> bool:
        """Wait until this process has caught up with ``token``; False after ``timeout`` seconds.

        A client may hold a token from a process that has seen more than this one. Serving it
        before catching up could miss facts, and waiting without a bound could hang forever on a
        token that will never be reached, so: check every ``poll`` seconds (and on every
        notification) for ``token.is_before_or_eq(current)``, and give up after ``timeout``. The
        caller answers a timed-out request with an empty response and the client retries.
        """
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while not token.is_before_or_eq(self.current_token()):
            remaining = deadline - loop.time()
            if remaining <= 0 or self._closed:
                return False
            if self._any_event is None or self._any_event.done():
                self._any_event = loop.create_future()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(asyncio.shield(self._any_event), min(poll, remaining))
        return True

    def close(self) -> None:
        """End every wait now (the process is stopping): each returns what it has, as on a timeout.

        Waits that start afterwards return at once. Lets a server answer its long polls before it
        stops instead of cutting their connections.
        """
        self._closed = True
        self._wake_token_waiters()
        for stream in self._streams.values():
            self._move(stream, stream.current_token)

    @property
    def closed(self) -> bool:
        """True once :meth:`close` was called."""
        return self._closed

    # -- user streams and expiry -------------------------------------------------------------------

    def _user_stream(self, user: str) -> _UserStream:
        stream = self._streams.get(user)
        if stream is None:
            stream = _UserStream(user, self.current_token())
            self._streams[user] = stream
            self.expire_idle()
        self._idle.pop(user, None)
        return stream

    def expire_idle(self, now: float | None = None) -> int:
        """Drop user streams without waiters for ``idle_expiry`` seconds; returns how many.

        Called on every notification and new stream; costs O(streams expired).
        """
        now = self.clock() if now is None else now
        expired = 0
        while self._idle:
            user, since = next(iter(self._idle.items()))
            if now - since < self.idle_expiry:
                break
            del self._idle[user]
            stream = self._streams.get(user)
            if stream is not None and not stream.waits:
                del self._streams[user]
                expired += 1
        return expired

    @property
    def open_waits(self) -> int:
        """Requests waiting in :meth:`wait_for_events` right now."""
        return self._open_waits

    def listening(self, user: str) -> int:
        """How many of ``user``'s requests are parked waiting for a notification right now."""
        stream = self._streams.get(user)
        return len(stream.listeners) if stream is not None else 0

    @property
    def user_stream_count(self) -> int:
        """User streams held in memory (with or without waiters)."""
        return len(self._streams)
