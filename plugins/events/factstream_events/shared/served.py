"""The served view of an event: the Matrix client format users get, the federation format servers get.

Storage is lossless (each event's bytes as received); what goes out is a view of them, built here:

* **Client format** (every route that serves events to a user): the stored top-level keys less the
  federation-only ones (:data:`CLIENT_DROPPED`: ``auth_events``, ``prev_events``, ``hashes``,
  ``signatures``, ``depth``, and ``origin`` and ``prev_state`` as the reference drops them too), then
  ``event_id``, the top-level ``redacts`` of a redaction in a room version that moved it into
  ``content`` (version 11), and the server's own ``unsigned``. A stored ``unsigned`` (a remote server's)
  is never served: what ``unsigned`` says is this server's. The values are the stored bytes, not
  re-encoded: the top level is split into its keys' raw values (``msgspec.Raw``) and joined again.
* **Federation format** (the writer's routes: ``/backfill``, ``/state?server=true``): the stored bytes
  less a stored ``unsigned`` (a remote server's, its other keys' values as stored), or, for a redacted
  event, its pruned form (the room version's redaction algorithm), never ``unsigned``. ``raw=true``
  on ``/event`` stays the one way to the stored bytes (of a redacted event, or with its ``unsigned``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import msgspec

from factstream_events.rules.canonical import parse_event_json
from factstream_events.rules.prune import prune_event

__all__ = [
    "CLIENT_DROPPED",
    "REDACTED_MARKER",
    "ClientBody",
    "client_body",
    "client_event",
    "federation_event",
    "pruned_json",
]

#: Top-level keys of the federation format that the client format drops.
CLIENT_DROPPED = frozenset({"auth_events", "prev_events", "hashes", "signatures", "depth", "origin", "prev_state"})

#: ``unsigned.redacted_because`` for a reader who may not see the redaction: it says that the event was
#: redacted (which its pruned content shows anyway), and nothing of the redaction (no ID, sender, time
#: or reason).
REDACTED_MARKER: Mapping[str, Any] = {"type": "m.room.redaction", "content": {}}

#: Keys the served view sets itself (a stored copy of them is replaced).
_OWN = frozenset({"event_id", "unsigned"})

_encode = msgspec.json.Encoder().encode
_top_level = msgspec.json.Decoder(dict[str, msgspec.Raw])
_int = msgspec.json.Decoder(int)
#: The encoded form of the usual top-level keys (the others are encoded as they come).
_KEYS = {k: _encode(k) for k in ("content", "origin_server_ts", "room_id", "sender", "state_key", "type", "redacts")}


@dataclass(frozen=True, slots=True)
class ClientBody:
    """An event in the client format up to its ``unsigned``: everything of it that is the same for every
    reader and every moment (``head``: the JSON object's bytes without its closing brace) and the event's
    ``origin_server_ts`` (``ts``: None when it is not an integer), which ``unsigned.age`` is counted from.
    It depends on the stored bytes alone, so it can be kept for as long as the event is not redacted."""

    head: bytes
    ts: int | None

    def served(self, unsigned: dict[str, Any] | None, now: int | None = None) -> bytes:
        """The event as served: ``unsigned`` (None: none) with ``age`` when ``now`` is given."""
        if unsigned is None:
            return self.head + b"}"
        if now is not None and self.ts is not None:
            unsigned = {**unsigned, "age": now - self.ts}
        return self.head + b',"unsigned":' + _encode(unsigned) + b"}"


def client_body(raw: bytes, event_id: str, *, redacts: str | None = None) -> ClientBody:
    """The stored event ``raw`` (a JSON object) in the client format, less ``unsigned`` (module docstring).

    ``redacts``: the target to set as the top-level ``redacts`` (a version 11 redaction; None: the stored
    top-level ``redacts``, if any, stays).
    """
    fields = _top_level.decode(raw)
    parts: list[Any] = []  # bytes, and the stored values (msgspec.Raw, a buffer of the stored bytes)
    for key, value in fields.items():
        if key in CLIENT_DROPPED or key in _OWN or (redacts is not None and key == "redacts"):
            continue
        parts += (_KEYS.get(key) or _encode(key), b":", value, b",")
    parts += (b'"event_id":', _encode(event_id))
    if redacts is not None:
        parts += (b',"redacts":', _encode(redacts))
    return ClientBody(b"{" + b"".join(parts), _timestamp(fields.get("origin_server_ts")))


def client_event(
    raw: bytes,
    event_id: str,
    unsigned: dict[str, Any] | None,
    *,
    redacts: str | None = None,
    now: int | None = None,
) -> bytes:
    """The stored event ``raw`` (a JSON object) in the client format (module docstring): :func:`client_body`
    with ``unsigned`` (None: no ``unsigned``); with ``now``, ``unsigned.age`` is added: ``now`` less the
    event's ``origin_server_ts`` (when that is an integer).
    """
    return client_body(raw, event_id, redacts=redacts).served(unsigned, now)


def _timestamp(origin_server_ts: msgspec.Raw | None) -> int | None:
    """The stored ``origin_server_ts`` (None: none, or not an integer: a remote event may carry anything)."""
    if origin_server_ts is None:
        return None
    try:
        return int(_int.decode(bytes(origin_server_ts)))
    except msgspec.DecodeError:
        return None


def pruned_json(raw: bytes, room_version: str) -> bytes:
    """The stored event ``raw`` pruned by ``room_version``'s redaction algorithm, as JSON (no ``unsigned``)."""
    return _encode(prune_event(parse_event_json(raw), room_version))


def federation_event(raw: bytes, room_version: str, *, redacted: bool) -> bytes:
    """The federation format: the stored bytes less a stored ``unsigned`` (a remote server's: its
    ``transaction_id``, ``age_ts``, ``invite_room_state`` are not this server's to pass on; it is
    outside the hashes and signatures, so the event stays valid), or the pruned form of a redacted event."""
    if redacted:
        return pruned_json(raw, room_version)
    fields = _top_level.decode(raw)  # the key may be spelled with escapes: decoded, not searched for
    if "unsigned" not in fields:
        return raw
    parts = [_encode(key) + b":" + value for key, value in fields.items() if key != "unsigned"]
    return b"{" + b",".join(parts) + b"}"
