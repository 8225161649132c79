"""Streams without a table (``StreamSpec(kept=True)``, issue 46 piece 1).

* ``KeptPositions``: positions of a run stay above every earlier run's (hypothesis, injected clock);
  a reader's view of a writer never goes back.
* A kept stream of an in-test plugin (``kv``: a dict on its writer, main) between two in-process hosts,
  over TCP and Redis: rows reach the reader's handler; a reader that missed rows catches up over HTTP
  (``GET /replication/kept/kv`` on main's ``instance_map`` http_port); a writer restart resets the
  reader's view before the new run's rows and wakes a waiting ``/sync``; the route's answers to bad
  requests and to unsigned ones under ``replication.secret``; a writer without an HTTP port.
"""

from __future__ import annotations

import asyncio
import importlib
import logging
from types import ModuleType
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from factstream.host.app import Host
from factstream.idgen.kept import KeptPositions
from factstream.replication.auth import ReplicationSecret
from factstream.replication.kept import SIGNATURE_HEADER
from factstream.testing import HostCluster, PluginInstaller, free_port, until
from factstream.testing.helpers import merge_config

# -- KeptPositions ----------------------------------------------------------------------------------

runs = st.lists(st.tuples(st.integers(0, 50), st.integers(0, 20)), min_size=1, max_size=12)


@settings(max_examples=300, deadline=None)
@given(runs=runs)
def test_every_position_of_a_run_is_above_every_position_of_earlier_runs(runs: list[tuple[int, int]]) -> None:
    """The clock never goes back (it may stand still); each run starts with the last position handed out
    as its floor, so even writes faster than the clock never let a later run go below an earlier one."""
    now, highest = 1_000, 0
    for step, writes in runs:
        now += step
        gen = KeptPositions(
            stream_name="kv", writers=["main"], instance_name="main", clock=lambda now=now: now, floor=highest
        )
        positions = [gen.next() for _ in range(writes)]
        assert gen.epoch > highest
        assert all(p > highest for p in positions)
        assert positions == sorted(set(positions))
        highest = max([highest, *positions])


@settings(max_examples=300, deadline=None)
@given(runs=runs)
def test_without_a_floor_runs_stay_ordered_when_the_clock_outpaces_the_writes(runs: list[tuple[int, int]]) -> None:
    """What a restarted writer relies on (it knows no floor): a run writes less than once per clock tick,
    so the next run's clock is past every position of the earlier ones."""
    now, highest = 1_000, 0
    for step, writes in runs:
        now = max(now + step, highest)  # the clock moved at least as far as the earlier runs wrote
        gen = KeptPositions(stream_name="kv", writers=["main"], instance_name="main", clock=lambda now=now: now)
        positions = [gen.next() for _ in range(writes)]
        assert all(p > highest for p in positions)
        highest = max([highest, *positions])


@settings(max_examples=300, deadline=None)
@given(advances=st.lists(st.tuples(st.sampled_from(["main", "worker1"]), st.integers(1, 10**12)), max_size=30))
def test_a_reader_s_view_of_a_writer_never_goes_back(advances: list[tuple[str, int]]) -> None:
    gen = KeptPositions(stream_name="kv", writers=["main", "worker1"], instance_name="worker2")
    assert gen.epoch == 0 and not gen.is_writer
    seen = {"main": 0, "worker1": 0}
    for writer, token in advances:
        gen.advance(writer, token)
        seen[writer] = max(seen[writer], token)
        assert gen.get_current_token_for_writer(writer) == seen[writer]
        assert gen.get_current_token() == min(seen.values())
    with pytest.raises(ValueError, match="wrong side of zero"):
        gen.advance("main", 0)


# -- a kept stream between hosts --------------------------------------------------------------------

KV_PLUGIN = """
import msgspec
import factstream
from factstream import RowsHandlerSpec, StreamSpec, Wake


class KvRow(msgspec.Struct, frozen=True):
    key: str
    value: str


class Facts:
    '''The writer's facts: key -> (position, value).'''

    def __init__(self, host):
        self.facts = {}

    def keeper(self, since, upto, limit):
        changes = sorted((p, k) for k, (p, v) in self.facts.items() if since < p <= upto)
        limited = len(changes) > limit
        if limited:
            changes = changes[:limit]
            upto = changes[-1][0]
        return [(p, KvRow(k, self.facts[k][1])) for p, k in changes], upto, limited


class View:
    '''What a process heard: every delivery in order, and resets, as ("rows"|"reset", ...) events.'''

    def __init__(self, host):
        self.events = []
        self.facts = {}
        self.epoch = 0

    def rows(self):
        return [(p, r.key, r.value) for kind, p, r in self.events if kind == "row"]


async def sync_kv(request):
    view = request.host.state(View)
    since, upto = max(request.since.values(), default=0), max(request.upto.values(), default=0)
    reset = [{"reset": view.epoch}] if 0 < since < view.epoch <= upto else []
    return reset + [{"key": k, "value": v} for k, (p, v) in sorted(view.facts.items()) if since < p <= upto]


KV = StreamSpec(name="kv", row_type=KvRow, tables=(), kept=True, sync_key="kv_key", sync_rows=sync_kv,
                wake=lambda row: Wake(users=("@alice:hs",)))


def put(host, key, value):
    writer = host.kept_stream("kv", KvRow)
    facts = host.state(Facts)
    position = writer.current_token() + 1
    facts.facts[key] = (position, value)
    assert writer.write([KvRow(key, value)]) == position
    return position


def on_rows(host, instance, position, rows, local):
    view = host.state(View)
    for row in rows:
        view.events.append(("row", position, row))
        view.facts[row.key] = (position, row.value)


def on_reset(host, writer, epoch):
    view = host.state(View)
    view.events.append(("reset", epoch, writer))
    view.facts.clear()
    view.epoch = epoch


@factstream.hookimpl
def register_streams(register):
    register(KV)


@factstream.hookimpl
def register_rows_handlers(register):
    register(RowsHandlerSpec(stream=KV, handler=on_rows, reset=on_reset))


@factstream.hookimpl
def startup(host):
    if host.writes("kv"):
        host.kept_stream("kv", KvRow, host.state(Facts).keeper)
"""

SECRET = "kept-stream-secret-0123"
TOKENS = {"tok-alice": {"user": "@alice:hs"}}


@pytest.fixture
def kv(plugin_installer: PluginInstaller) -> ModuleType:
    plugin = plugin_installer.from_source("kv", KV_PLUGIN)
    return importlib.import_module(plugin.module)


@pytest.fixture
def kv_cluster(kv: ModuleType, host_cluster: HostCluster) -> HostCluster:
    """main writes ``kv`` and serves HTTP on its instance_map port; worker1 reads."""
    return host_cluster.configure(
        instances=("main", "worker1"),
        stream_writers={"kv": ["main"]},
        instance_map={"main": {"http_port": free_port()}},
        http={"tokens": TOKENS},
    )


async def start_main(cluster: HostCluster, **overrides: Any) -> Host:
    """main, serving HTTP on its instance_map port."""
    port = cluster.config("main")["instance_map"]["main"]["http_port"]
    return await cluster("main", **merge_config({"http": {"port": port}}, overrides))


def rows_of(kv: ModuleType, host: Host) -> list[tuple[int, str, str]]:
    rows: list[tuple[int, str, str]] = host.api.state(kv.View).rows()
    return rows


async def pair(kv_cluster: HostCluster, transport: str, **overrides: Any) -> tuple[Host, Host]:
    kv_cluster.configure(transport=transport)
    main = await start_main(kv_cluster, **overrides)
    worker = await kv_cluster("worker1", **overrides)
    await kv_cluster.following(worker, "kv")
    return main, worker


@pytest.mark.parametrize("transport", ["tcp", "redis"])
async def test_rows_reach_the_reader_and_a_reader_that_missed_them_asks_the_writer(
    kv: ModuleType, kv_cluster: HostCluster, transport: str
) -> None:
    main, worker = await pair(kv_cluster, transport)
    first = kv.put(main.api, "a", "1")
    await until(lambda: rows_of(kv, worker) == [(first, "a", "1")], what="worker to get a")
    assert worker.streams["kv"].kept.epochs.get("main", 0) <= first  # type: ignore[union-attr]

    await worker.disconnect_replication()
    missed = [kv.put(main.api, "b", "2"), kv.put(main.api, "c", "3"), kv.put(main.api, "a", "4")]
    asked = worker.streams["kv"].kept.asked  # type: ignore[union-attr]
    await worker.connect_replication()
    # a's first value was replaced on the writer: the keeper answers each key's latest fact only
    caught_up = {"a": (missed[2], "4"), "b": (missed[0], "2"), "c": (missed[1], "3")}
    await until(lambda: worker.api.state(kv.View).facts == caught_up, what="catch-up")
    assert worker.streams["kv"].kept.asked > asked  # type: ignore[union-attr]
    # the one reset is the first contact's (it tells the reader the run's epoch), before any row
    events = worker.api.state(kv.View).events
    assert [e for e in events if e[0] == "reset"] == [events[0]] == [("reset", main.streams["kv"].kept.epoch, "main")]  # type: ignore[union-attr]
    positions = [p for p, _, _ in rows_of(kv, worker)]
    assert positions == sorted(positions)


async def long_poll(cluster: HostCluster, worker: Host) -> tuple[str, asyncio.Task[Any]]:
    alice = cluster.client(worker, "tok-alice", timeout=30)
    since = (await alice.get("/sync")).json()["next_batch"]
    poll = asyncio.ensure_future(alice.get("/sync", params={"since": since, "timeout": 20000}))
    await asyncio.sleep(0.3)
    assert not poll.done(), "the long poll answered before anything changed"
    return since, poll


@pytest.mark.parametrize("transport", ["tcp", "redis"])
async def test_a_writer_restart_resets_the_reader_before_the_new_run_and_wakes_its_long_polls(
    kv: ModuleType, kv_cluster: HostCluster, transport: str
) -> None:
    main, worker = await pair(kv_cluster, transport)
    old = kv.put(main.api, "a", "1")
    await until(lambda: worker.api.state(kv.View).facts == {"a": (old, "1")}, what="worker to get a")
    _, poll = await long_poll(kv_cluster, worker)
    old_epoch = main.streams["kv"].kept.epoch  # type: ignore[union-attr]

    await main.stop()
    main = await start_main(kv_cluster)
    epoch = main.streams["kv"].kept.epoch  # type: ignore[union-attr]
    assert epoch > old >= old_epoch
    # no row of the new run yet: only the reset wakes the poll
    answer = await asyncio.wait_for(poll, 10)
    assert answer.json()["streams"]["kv"] == [{"reset": epoch}]
    new = kv.put(main.api, "b", "2")
    await until(lambda: worker.api.state(kv.View).facts == {"b": (new, "2")}, what="worker to get b")
    assert await worker.wait_for_stream_position("main", "kv", new)

    events = worker.api.state(kv.View).events
    assert events[-2:] == [("reset", epoch, "main"), ("row", new, kv.KvRow("b", "2"))]
    assert ("row", old, kv.KvRow("a", "1")) in events[: events.index(("reset", epoch, "main"))]
    later = await kv_cluster.client(worker, "tok-alice").get("/sync", params={"since": answer.json()["next_batch"]})
    assert later.json().get("streams", {}).get("kv") == [{"key": "b", "value": "2"}]


def signed(cluster: HostCluster, target: str, secret: str = SECRET) -> dict[str, str]:
    """The header worker1 signs ``target`` with, knowing ``secret``."""
    signer = ReplicationSecret.from_settings(cluster.settings("worker1", replication={"secret": secret}))
    assert signer is not None
    return {SIGNATURE_HEADER: signer.sign_request("worker1", target)}


async def test_the_route_answers_only_signed_requests_for_the_kept_streams_it_writes(
    kv: ModuleType, kv_cluster: HostCluster
) -> None:
    main = await start_main(kv_cluster, replication={"secret": SECRET})
    first = kv.put(main.api, "a", "1")
    http = kv_cluster.client(main)
    path = "/replication/kept/kv"
    good = f"{path}?from=0&upto={first}&limit=10"

    assert (await http.get(good)).status_code == 403
    assert (await http.get(good, headers={SIGNATURE_HEADER: "worker1 00"})).status_code == 403
    assert (await http.get(good, headers=signed(kv_cluster, good, "another-secret-0123456789"))).status_code == 403
    assert (await http.get(good, headers=signed(kv_cluster, good.replace("from=0", "from=1")))).status_code == 403
    answer = await http.get(good, headers=signed(kv_cluster, good))
    assert answer.status_code == 200, answer.text
    assert answer.json() == {
        "epoch": main.streams["kv"].kept.epoch,  # type: ignore[union-attr]
        "updates": [[first, ["a", "1"]]],
        "upto": first,
        "limited": False,
    }
    for target in ("/replication/kept/nope?from=0&upto=1&limit=1", "/replication/kept/notes?from=0&upto=1&limit=1"):
        assert (await http.get(target, headers=signed(kv_cluster, target))).status_code == 404, target
    for query in (
        "from=x&upto=1&limit=1",
        "from=0&upto=1&limit=0",
        "from=0&upto=1&limit=10001",
        "from=5&upto=4&limit=1",
        "from=-1&upto=1&limit=1",
        "from=0&limit=1",
        f"from=0&upto={2**64}&limit=1",
    ):
        target = f"{path}?{query}"
        response = await http.get(target, headers=signed(kv_cluster, target))
        assert response.status_code == 400, (query, response.text)


async def test_a_reader_that_cannot_reach_the_writer_logs_it_resets_and_moves_on(
    kv: ModuleType, kv_cluster: HostCluster, caplog: pytest.LogCaptureFixture
) -> None:
    kv_cluster.configure(instance_map={"main": {"http_port": None}})
    main = await kv_cluster("main")
    kv.put(main.api, "a", "1")
    announced = kv.put(main.api, "b", "2")
    with caplog.at_level(logging.WARNING, logger="factstream.replication.kept"):
        worker = await kv_cluster("worker1")
        await kv_cluster.following(worker, "kv")
        await until(
            lambda: worker.streams["kv"].id_gen.get_current_token_for_writer("main") == announced, what="advance"
        )
    assert "cannot catch up on kept stream kv from main (instance_map gives 'main' no http_port)" in caplog.text
    assert worker.api.state(kv.View).events == [("reset", announced, "main")]
    later = kv.put(main.api, "c", "3")
    await until(lambda: worker.api.state(kv.View).facts == {"c": (later, "3")}, what="the next row")
