"""A test plugin for the HTTP API: messages to users on the ``inbox`` stream, synced as ``inbox_key``.

Each row belongs to ``user_id`` (the stream's ``user_field``): it wakes that user's long polls and
only that user sees it in ``/sync``. Routes, one per access level:

* ``POST /inbox/messages`` (writer): ``{"user_id": ..., "body": ...}`` or a list of them, appended in
  one transaction; answers ``{"stream_ids": [...]}``. The body is decoded with msgspec and left to
  fail as it does: the host answers a body that is not JSON (400 ``M_NOT_JSON``) or of the wrong shape
  (400 ``M_BAD_JSON``) itself.
* ``GET /inbox/whoami`` (user): ``{"user": request.state.user}``.
* ``GET /inbox/ping`` (public): ``{"pong": true, "user": request.state.user}`` (always ``None``).
"""

from __future__ import annotations

from collections.abc import Callable

import msgspec
from starlette.requests import Request

import factstream
from factstream import HostApi, MigrationSpec, RegisterStream, RouteSpec, StreamSpec, StreamTable

STREAM = "inbox"


class InboxRow(msgspec.Struct, frozen=True):
    """One message: to whom, and what it says."""

    user_id: str
    body: str


async def post_messages(request: Request, host: HostApi) -> dict[str, list[int]]:
    """Append messages to the inbox stream."""
    payload = msgspec.json.decode(await request.body())
    items = payload if isinstance(payload, list) else [payload]
    messages = msgspec.convert(items, list[InboxRow])
    writer = host.stream(STREAM, InboxRow)
    async with host.database().transaction() as txn:
        ids = await writer.append_many(txn, messages)
    return {"stream_ids": ids}


async def whoami(request: Request, host: HostApi) -> dict[str, str | None]:
    """Who the bearer token stands for."""
    user: str | None = request.state.user
    return {"user": user}


async def ping(request: Request, host: HostApi) -> dict[str, object]:
    """A public route: no token needed."""
    return {"pong": True, "user": request.state.user}


@factstream.hookimpl
def register_streams(register: RegisterStream) -> None:
    register(
        StreamSpec(
            name=STREAM,
            row_type=InboxRow,
            tables=(StreamTable("inbox", "instance_name", "stream_id"),),
            sync_key="inbox_key",
            user_field="user_id",
            description="messages to users",
        )
    )


@factstream.hookimpl
def register_routes(register: Callable[[RouteSpec], None]) -> None:
    register(RouteSpec("/inbox/messages", post_messages, methods=("POST",), name="inbox_post"))
    register(RouteSpec("/inbox/whoami", whoami, name="inbox_whoami"))
    register(RouteSpec("/inbox/ping", ping, name="inbox_ping", access="public"))


@factstream.hookimpl
def register_migrations(register: Callable[[MigrationSpec], None]) -> None:
    register(MigrationSpec.from_package("factstream_inbox.migrations"))
