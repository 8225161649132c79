"""Redis pub/sub transport: every instance publishes to and subscribes to one channel.

Two connections per process, as in the reference: one publishing, one subscribed (a subscribed
connection cannot publish). On every (re)connection the subscriber first SUBSCRIBEs, and only then
does the process publish ``REPLICATE`` and announce its own positions: peers cannot see that we
connected, and a POSITION published before our subscription would be lost (the reference fixed this
ordering after losing positions). Each connection counts as a new link for the handler, so nothing
is accepted on it before a POSITION, whose catch-up reads any gap from the database.

Everything published comes back to us: our own RDATA and POSITION are recognised by their prefix and
dropped before parsing. Lines that do not parse are logged and skipped (there is no peer to answer).
Publishes go out in order from one task, pipelined in batches, so the streamer never waits on Redis;
the same task counts the channel's subscribers (``PUBSUB NUMSUB``) once a second, which also checks
the publishing connection. The subscribed connection sends ``PING`` after a quiet while and is
dropped if even that gets no answer.

Beyond the reference, RDATA lines may travel several to a message (``packing``): every factstream
process announces ``FS_MULTILINE <instance>`` on subscribing and again on every ``REPLICATE`` it
sees, and a writer packs only while the subscriber count (taken after the last ``REPLICATE``) is
covered by those announcements. Any ``REPLICATE`` turns packing off at once, before the writer
answers it, so a reference peer (which subscribes, then publishes ``REPLICATE``, and never announces)
receives one command per message from its first ``POSITION`` on; what it got before that it drops
anyway, and catches up from the database. Whenever packing stops, every stream's ``POSITION t t``
goes out first, for a subscriber that processed some earlier POSITION and then could not read packed
rows. Received messages are split into lines either way.

With ``replication.secret`` set, every message published is signed with this instance's name and
every message received must carry a valid signature (:meth:`ReplicationSecret.sign`); others are
dropped, counted and logged before they are parsed, and so is every RDATA or POSITION line of a
signed message that is not under its signer's name (decision 17). Reads made only of own echoes are
recognised by their prefix first, unchecked.

Both connections speak RESP directly (:mod:`factstream.replication.resp`). Lines are published as
they are sent, written straight to the socket, with the replies counted as they come back; a
pipeline not yet answered when the connection breaks is published again after reconnecting (a
reader drops what it has seen). Received messages are handled in the event loop's read callback, a
socket read at a time: consecutive RDATA lines of one stream and writer go to the handler as one run,
as over TCP.

This module holds :class:`RedisTransport` with the publishing side (the outbox, the publishing task,
counting subscribers, packing). The subscribing side it extends, with the signature checks on what
is received, is :class:`~factstream.replication.redis_subscribe.RedisSubscriber`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import Callable

from factstream.config import Settings
from factstream.replication import wire
from factstream.replication.links import Reconnects, track_links, untrack
from factstream.replication.redis_subscribe import MAX_BACKOFF, Reader, RedisLink, RedisSubscriber
from factstream.replication.resp import RespClient, RespError

__all__ = ["Reader", "RedisLink", "RedisTransport"]

log = logging.getLogger(__name__)

PEER_CHECK_SECONDS = 1.0
#: Bytes waiting in the publishing socket's buffer beyond which new messages queue instead.
WRITE_BUFFER_LIMIT = 1024 * 1024
#: Messages waiting while Redis is unreachable before they are dropped. From then on everything is
#: dropped until publishing works again, and then the streamer's positions go out before anything
#: else, so readers see the gap and catch up from the database (see ``on_gap``).
MAX_OUTBOX = 100_000
#: Lines per packed message at most.
PACKED_LINES = 1_000
#: After a REPLICATE, how soon the subscribers are counted again (so packing resumes quickly).
RECOUNT_SECONDS = 0.1


class RedisTransport(RedisSubscriber):
    """Replication over one Redis pub/sub channel named after the deployment.

    The subscribing side is :class:`~factstream.replication.redis_subscribe.RedisSubscriber`; this
    class adds the publishing side (the outbox, the publishing task, packing).
    """

    def __init__(self, settings: Settings, handler: Reader) -> None:
        super().__init__(settings, handler)
        #: Called once publishing works again after commands were dropped: it must publish, before
        #: anything else, a POSITION for every stream this process writes (the streamer's mark_gap).
        self.on_gap: Callable[[], None] | None = None
        self._publisher: RespClient | None = None
        #: ``(channel, messages, commands in them)`` not yet written (no connection, or a full socket), in order.
        self._outbox: deque[tuple[bytes, list[bytes], int]] = deque()
        self._waiting = 0
        self._outbox_ready = asyncio.Event()
        self._gap = False  # commands were dropped: drop everything until publishing works again
        self._tasks: list[asyncio.Task[None]] = []
        self.published = 0
        self._peers = True
        #: Whether RDATA lines go out packed, several to a message: only while every other subscriber
        #: announced that it reads them (``MULTILINE``), counted after the last ``REPLICATE``.
        self.packing = False
        #: Bumped by every ``REPLICATE`` (someone subscribed): a subscriber count asked for before it
        #: may not include the newcomer, so it cannot turn packing on.
        self._replicate_epoch = 0
        #: When the publishing task counts the subscribers early (after a REPLICATE), if it will.
        self._recount_at: float | None = None
        self._may_pack = settings.replication.redis_packing
        self._publish_reconnects = Reconnects(log, self.stats.peer)

    async def start(self) -> None:
        track_links(self)
        loop = asyncio.get_running_loop()
        self._tasks = [
            loop.create_task(self._subscribe_loop(), name="repl-redis-sub"),
            loop.create_task(self._publish_loop(), name="repl-redis-pub"),
        ]

    # -- publishing ----------------------------------------------------------------------------------

    def send(self, command: wire.Command) -> None:
        if type(command) is wire.PositionCommand and command.stamp is not None and not self.stamping:
            command = command.unstamped()  # a subscriber may be a reference peer, which cannot parse it
        self._publish(command.redis_channel(self.channel).encode("utf-8"), [wire.encode_line(command)[:-1]])

    #: How the streamer ends the lines it hands to :meth:`send_lines`: not at all (a message is a line).
    line_end = b""

    def send_lines(self, lines: list[bytes]) -> None:
        # RDATA lines: one message per command as the reference publishes them, unless every
        # subscriber reads packed messages.
        if self.packing and len(lines) > 1:
            self._publish(
                self._channel,
                [b"\n".join(lines[i : i + PACKED_LINES]) for i in range(0, len(lines), PACKED_LINES)],
                len(lines),
            )
        else:
            self._publish(self._channel, lines)
        if self.counting:
            self.stats.rows_sent += len(lines)

    def _publish(self, channel: bytes, messages: list[bytes], commands: int | None = None) -> None:
        """Publish ``messages`` in order; ``commands`` is how many commands they hold (default: one each)."""
        if self._gap:
            return  # nothing may go out before the positions that make readers catch up
        if self._secret is not None:
            sign, me = self._secret.sign, self._me
            messages = [sign(message, me) for message in messages]
        if self.counting:
            stats = self.stats
            stats.commands_sent += len(messages) if commands is None else commands
            stats.bytes_sent += sum(map(len, messages))
        publisher = self._publisher
        if (
            not self._outbox
            and publisher is not None
            and publisher.lost is None
            and publisher.write_buffer_size() < WRITE_BUFFER_LIMIT
        ):
            publisher.publish([(channel, messages)])  # written now; replies are counted as they come
            self.published += len(messages)
            return
        count = len(messages) if commands is None else commands
        if self._waiting + count > MAX_OUTBOX:
            log.warning(
                "Redis unreachable: dropping %d unpublished commands (readers will catch up from the database)",
                self._waiting + count,
            )
            self._outbox.clear()
            self._waiting = 0
            self._gap = True
            return
        self._outbox.append((channel, messages, count))
        self._waiting += count
        self._outbox_ready.set()

    def has_peers(self) -> bool:
        """Whether anyone else is subscribed; with nobody listening the streamer skips its work.

        Safe to be briefly wrong: a newcomer subscribes and then publishes ``REPLICATE``, which
        sets the flag at once and is answered with positions, from which it catches up.
        """
        return self.link is not None and self._peers

    async def _publish_loop(self) -> None:
        """Keep the publishing connection up, drain what queued, count the subscribers every second."""
        loop = asyncio.get_running_loop()
        delay = 0.1
        while True:
            publisher = self._publisher
            try:
                if publisher is None or publisher.lost is not None:
                    resend = publisher.unacknowledged_batches() if publisher is not None else []
                    self._publisher = None
                    publisher = await RespClient.open(self.address)
                    if resend:
                        publisher.publish(resend)  # not answered before the break: again (readers drop repeats)
                    self._publisher = publisher
                    self._publish_reconnects.succeeded()
                    delay = 0.1
                    if self._gap:
                        self._gap = False
                        if self.on_gap is not None:
                            self.on_gap()  # positions first: readers catch up what was dropped
                checked = loop.time()
                self._recount_at = None
                subscribed = self.link is not None  # then one of the subscribers is us
                epoch = self._replicate_epoch
                reply = await publisher.command("PUBSUB", "NUMSUB", self._channel)
                count = int(reply[1])
                self._peers = count > (1 if subscribed else 0)
                # Packed messages only if every other subscriber reads them. A subscriber that never
                # announced (a reference peer, a monitoring client) keeps them off; a newcomer's
                # REPLICATE turns them off until a count taken after it confirms.
                factstream_only = (
                    subscribed
                    and self.link is not None
                    and epoch == self._replicate_epoch
                    and count - 1 <= len(self._multiline)
                )
                self.stamping = factstream_only
                if self._may_pack and factstream_only:
                    self.packing = True
                else:
                    self._stop_packing()
                while publisher.lost is None:
                    outbox = self._outbox
                    while outbox and publisher.write_buffer_size() < WRITE_BUFFER_LIMIT:
                        channel, messages, count = outbox.popleft()
                        self._waiting -= count
                        publisher.publish([(channel, messages)])
                        self.published += len(messages)
                    if outbox:
                        await publisher.writable.wait()
                        continue
                    self._outbox_ready.clear()
                    # A REPLICATE asks for an early count: its sender and the peers' announcements
                    # answering it are on the channel within milliseconds.
                    due = checked + PEER_CHECK_SECONDS
                    if self._recount_at is not None:
                        due = min(due, self._recount_at)
                    with contextlib.suppress(TimeoutError):
                        async with asyncio.timeout(max(0.0, due - loop.time())):
                            await self._outbox_ready.wait()
                    if loop.time() >= due:
                        break  # time to count the subscribers again (which also checks the connection)
            except asyncio.CancelledError:
                raise
            except (RespError, OSError, ValueError, IndexError, TypeError) as exc:
                # Not lost for readers: republished after reconnecting (and they catch up from the database).
                self._peers = True  # unknown: keep sending
                self._publish_reconnects.failed(f"cannot publish: {exc}", delay)
                if publisher is not None:
                    publisher.close()
                await asyncio.sleep(delay)
                delay = min(delay * 2, MAX_BACKOFF)

    def _forget_multiline(self) -> None:
        """Someone (re)subscribed: stop packing, count again who reads packed messages, and announce
        that we do (for the count that may turn packing back on)."""
        self._stop_packing()
        self.stamping = False
        self._multiline.clear()
        self._replicate_epoch += 1
        if self._recount_at is None:
            self._recount_at = asyncio.get_running_loop().time() + RECOUNT_SECONDS
            self._outbox_ready.set()  # wakes the publishing task, which then waits for the recount
        self._publish(self._channel, [self._announcement])

    def _stop_packing(self) -> None:
        """Publish one command per message from now on.

        A subscriber we had not counted may have received packed messages it could not read, after
        a POSITION it did process (one not sent for its REPLICATE, which had not reached us yet). So
        every stream's ``POSITION t t`` goes out first (``on_gap``), ``t`` the last token sent: such
        a reader is behind ``t`` and catches up from the database before any later row.
        """
        if self.packing:
            self.packing = False
            if self.on_gap is not None:
                self.on_gap()

    async def close(self) -> None:
        untrack(self)
        for task in self._tasks:
            task.cancel()
        for task in self._tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        if self._resuming is not None:
            self._resuming.cancel()
        if self._publisher is not None:
            self._publisher.close()
