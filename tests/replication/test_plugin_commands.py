"""Commands a plugin handles (``CommandHandlerSpec``, issue 46 piece 2), between in-process hosts.

An in-test plugin (``presence``) handles ``USER_SYNC`` and ``CLEAR_USER_SYNC`` on the writers of its
kept stream ``pres``: each host logs what it handled, whom it forgot and resends what a test told it to.
"""

from __future__ import annotations

import importlib
from types import ModuleType

import pytest

from factstream import FactstreamError
from factstream.errors import ConfigError
from factstream.host.app import Host
from factstream.replication.wire import ClearUserSyncCommand, FederationAckCommand, UserSyncCommand
from factstream.testing import HostCluster, PluginInstaller, until

PLUGIN = """
import msgspec
import factstream
from factstream import ClearUserSyncCommand, CommandHandlerSpec, StreamSpec, UserSyncCommand


class Row(msgspec.Struct):
    user: str


PRES = StreamSpec(name="pres", row_type=Row, tables=(), kept=True)


class Log:
    def __init__(self, host):
        self.events = []
        self.resend = []


def handle(host, sender, command):
    host.state(Log).events.append((sender, command))


def forget(host, instance):
    host.state(Log).events.append(("forget", instance))


def resend(host):
    return list(host.state(Log).resend)


@factstream.hookimpl
def register_streams(register):
    register(PRES)


@factstream.hookimpl
def register_command_handlers(register):
    register(CommandHandlerSpec(command=UserSyncCommand, stream="pres", handler=handle, forget=forget, resend=resend))
    register(CommandHandlerSpec(command=ClearUserSyncCommand, stream="pres", handler=handle, forget=forget))
"""


@pytest.fixture(autouse=True)
def _without_the_bundled_presence(monkeypatch: pytest.MonkeyPatch) -> None:
    """The bundled presence plugin handles USER_SYNC itself: these tests' plugins take its place."""
    monkeypatch.setenv("FACTSTREAM_BLOCK_PLUGINS", "presence")


@pytest.fixture
def presence(plugin_installer: PluginInstaller) -> ModuleType:
    return importlib.import_module(plugin_installer.from_source("syncwatch", PLUGIN).module)


@pytest.fixture
def cluster(presence: ModuleType, host_cluster: HostCluster) -> HostCluster:
    return host_cluster.configure(instances=("main", "worker1", "worker2"), stream_writers={"pres": ["main"]})


def events(presence: ModuleType, host: Host) -> list[object]:
    found: list[object] = host.api.state(presence.Log).events
    return found


def syncing(instance: str, user: str, on: bool = True) -> UserSyncCommand:
    return UserSyncCommand(instance, user, "DEV", on, 1234)


async def test_over_tcp_a_worker_s_commands_reach_main_in_order_and_main_handles_its_own(
    presence: ModuleType, cluster: HostCluster
) -> None:
    main = await cluster("main")
    worker = await cluster("worker1")
    await cluster.following(worker, "pres")
    sent = [syncing("worker1", f"@u{i}:hs", i % 2 == 0) for i in range(20)] + [ClearUserSyncCommand("worker1")]
    for command in sent:
        worker.api.send_command(command)
    main.api.send_command(syncing("main", "@own:hs"))
    await until(lambda: len(events(presence, main)) == 22, what="main to handle 22 commands")
    assert [e for e in events(presence, main) if e[0] == "worker1"] == [("worker1", c) for c in sent]
    assert ("main", syncing("main", "@own:hs")) in events(presence, main)
    assert events(presence, worker) == []  # worker1 does not write pres: it handles nothing

    with pytest.raises(FactstreamError, match="speaks for itself, not 'worker2'"):
        worker.api.send_command(syncing("worker2", "@u:hs"))
    with pytest.raises(FactstreamError, match="no plugin handles FEDERATION_ACK"):
        worker.api.send_command(FederationAckCommand("worker1", 5))

    await worker.stop()
    await until(lambda: events(presence, main)[-1] == ("forget", "worker1"), what="main to forget worker1")
    forgets = [e for e in events(presence, main) if e[0] == "forget"]
    assert forgets == [("forget", "worker1"), ("forget", "worker1")]  # once per command it had heard


async def test_over_tcp_a_command_claiming_another_instance_closes_the_link(
    presence: ModuleType, cluster: HostCluster
) -> None:
    main = await cluster("main")
    worker = await cluster("worker1")
    await cluster.following(worker, "pres")
    worker.api.send_command(syncing("worker1", "@a:hs"))
    await until(lambda: len(events(presence, main)) == 1, what="the honest command")
    assert worker.transport is not None
    worker.transport.send(syncing("worker2", "@forged:hs"))  # past host.send_command's own check
    await until(lambda: ("forget", "worker1") in events(presence, main), what="main to drop worker1's link")
    assert all(e[0] != "worker2" for e in events(presence, main))


async def test_resend_runs_whenever_the_link_reconnects(presence: ModuleType, cluster: HostCluster) -> None:
    main = await cluster("main")
    worker = await cluster("worker1")
    await cluster.following(worker, "pres")
    worker.api.send_command(syncing("worker1", "@before:hs"))
    await until(lambda: len(events(presence, main)) == 1, what="the first command")
    worker.api.state(presence.Log).resend = [syncing("worker1", "@back:hs")]
    await worker.disconnect_replication()
    await worker.connect_replication()
    await until(lambda: ("worker1", syncing("worker1", "@back:hs")) in events(presence, main), what="resent")
    assert ("forget", "worker1") in events(presence, main)  # the dropped link was forgotten first
    assert events(presence, main).index(("forget", "worker1")) < events(presence, main).index(
        ("worker1", syncing("worker1", "@back:hs"))
    )


async def test_over_redis_the_stream_s_writer_on_a_worker_handles_and_forgets_a_closed_host(
    presence: ModuleType, cluster: HostCluster
) -> None:
    cluster.configure(transport="redis", stream_writers={"pres": ["worker2"]})
    main = await cluster("main")
    writer = await cluster("worker2")
    worker = await cluster("worker1")
    await cluster.following(worker, "pres")
    await cluster.following(main, "pres")
    worker.api.send_command(syncing("worker1", "@w:hs"))
    main.api.send_command(syncing("main", "@m:hs"))
    await until(lambda: len(events(presence, writer)) == 2, what="worker2 to handle both")
    assert sorted(events(presence, writer)) == [
        ("main", syncing("main", "@m:hs")),
        ("worker1", syncing("worker1", "@w:hs")),
    ]
    assert events(presence, main) == events(presence, worker) == []

    await worker.stop()  # its instance lease goes with its database session
    await until(lambda: ("forget", "worker1") in events(presence, writer), timeout=8, what="worker2 to forget worker1")
    assert ("forget", "main") not in events(presence, writer)


async def test_a_tcp_host_whose_handled_stream_is_not_written_by_main_refuses_to_start(
    presence: ModuleType, cluster: HostCluster
) -> None:
    with pytest.raises(ConfigError) as info:
        await cluster("main", stream_writers={"pres": ["worker1"]})
    assert "plugin 'syncwatch' handles" in str(info.value)
    assert "stream_writers.pres must be [main] (or use Redis)" in str(info.value)
