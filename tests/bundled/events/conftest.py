"""Fixtures of the events plugin's tests: hosts on a database migrated for every installed plugin (so
``events`` too), users with bearer tokens, and the plugin's Python API on a host."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable

import httpx
import pytest
from factstream_events import EventsStore
from factstream_events.read.reads import Reads

from factstream.host.app import Host
from factstream.plugin.manager import load_plugins
from factstream.testing import HostCluster

USERS = ("@alice:hs", "@bob:hs", "@carol:hs", "@dave:hs", "@eve:hs")
#: A token that may call writer routes (remote events, backfill): the "server".
SERVER_TOKEN = "tok-server"


def token_of(user: str) -> str:
    return "tok-" + user.strip("@").replace(":", "-")


TOKENS = {token_of(u): {"user": u} for u in USERS} | {SERVER_TOKEN: {"user": "@server:hs", "write": True}}


@pytest.fixture(autouse=True)
def _events_plugin_installed() -> None:
    if "events" not in load_plugins().registry.streams.names():
        pytest.skip("the bundled events plugin is not installed (uv sync --all-packages)")


@pytest.fixture
async def main(host_cluster: HostCluster) -> Host:
    """One host, ``main``, writing ``events`` and ``backfill``, accepting the tokens of :data:`USERS`."""
    host_cluster.configure(http={"tokens": TOKENS})
    return await host_cluster("main")


@pytest.fixture(scope="module")
async def module_cluster(module_database: str, tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[HostCluster]:
    """A host cluster of a whole test module on ``module_database``, its ``main`` started as :func:`main`
    starts it: for tests that only read or are refused, each in rooms of its own (a host and a database
    per test cost 1-3 s of set-up on a loaded machine, more than most such tests take)."""
    cluster = HostCluster(tmp_path_factory.mktemp("module-hosts"), database=module_database)
    cluster.configure(http={"tokens": TOKENS})
    await cluster("main")
    try:
        yield cluster
    finally:
        await cluster.close()


@pytest.fixture
def module_main(module_cluster: HostCluster) -> Host:
    """The module's ``main`` (:func:`module_cluster`)."""
    return module_cluster.started[0]


@pytest.fixture
def module_client(module_cluster: HostCluster, module_main: Host) -> Callable[[str], httpx.AsyncClient]:
    """:func:`client` of the module's ``main``."""
    return clients_of(module_cluster, module_main)


def store_of(host: Host) -> EventsStore:
    return host.api.state(EventsStore)


def reads_of(host: Host) -> Reads:
    return host.api.state(EventsStore).reads


@pytest.fixture
def client(host_cluster: HostCluster, main: Host) -> Callable[[str], httpx.AsyncClient]:
    """``client(user)``: an HTTP client of ``main`` with ``user``'s token (``"server"``: the writer token)."""
    return clients_of(host_cluster, main)


def clients_of(cluster: HostCluster, host: Host) -> Callable[[str], httpx.AsyncClient]:
    """``make(user)``: an HTTP client of ``host`` with ``user``'s token (``"server"``: the writer token)."""
    return lambda user: cluster.client(host, SERVER_TOKEN if user == "server" else token_of(user))


async def main_and_worker(host_cluster: HostCluster, transport: str) -> tuple[Host, Host]:
    """``main`` (the events writer) and ``worker1`` following its ``events`` stream over ``transport``."""
    host_cluster.configure(transport=transport, http={"tokens": TOKENS})
    main = await host_cluster("main")
    worker = await host_cluster("worker1")
    await host_cluster.following(worker, "events")
    return main, worker


async def caught_up(main: Host, worker: Host) -> int:
    """Wait until the worker has reached main's events position; returns it."""
    position = main.id_generator("events").get_current_token()
    assert await worker.api.wait_for_stream_position("main", "events", position, timeout=10)
    return position
