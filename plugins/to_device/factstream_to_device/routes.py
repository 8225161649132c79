"""HTTP routes: send to-device messages, and register a device so that ``"*"`` reaches it.

``PUT /sendToDevice/{event_type}/{txn_id}`` (on a configured writer of the stream) stores the
messages of the body for their recipients' devices, once per ``(sender, txn_id)``.
``PUT /devices/{device_id}`` makes the caller's device known (any instance). Every refusal is a 4xx
``{"errcode", "error"}`` (a :class:`factstream.HttpError`), decided before anything is written.
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import Response

from factstream import HostApi, HttpError, RouteSpec, calling_user, raw_json_response, read_body, require_writer
from factstream_to_device.messages import MAX_ID_LENGTH, parse_send_body, request_hash
from factstream_to_device.rows import STREAM
from factstream_to_device.settings import ToDeviceSettings
from factstream_to_device.store import ToDeviceStore, TxnConflict


def _path_param(request: Request, name: str) -> str:
    value = str(request.path_params[name])
    if not value or len(value) > MAX_ID_LENGTH:
        raise HttpError(400, "M_INVALID_PARAM", f"{name} must be 1 to {MAX_ID_LENGTH} characters long")
    return value


async def send_to_device(request: Request, host: HostApi) -> Response:
    """Send the body's messages to their recipients' devices, once per transaction ID.

    The body is ``{"messages": {user_id: {device_id or "*": content}}}``; the answer
    ``{"stored": N}``, the number of device messages stored (the same answer again for a retry).
    """
    sender = calling_user(request)
    event_type = _path_param(request, "event_type")
    txn_id = _path_param(request, "txn_id")
    require_writer(host, STREAM)
    limit = host.plugin_settings(ToDeviceSettings).max_body_bytes
    messages, parsed = parse_send_body(await read_body(request, limit))
    try:
        result = await host.state(ToDeviceStore).send(
            sender, event_type, txn_id, request_hash(event_type, parsed), messages
        )
    except TxnConflict as exc:
        raise HttpError(409, "M_TXN_CONFLICT", str(exc)) from None
    return raw_json_response(result.response)


async def register_device(request: Request, host: HostApi) -> dict[str, object]:
    """Make the caller's device known, so that messages sent to ``"*"`` reach it."""
    user_id = calling_user(request)
    device_id = _path_param(request, "device_id")
    await host.state(ToDeviceStore).remember_device(user_id, device_id)
    return {}


ROUTES = (
    RouteSpec("/sendToDevice/{event_type}/{txn_id}", send_to_device, ("PUT",), name="send_to_device", access="writer"),
    RouteSpec("/devices/{device_id}", register_device, ("PUT",), name="register_device", access="user"),
)
