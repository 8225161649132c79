"""A test plugin for the HTTP API: messages to users on the ``inbox`` stream, synced as ``inbox_key``.

Each row belongs to ``user_id`` (the stream's ``user_field``): it wakes that user's long polls and
only that user sees it in ``/sync``. Routes, one per access level:

* ``POST /inbox/messages`` (writer): ``{"user_id": ..., "body": ...}`` or a list of them, appended in
  one transaction; answers ``{"stream_ids": [...]}``.
* ``GET /inbox/whoami`` (user): ``{"user": request.state.user}``.
* ``GET /inbox/ping`` (public): ``{"pong": true, "user": request.state.user}`` (always ``None``).
"""

from __future__ import annotations

import msgspec

import factstream
from factstream import MigrationSpec, RouteSpec, StreamSpec, StreamTable


class InboxRow(msgspec.Struct, frozen=True):
    """One message: to whom, and what it says."""

    user_id: str
    body: str


class NewMessage(msgspec.Struct, frozen=True):
    user_id: str
    body: str


async def post_messages(request):
    """Append messages to the inbox stream."""
    payload = msgspec.json.decode(await request.body())
    items = payload if isinstance(payload, list) else [payload]
    messages = msgspec.convert(items, list[NewMessage])
    host = request.state.host
    gen = host.id_generator("inbox")
    async with host.database().transaction() as txn:
        ids = await gen.append_many_txn(txn, "inbox", [{"user_id": m.user_id, "body": m.body} for m in messages])
    return {"stream_ids": ids}


async def whoami(request):
    """Who the bearer token stands for."""
    return {"user": request.state.user}


async def ping(request):
    """A public route: no token needed."""
    return {"pong": True, "user": request.state.user}


@factstream.hookimpl
def register_streams(register):
    register(
        StreamSpec(
            name="inbox",
            row_type=InboxRow,
            tables=(StreamTable("inbox", "instance_name", "stream_id"),),
            sync_key="inbox_key",
            user_field="user_id",
            description="messages to users",
        )
    )


@factstream.hookimpl
def register_routes(register):
    register(RouteSpec("/inbox/messages", post_messages, methods=("POST",), name="inbox_post"))
    register(RouteSpec("/inbox/whoami", whoami, name="inbox_whoami"))
    register(RouteSpec("/inbox/ping", ping, name="inbox_ping", access="public"))


@factstream.hookimpl
def register_migrations(register):
    register(MigrationSpec.from_package("factstream_inbox.migrations"))
