"""Acknowledging to-device messages through the host's real ``GET /sync`` (real PostgreSQL, the host's
ASGI app): a token at or past a delivered message deletes it, also when nothing is new for the stream;
a sync without ``since`` acknowledges nothing and gets the whole inbox again (the reference's initial
sync)."""

from __future__ import annotations

import asyncio
import itertools
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx
import psycopg
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from factstream.db.engine import libpq_url
from factstream.host.app import Host
from factstream.testing import HostCluster
from tests.bundled.account_data_to_device.conftest import writing

ALICE = "@alice:hs"
BOB = "@bob:hs"
TOKENS = {
    "alice-token": {"user": ALICE, "write": True},
    "bob-token": {"user": BOB, "write": False},
}


@pytest.fixture
def api_host(host_cluster: HostCluster) -> Callable[..., Any]:
    """``await api_host(name="main", writers=("main",), **http)``: the :class:`Api` of a started host whose
    HTTP API accepts ``TOKENS``; ``writers`` write the bundled streams."""

    async def start(name: str = "main", writers: tuple[str, ...] = ("main",), **http: Any) -> Api:
        host = await host_cluster(name, stream_writers=writing(*writers), http={"tokens": TOKENS, **http})
        return Api(host, host_cluster.client(host, "alice-token"), host_cluster.client(host, "bob-token"))

    return start


TXN_IDS = itertools.count()


@dataclass(frozen=True)
class Api:
    """Alice sends, Bob syncs, through the host's ASGI app (clients closed with the host cluster)."""

    host: Host
    alice: httpx.AsyncClient
    bob: httpx.AsyncClient

    async def send(self, device: str, content: dict[str, Any]) -> None:
        response = await self.alice.put(
            f"/sendToDevice/m.test/t{next(TXN_IDS)}", json={"messages": {BOB: {device: content}}}
        )
        assert response.status_code == 200, response.text
        assert response.json() == {"stored": 1}
        # The host's pipeline for its own writes woke the recipient's long polls when the send's
        # transaction committed (from the rows in memory), before the answer: a /sync now covers it.

    async def sync(self, device: str, since: str | None = None, wait: bool = False) -> tuple[list[dict[str, Any]], str]:
        """Bob's ``/sync`` for ``device``: the to-device contents and ``next_batch``.

        ``wait``: long-poll until something comes (a send wakes the recipient a moment after it
        answered); otherwise answer at once.
        """
        items, next_batch, limited = await self.sync_page(device, since, wait)
        assert not limited
        return items, next_batch

    async def sync_page(
        self, device: str | None, since: str | None, wait: bool = False
    ) -> tuple[list[dict[str, Any]], str, bool]:
        """Bob's ``/sync`` (``device`` None for none): contents, ``next_batch`` and ``limited``."""
        params = {"timeout": "10000" if wait else "0"}
        if device is not None:
            params["device"] = device
        if since is not None:
            params["since"] = since
        response = await self.bob.get("/sync", params=params)
        assert response.status_code == 200, response.text
        body = response.json()
        items = [item["content"] for item in body["streams"].get("to_device", [])]
        return items, body["next_batch"], bool(body.get("limited"))

    async def position(self, token: str) -> int:
        """The to-device position a token holds."""
        value = (await self.host.sync.parse_token(token)).get("to_device_key")
        assert isinstance(value, int)
        return value

    async def inbox(self, device: str) -> list[dict[str, Any]]:
        rows = await self.host.database().fetchall(
            "SELECT content FROM device_inbox WHERE entity = %(u)s AND device_id = %(d)s ORDER BY stream_id",
            {"u": BOB, "d": device},
        )
        return [json.loads(r[0]) for r in rows]


@pytest.fixture
async def api(api_host) -> Api:
    return await api_host()


async def test_a_sync_with_the_last_token_acknowledges_the_last_page_although_nothing_is_new(api):
    await api.send("D", {"n": 1})
    first, since = await api.sync("D")
    assert first == [{"n": 1}]
    await api.send("D", {"n": 2})
    second, since = await api.sync("D", since, wait=True)
    assert second == [{"n": 2}]

    # Nothing is new for the stream: its hook used to be skipped, so message 2 stayed for ever.
    nothing, after = await api.sync("D", since)
    assert (nothing, after) == ([], since)
    assert await api.inbox("D") == []
    again, _ = await api.sync("D")
    assert again == []


async def test_a_sync_without_since_acknowledges_nothing_and_gets_the_whole_inbox_again(api):
    for n in range(3):
        await api.send("D", {"n": n})
    first, since = await api.sync("D")
    assert first == [{"n": 0}, {"n": 1}, {"n": 2}]

    # The reference's initial sync: the device lost its token (or never had one). Nothing is
    # deleted, everything still pending comes again, oldest first; and so again.
    again, _ = await api.sync("D")
    assert again == first
    assert len(await api.inbox("D")) == 3
    once_more, since = await api.sync("D")
    assert once_more == first

    # A token at or past them, whichever response minted it, acknowledges them.
    assert await api.sync("D", since) == ([], since)
    assert await api.inbox("D") == []
    assert (await api.sync("D"))[0] == []


async def test_a_token_moved_without_the_device_acknowledges_nothing_and_the_messages_come_at_once(api):
    await api.send("D", {"n": 1})
    # A sync that names no device gets no to-device messages, but its token moves past them.
    response = await api.bob.get("/sync", params={"timeout": "0"})
    assert response.json()["streams"] == {}
    since = response.json()["next_batch"]

    due, at = await api.sync("D", since)
    assert due == [{"n": 1}]
    assert at == since  # delivered at the client's own token, claiming no range
    assert await api.sync("D", at) == ([], at)
    assert await api.inbox("D") == []


async def test_an_idle_devices_syncs_make_no_query_and_a_new_message_is_still_seen(api, bundled_db):
    await api.send("D", {"n": 1})
    _, since = await api.sync("D")
    _, since = await api.sync("D", since)  # acknowledges: the inbox is empty, and this host knows it
    assert await api.inbox("D") == []
    for n in range(3):  # the stream moves, for someone else
        other = await api.alice.put(f"/sendToDevice/m.test/c{n}", json={"messages": {"@carol:hs": {"X": {}}}})
        assert other.status_code == 200
    # Any statement on the inbox tables would now wait for this lock, and the syncs time out.
    with psycopg.connect(libpq_url(bundled_db)) as conn:
        conn.execute("LOCK TABLE device_inbox, device_inbox_delivered IN ACCESS EXCLUSIVE MODE")
        for _ in range(20):
            assert await asyncio.wait_for(api.sync("D", since), 5) == ([], since)
        conn.rollback()

    await api.send("D", {"n": 2})
    assert (await api.sync("D", since, wait=True))[0] == [{"n": 2}]


async def test_a_message_replicated_to_a_device_known_to_be_empty_is_delivered(host_cluster, api_host, api):
    worker = await api_host("worker1")
    await host_cluster.following(worker.host, "to_device")
    _, since = await worker.sync("D")
    assert await worker.sync("D", since) == ([], since)  # the worker now knows D's inbox is empty

    await api.send("D", {"n": 1})  # written by main, replicated to the worker
    assert (await worker.sync("D", since, wait=True))[0] == [{"n": 1}]


async def test_a_page_cut_at_the_limit_hides_nothing_of_a_writer_it_did_not_reach(host_cluster, api_host):
    writers = ("main", "worker1")
    main = await api_host("main", writers, sync_limit=2)
    worker = await api_host("worker1", writers, sync_limit=2)
    await host_cluster.following(worker.host, "to_device")
    for n in range(3):
        await main.send("D", {"n": n})
    await worker.send("D", {"n": 3})  # after main's three in the shared sequence
    written = worker.host.id_generator("to_device").get_current_token_for_writer("worker1")
    assert await main.host.wait_for_stream_position("worker1", "to_device", written)

    first, since, limited = await main.sync_page("D", None)
    assert (first, limited) == ([{"n": 0}, {"n": 1}], True)
    # The page held nothing of worker1: its message is still to come, after main's last.
    rest, since, _ = await main.sync_page("D", since)
    assert rest == [{"n": 2}, {"n": 3}]
    assert (await main.sync("D", since))[0] == []
    assert await main.inbox("D") == []


# -- the invariant, over random sequences of sends and syncs ---------------------------------------------

LIMIT = 3
#: ("send",) | ("sync", token) | ("peek", token): a sync for the device, or one naming no device (its
#: token moves past messages it does not deliver). ``token``: None for no ``since``, else an index
#: into the tokens given out so far (the latest or any stale one).
TOKEN = st.one_of(st.none(), st.integers(min_value=0, max_value=40))
STEP = st.one_of(
    st.tuples(st.just("send"), st.none()),
    st.tuples(st.just("sync"), TOKEN),
    st.tuples(st.just("peek"), TOKEN),
)


async def test_every_message_is_delivered_until_a_token_at_or_past_it_acknowledges_it_and_never_after(api_host):
    """The model: which messages the device received (``delivered``) and acknowledged (``acked``).

    A sync for the device with ``since`` first acknowledges every delivered message at or below the
    token's position; without ``since`` it acknowledges nothing (the reference's initial sync). It then
    returns the oldest messages not acknowledged, at most ``LIMIT``: those at or below the token when
    there are any (owed at the client's own token), else all of them. A sync naming no device returns
    none and acknowledges nothing.
    """
    api = await api_host(sync_limit=LIMIT)
    loop = asyncio.get_running_loop()
    examples = iter(range(10**6))

    async def run(steps: list[tuple[str, int | None]]) -> None:
        device = f"D{next(examples)}"
        sent: list[tuple[int, int]] = []  # (message number, stream ID), in stream order
        acked: set[int] = set()
        delivered: set[int] = set()
        tokens: list[tuple[str, int]] = []  # (next_batch, its to-device position)
        for kind, pick in steps:
            if kind == "send":
                await api.send(device, {"n": len(sent)})
                sent.append((len(sent), api.host.id_generator("to_device").get_current_token()))
                continue
            since = tokens[pick % len(tokens)] if pick is not None and tokens else None
            if kind == "peek":
                items, next_batch, _ = await api.sync_page(None, since[0] if since else None)
                assert items == []
            else:
                if since is not None:
                    acked |= {n for n, at in sent if n in delivered and at <= since[1]}
                pending = [(n, at) for n, at in sent if n not in acked]
                owed = [(n, at) for n, at in pending if since is not None and at <= since[1]]
                expected = [{"n": n} for n, _ in (owed or pending)[:LIMIT]]
                items, next_batch, limited = await api.sync_page(device, since[0] if since else None, bool(expected))
                assert items == expected, (steps, kind, since)
                assert limited == (len(expected) == LIMIT)
                if owed:
                    assert next_batch == since[0]
                delivered |= {item["n"] for item in items}
            tokens.append((next_batch, await api.position(next_batch)))
        assert await api.inbox(device) == [{"n": n} for n, _ in sent if n not in acked]

    @settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
    @given(st.lists(STEP, min_size=1, max_size=16))
    def check(steps: list[tuple[str, int | None]]) -> None:
        # hypothesis runs the body synchronously; run each example on this test's loop.
        asyncio.run_coroutine_threadsafe(run(steps), loop).result(60)

    await asyncio.to_thread(check)
