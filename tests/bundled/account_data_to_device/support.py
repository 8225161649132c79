"""Helpers of the bundled plugins' tests, beside ``conftest.py``: the bearer tokens of the users that
``client_for`` authenticates (a test module gives them to its hosts with
``host_cluster.configure(http={"tokens": TOKENS})``), and a stream's ``sync_rows`` called as ``/sync``
calls it (with the host's plugin API)."""

from __future__ import annotations

from typing import Any

from factstream import SyncRequest
from factstream.host.app import Host
from tests.bundled.account_data_to_device.conftest import positions

#: The users with a bearer token (on hosts given ``TOKENS``); every token may write.
USERS = ("@alice:hs", "@bob:hs", "@carol:hs")


def token_of(user: str) -> str:
    return "tok-" + user.strip("@").replace(":", "-")


TOKENS = {token_of(user): {"user": user, "write": True} for user in USERS}


async def sync(
    host: Host,
    stream: str,
    user: str,
    since: dict[str, int],
    *,
    device: str | None = None,
    limit: int = 1000,
) -> tuple[list[dict[str, Any]], dict[str, int]]:
    """What ``/sync`` asks of the stream for a token: the items after ``since`` and the new positions."""
    spec = host.plugins.registry.streams.get(stream)
    assert spec.sync_rows is not None
    upto = positions(host, stream)
    request = SyncRequest(host=host.api, stream=stream, user=user, device=device, since=since, upto=upto, limit=limit)
    return list(await spec.sync_rows(request)), upto
