"""Content hashes, reference hashes and event IDs of Matrix events (room versions 1 to 11).

* The *content hash* covers the whole event as sent (less ``unsigned``, ``signatures`` and ``hashes``) and
  is carried in the event as ``hashes.sha256``: it lets anyone tell whether a pruned copy had its content
  removed by a redaction or tampered with.
* The *reference hash* covers the pruned event (see :mod:`factstream_events.rules.prune`), so it survives
  redaction. In room versions 1 and 2 the event ID is a separate string chosen by the sending server and
  stored in the event; from version 3 the event ID *is* the reference hash: ``$`` followed by its unpadded
  base64, standard alphabet in version 3 and URL-safe alphabet from version 4.

Pure and dependency-free (standard library only); hashes are computed over
:func:`~factstream_events.rules.canonical.canonical_json`, so an event holding a float or an integer outside
canonical JSON's range raises :class:`~factstream_events.rules.canonical.CanonicalJsonError`.
"""

from __future__ import annotations

import base64
import hashlib
from typing import Any

from factstream_events.rules.canonical import canonical_json
from factstream_events.rules.prune import (
    KNOWN_ROOM_VERSIONS,
    _kept_top_level_keys,
    _pruned_content,
    _rules,
    check_room_version,
)

__all__ = [
    "EventIdError",
    "content_hash",
    "event_id_for",
    "is_valid_event_id",
    "local_event_id",
    "reference_hash",
]

_MAX_EVENT_ID_BYTES = 255
_EMBEDDED_ID_VERSIONS = frozenset({"1", "2"})
"""Room versions whose event IDs are chosen by the sender and carried in the event as ``event_id``."""

_STANDARD_BASE64_VERSIONS = frozenset({"3"})
"""Room versions whose hash-based event IDs use the standard base64 alphabet (later ones: URL-safe)."""

_CONTENT_HASH_EXCLUDED = frozenset({"unsigned", "signatures", "hashes"})


class EventIdError(ValueError):
    """An event ID cannot be given for the event (none carried where one is required, or not derivable)."""


def _unpadded_base64(digest: bytes, *, url_safe: bool = False) -> str:
    encoded = base64.urlsafe_b64encode(digest) if url_safe else base64.b64encode(digest)
    return encoded.rstrip(b"=").decode("ascii")


def content_hash(event: dict[str, Any]) -> str:
    """The event's content hash: what belongs in ``hashes.sha256``.

    SHA-256 of the canonical JSON of ``event`` without its ``unsigned``, ``signatures`` and ``hashes`` keys,
    as unpadded standard base64. ``event`` is not modified.
    """
    hashed = {key: value for key, value in event.items() if key not in _CONTENT_HASH_EXCLUDED}
    return _unpadded_base64(hashlib.sha256(canonical_json(hashed)).digest())


def reference_hash(event: dict[str, Any], room_version: str) -> bytes:
    """The event's reference hash (32 raw bytes of SHA-256).

    Computed over the canonical JSON of the event pruned for ``room_version``, without ``signatures`` and
    ``unsigned`` (and so without any top-level ``age_ts``, which pruning drops). From room version 3 an
    ``event_id`` key is ignored as well: there the event ID is derived from this hash and cannot be part of
    what is hashed (the version 3+ event format has no such key; gomatrixserverlib drops it the same way).
    In versions 1 and 2 it stays, as the spec's algorithm keeps it.
    """
    pruned = _pruned_view(event, room_version)
    pruned.pop("signatures", None)
    pruned.pop("unsigned", None)
    if room_version not in _EMBEDDED_ID_VERSIONS:
        pruned.pop("event_id", None)
    return hashlib.sha256(canonical_json(pruned)).digest()


#: Each room version's pruning rules and the top-level keys they keep.
_PRUNING = {v: (_rules(v), _kept_top_level_keys(_rules(v))) for v in KNOWN_ROOM_VERSIONS}


def _pruned_view(event: dict[str, Any], room_version: str) -> dict[str, Any]:
    """:func:`~factstream_events.rules.prune.prune_event` for hashing only: the kept top-level values are shared
    with ``event``, not copied (the result is encoded and dropped, never changed)."""
    if room_version not in _PRUNING:
        check_room_version(room_version)  # raises UnknownRoomVersion
    rules, kept = _PRUNING[room_version]
    return {
        key: _pruned_content(event.get("type"), value, rules) if key == "content" else value
        for key, value in event.items()
        if key in kept  # "content" among them
    }


def event_id_for(event: dict[str, Any], room_version: str) -> str:
    """The ID of ``event`` in a room of ``room_version``.

    Versions 1 and 2: the ``event_id`` carried in the event (:class:`EventIdError` when it is missing or
    not a valid event ID). Version 3: ``$`` and the unpadded standard base64 of :func:`reference_hash`.
    Versions 4 to 11: the same with the URL-safe alphabet (``-`` and ``_`` for ``+`` and ``/``). Other
    room versions raise :class:`~factstream_events.rules.prune.UnknownRoomVersion`.
    """
    check_room_version(room_version)
    if room_version in _EMBEDDED_ID_VERSIONS:
        return _embedded_event_id(event, room_version)
    digest = reference_hash(event, room_version)
    return "$" + _unpadded_base64(digest, url_safe=room_version not in _STANDARD_BASE64_VERSIONS)


def _embedded_event_id(event: dict[str, Any], room_version: str) -> str:
    event_id = event.get("event_id")
    if event_id is None:
        raise EventIdError(f"room version {room_version} events carry their ID in 'event_id', and this one has none")
    if not isinstance(event_id, str) or not is_valid_event_id(event_id):
        raise EventIdError(f"the event's 'event_id' {event_id!r} is not a valid event ID")
    return event_id


def is_valid_event_id(s: str) -> bool:
    """Whether ``s`` has the shape of an event ID.

    It starts with ``$``, has at least one character after it, is at most 255 bytes long in UTF-8 (the
    spec's limit; the same as 255 characters for the ASCII IDs of hash-based room versions), and contains
    no NUL, no whitespace and no unpaired surrogate.
    """
    if not isinstance(s, str) or len(s) < 2 or not s.startswith("$"):
        return False
    try:
        size = len(s.encode("utf-8"))
    except UnicodeEncodeError:
        return False
    if size > _MAX_EVENT_ID_BYTES:
        return False
    return not any(char == "\x00" or char.isspace() for char in s)


def local_event_id(event: dict[str, Any], room_version: str) -> str:
    """The ID of an event this server creates, in a room of ``room_version`` (3 to 11).

    The rule: on a copy of ``event`` (the input is not modified), drop any ``event_id`` (the version 3+
    format has none), set ``hashes`` to ``{"sha256": content_hash(copy)}``, and return
    :func:`event_id_for` of that copy, which for versions 4+ is ``$`` and the URL-safe unpadded base64 of
    its reference hash. The content hash must go into ``hashes`` first because the reference hash is
    computed over the *pruned* event, which for most event types has empty content: without it, two
    events differing only in content would get the same ID. The caller sends the event with that same
    ``hashes`` value (recompute it with :func:`content_hash`).

    Room versions 1 and 2 raise :class:`EventIdError`: their IDs are not derived from the event but chosen
    by the server and stored in it.
    """
    check_room_version(room_version)
    if room_version in _EMBEDDED_ID_VERSIONS:
        raise EventIdError(
            f"room version {room_version} event IDs are chosen by the sending server, not derived from the event"
        )
    draft = {key: value for key, value in event.items() if key != "event_id"}
    draft["hashes"] = {"sha256": content_hash(draft)}
    return event_id_for(draft, room_version)
