"""HTTP routes: send to-device messages, and register a device so that ``"*"`` reaches it.

``PUT /sendToDevice/{event_type}/{txn_id}`` (on a configured writer of the stream) stores the
messages of the body for their recipients' devices, once per ``(sender, txn_id)``.
``PUT /devices/{device_id}`` makes the caller's device known (any instance). Every refusal is a 4xx
with ``{"errcode", "error"}``, decided before anything is written.
"""

from __future__ import annotations

from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from factstream import RouteSpec
from factstream_to_device.messages import MAX_ID_LENGTH, parse_send_body, request_hash
from factstream_to_device.rows import STREAM
from factstream_to_device.store import ToDeviceStore, TxnConflict
from factstream_to_device.web import HttpError, fail, max_body_bytes, raw_json_response, read_body


def authenticated_user(request: Request) -> str:
    user = getattr(request.state, "user", None)
    user_id = getattr(user, "user_id", user)
    if not isinstance(user_id, str) or not user_id:
        fail(401, "M_MISSING_TOKEN", "this route needs an authenticated user")
    return user_id


def check_writer(host: Any) -> None:
    """421 unless this instance is a configured writer of the stream (naming the writers)."""
    gen = host.id_generator(STREAM)
    if not gen.is_writer:
        writers = ", ".join(gen.writers) or "(none)"
        fail(
            421,
            "M_MISDIRECTED",
            f"instance {gen.instance_name} does not write the {STREAM} stream; send writes to: {writers}",
        )


def _path_param(request: Request, name: str) -> str:
    value = str(request.path_params[name])
    if not value or len(value) > MAX_ID_LENGTH:
        fail(400, "M_INVALID_PARAM", f"{name} must be 1 to {MAX_ID_LENGTH} characters long")
    return value


async def send_to_device(request: Request) -> Response:
    try:
        sender = authenticated_user(request)
        event_type = _path_param(request, "event_type")
        txn_id = _path_param(request, "txn_id")
        host = request.state.host
        check_writer(host)
        messages, parsed = parse_send_body(await read_body(request, max_body_bytes()))
        try:
            result = await ToDeviceStore.of(host).send(
                sender, event_type, txn_id, request_hash(event_type, parsed), messages
            )
        except TxnConflict as exc:
            fail(409, "M_TXN_CONFLICT", str(exc))
    except HttpError as exc:
        return exc.response()
    return raw_json_response(result.response)


async def register_device(request: Request) -> Response:
    try:
        user_id = authenticated_user(request)
        device_id = _path_param(request, "device_id")
        await ToDeviceStore.of(request.state.host).remember_device(user_id, device_id)
    except HttpError as exc:
        return exc.response()
    return JSONResponse({})


ROUTES = (
    RouteSpec("/sendToDevice/{event_type}/{txn_id}", send_to_device, ("PUT",), name="send_to_device", access="writer"),
    RouteSpec("/devices/{device_id}", register_device, ("PUT",), name="register_device", access="user"),
)
