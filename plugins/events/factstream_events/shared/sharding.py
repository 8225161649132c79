"""Which writer of the ``events`` stream writes a room: rendezvous hashing of the room ID.

With ``stream_writers.events: [a, b, ...]`` each room belongs to exactly one writer, and every
process computes the same owner from the room ID and the configured writer names alone (no table,
no coordination): :func:`writer_for`. The owner is the writer whose hash of ``(writer name, room
ID)`` is highest ("highest random weight", or rendezvous, hashing).

Why rendezvous hashing and not ``hash(room) % len(writers)``: the owner does not depend on the
order of the list, and adding a writer moves only the rooms the new writer now wins (about ``1 /
(N + 1)`` of them, all to the new writer); removing a writer moves only its own rooms, each to the
writer that scored next. A modulo mapping would move almost every room on any change.

A room moves only when the writer list changes, which is a configuration change: the writers are
restarted with the new list, and a room's new owner then writes it from what the database holds
(docs/plugins/events.md, "Several writers"). The ``backfill`` stream is sharded the same way, by the
``events`` writers (its writers must be the same instances: :func:`check_backfill_writers`).

Routing: every write of a room (local events, remote and backfilled batches) is refused on an instance
that is not the room's writer, before anything is read or stored (:func:`refuse_misdirected`; HTTP 421
naming the writer and its URL). A new room is given an ID its creating writer owns (:func:`new_room_id`).
"""

from __future__ import annotations

import functools
import hashlib
import secrets
from collections.abc import Sequence

from factstream import ConfigError, HostApi
from factstream_events.rules.errors import MisdirectedWrite
from factstream_events.shared.rows import BACKFILL_STREAM, STREAM

__all__ = [
    "check_backfill_writers",
    "new_room_id",
    "refuse_misdirected",
    "room_writer",
    "writer_for",
    "writers_score",
]

#: Room IDs :func:`new_room_id` draws at most per writer before giving up (each draw is this
#: writer's with probability ``1 / N``: failing ``64 * N`` draws in a row has odds of about ``e**-64``).
DRAWS_PER_WRITER = 64


def writers_score(writer: str, room_id: str) -> int:
    """The weight of ``writer`` for ``room_id``: the first 8 bytes of SHA-256 over both, as an integer."""
    digest = hashlib.sha256(
        b"%b\x00%b" % (writer.encode("utf-8", "surrogatepass"), room_id.encode("utf-8", "surrogatepass"))
    )
    return int.from_bytes(digest.digest()[:8], "big")


@functools.lru_cache(maxsize=65_536)
def _owner(room_id: str, writers: tuple[str, ...]) -> str:
    return max(writers, key=lambda w: (writers_score(w, room_id), w))


def writer_for(room_id: str, writers: Sequence[str]) -> str:
    """The writer of ``room_id`` among ``writers`` (order does not matter); ``ValueError`` if none."""
    if not writers:
        raise ValueError("the events stream has no writers to shard rooms between")
    if len(writers) == 1:
        return writers[0]
    return _owner(room_id, tuple(sorted(writers)))


def room_writer(host: HostApi, room_id: str) -> str:
    """The writer of ``room_id`` in this deployment (``stream_writers.events``)."""
    return writer_for(room_id, host.settings.writers_for(STREAM))


def refuse_misdirected(host: HostApi, room_id: str) -> None:
    """:class:`MisdirectedWrite` unless this instance writes ``room_id``: called before a write reads or
    stores anything, so a misdirected write leaves no trace. The error names the room's writer and,
    when ``instance_map`` gives it an HTTP port, its base URL."""
    writer = room_writer(host, room_id)
    if writer == host.instance_name:
        return
    url = host.settings.http_url_of(writer)
    raise MisdirectedWrite(
        f"instance {host.instance_name} does not write room {room_id}; send its writes to: {writer}"
        + (f" ({url})" if url else ""),
        writer=writer,
        url=url,
    )


def new_room_id(host: HostApi, server: str) -> str:
    """A fresh room ID of ``server`` that this instance writes: random IDs are drawn until
    :func:`writer_for` gives this instance (``N`` draws on average with ``N`` writers), so a room is
    created where it will be written. :class:`MisdirectedWrite` on an instance that writes no room."""
    writers = host.settings.writers_for(STREAM)
    me = host.instance_name
    if me not in writers:
        first = sorted(writers)[0]
        url = host.settings.http_url_of(first)
        raise MisdirectedWrite(
            f"instance {me} does not write the {STREAM} stream; create rooms on one of: {', '.join(sorted(writers))}",
            writer=first,
            url=url,
        )
    for _ in range(DRAWS_PER_WRITER * len(writers)):
        room_id = f"!{secrets.token_urlsafe(18)}:{server}"
        if writer_for(room_id, writers) == me:
            return room_id
    raise RuntimeError(f"no room ID of writer {me} in {DRAWS_PER_WRITER * len(writers)} draws")  # pragma: no cover


def check_backfill_writers(host: HostApi) -> None:
    """:class:`~factstream.ConfigError` unless ``stream_writers.backfill`` and ``stream_writers.events``
    name the same instances (in any order).

    A backfilled batch of a room is written by the room's ``events`` writer, under the room's lock,
    with IDs of the ``backfill`` stream: an instance must write both streams for the rooms it owns,
    and an instance that writes ``backfill`` alone would own no room. Checked at start-up (the
    plugin's ``startup`` hook), so such a configuration never serves a write.
    """
    events, backfill = host.settings.writers_for(STREAM), host.settings.writers_for(BACKFILL_STREAM)
    if set(events) != set(backfill):
        raise ConfigError(
            f"stream_writers.{BACKFILL_STREAM} ({', '.join(backfill)}) must name the same instances as "
            f"stream_writers.{STREAM} ({', '.join(events)}): a room's backfill is written by its events writer"
        )
