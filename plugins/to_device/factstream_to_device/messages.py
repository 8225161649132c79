"""Validating a ``PUT /sendToDevice`` body and splitting it into messages, content kept as sent.

The body is ``{"messages": {user_id: {device_id | "*": content}}}``; every content must be a JSON
object. Each content is stored as the exact text the client sent (``msgspec.Raw`` slices of the
body), so key order, duplicate keys and the digits of numbers survive. The one exception: a body
that is valid JSON but that msgspec cannot decode (a number beyond double range such as ``1e400``)
has its contents re-encoded from Python's parse.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass

import msgspec

from factstream import HttpError, json_object_text

MAX_ID_LENGTH = 255
ALL_DEVICES = "*"


@dataclass(frozen=True)
class Message:
    """One content addressed to one device of one user (``device_id`` may be ``"*"``)."""

    user_id: str
    device_id: str
    content: str


def is_user_id(value: str) -> bool:
    """``@localpart:server``, at most 255 characters."""
    return 0 < len(value) <= MAX_ID_LENGTH and value.startswith("@") and ":" in value[2:] and value.index(":", 1) > 1


class _Body(msgspec.Struct):
    messages: dict[str, dict[str, msgspec.Raw]]


def parse_send_body(body: bytes) -> tuple[list[Message], dict[str, object]]:
    """The messages of a body, in body order, and its parsed ``messages`` (a 400 for anything wrong)."""
    text = json_object_text(body)
    parsed = json.loads(text)
    messages = parsed.get("messages")
    if not isinstance(messages, dict):
        raise HttpError(400, "M_BAD_JSON", "the body must have a 'messages' object: {user_id: {device_id: content}}")
    for user_id, devices in messages.items():
        if not is_user_id(user_id):
            raise HttpError(400, "M_INVALID_PARAM", f"messages: {user_id!r} is not a user ID (@localpart:server)")
        if not isinstance(devices, dict):
            raise HttpError(400, "M_BAD_JSON", f"messages[{user_id!r}] must be an object of device IDs to contents")
        for device_id, content in devices.items():
            if not device_id or len(device_id) > MAX_ID_LENGTH:
                raise HttpError(
                    400, "M_INVALID_PARAM", f"messages[{user_id!r}]: device IDs must be 1 to 255 characters"
                )
            if not isinstance(content, dict):
                raise HttpError(400, "M_BAD_JSON", f"messages[{user_id!r}][{device_id!r}] must be a JSON object")
    try:
        raw = msgspec.json.decode(body, type=_Body).messages
        out = [
            Message(user_id, device_id, bytes(content).decode("utf-8"))
            for user_id, devices in raw.items()
            for device_id, content in devices.items()
        ]
    except msgspec.DecodeError:
        out = [
            Message(user_id, device_id, json.dumps(content, ensure_ascii=False, separators=(",", ":")))
            for user_id, devices in messages.items()
            for device_id, content in devices.items()
        ]
    return out, messages


def request_hash(event_type: str, messages: dict[str, object]) -> str:
    """A digest of what a request asks for, insensitive to key order and whitespace."""
    canonical = json.dumps(
        {"type": event_type, "messages": messages}, sort_keys=True, separators=(",", ":"), ensure_ascii=False
    )
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()
