"""Acceptance with real processes: ``factstream run --instance main`` and ``--instance worker1`` over
TCP, with the bundled caches plugin and the demo store (tests/plugin_projects/cachedemo), whose driver runs
commands the test appends to a control file (``read`` through a cache, ``set`` a value, ...).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest

from factstream.testing import ProcessCluster, read_json_lines, wait_until

pytestmark = pytest.mark.slow

PLUGINS = Path(__file__).resolve().parents[1] / "plugin_projects"


class Pair:
    """main and worker1 as processes (a ``process_cluster``), and the demo driver's control file."""

    def __init__(self, cluster: ProcessCluster) -> None:
        self.cluster = cluster
        self.control = cluster.workdir / "control.jsonl"
        self.out = cluster.workdir / "control.jsonl.out"
        cluster.env["FACTSTREAM_CACHEDEMO_CONTROL"] = str(self.control)
        cluster.configure(stream_writers={"notes": ["main"]})
        self._n = 0

    def start(self) -> None:
        for name in ("main", "worker1"):
            self.cluster.start(name)
        # worker1 follows main once a write made on main shows up there.
        sid = self.ask("main", "set", key="warm-up", value="1")["stream_ids"][0]
        self.ask("worker1", "read", cache="demo_values", method="get_value", args=["warm-up"], wait_for=sid)

    def send(self, instance: str, op: str, **fields: Any) -> str:
        self._n += 1
        cid = f"c{self._n}"
        with open(self.control, "a", encoding="utf-8") as f:
            f.write(json.dumps({"id": cid, "instance": instance, "op": op, **fields}) + "\n")
        return cid

    def result(self, cid: str, timeout: float = 30.0) -> dict[str, Any]:
        def answered() -> dict[str, Any] | None:
            return next((r for r in read_json_lines(self.out) if r.get("id") == cid), None)

        answer: dict[str, Any] = wait_until(answered, timeout, f"an answer to {cid}", detail=self.cluster.logs)
        assert "error" not in answer, f"{cid} failed: {answer['error']}{self.cluster.logs()}"
        return answer

    def ask(self, instance: str, op: str, **fields: Any) -> dict[str, Any]:
        return self.result(self.send(instance, op, **fields))

    def read(self, method: str, *args: str, cache: str = "demo_values", wait_for: int | None = None) -> Any:
        return self.ask("worker1", "read", cache=cache, method=method, args=list(args), wait_for=wait_for)

    def keys(self) -> dict[str, set[tuple[str, ...]]]:
        return {name: {tuple(k) for k in keys} for name, keys in self.ask("worker1", "keys")["keys"].items()}

    def logs(self) -> str:
        return self.cluster.logs()


@pytest.fixture
def pair(plugin_installer, process_cluster) -> Pair:
    for project in ("notes", "probe", "cachedemo"):
        plugin_installer.from_project(PLUGINS / project)
    p = Pair(process_cluster)
    p.start()
    return p


@pytest.mark.serial  # asserts a time bound: run alone
def test_per_key_and_whole_cache_invalidation_reach_the_worker_process_within_a_round_trip(pair):
    pair.ask("main", "set", key="k", value="v1")
    sid = pair.ask("main", "set", key="other", value="o1")["stream_ids"][0]
    assert pair.read("get_value", "k", wait_for=sid)["value"] == "v1"
    assert pair.read("get_value", "other")["value"] == "o1"
    assert pair.read("get_value", "k")["hit"] is True

    watch = pair.send("worker1", "watch", cache="demo_values", key=["k"])
    time.sleep(0.2)  # the watcher is polling
    written = pair.ask("main", "set", key="k", value="v2")
    gone = pair.result(watch)

    assert gone["gone"] is True
    latency = gone["at"] - written["committed_at"]
    print(f"commit on main to key gone on worker1: {latency * 1000:.1f} ms")
    assert latency < 0.5
    assert ("other",) in pair.keys()["demo_values"], "a per-key invalidation must leave the other keys"
    read = pair.read("get_value", "k")
    assert (read["value"], read["hit"]) == ("v2", False)

    sid = pair.ask("main", "set_all", values={"k": "v3", "other": "o3"})["stream_ids"][0]
    assert pair.read("get_value", "other", wait_for=sid)["value"] == "o3"
    assert pair.read("get_value", "k")["value"] == "v3"


def test_a_room_state_change_of_120_members_clears_that_rooms_caches_in_the_worker_process_only(pair):
    members = [f"@u{i}:hs" for i in range(120)]
    for room in ("!r:hs", "!other:hs"):
        pair.read("get_room_members", room, cache="demo_room_members")
    for member in [*members[:60:7], "@bystander:hs"]:
        pair.read("get_member_rooms", member, cache="demo_member_rooms")
        for room in ("!r:hs", "!other:hs"):
            pair.read("get_member_profile", room, member, cache="demo_member_profile")
    before = pair.keys()

    ids = pair.ask("main", "room_state", room="!r:hs", members=members, values={"members:!r:hs": "120"})["stream_ids"]
    assert len(ids) == 3
    assert pair.read("get_value", "sentinel", wait_for=ids[-1])["value"] is None
    after = pair.keys()

    assert after["demo_room_members"] == {("!other:hs",)}
    assert after["demo_member_rooms"] == {("@bystander:hs",)}
    assert after["demo_member_profile"] == {("!r:hs", "@bystander:hs")} | {
        k for k in before["demo_member_profile"] if k[0] == "!other:hs"
    }
    assert pair.read("get_room_members", "!r:hs", cache="demo_room_members")["value"] == "120"


def test_a_worker_waiting_for_the_position_never_reads_stale_values_and_bad_rows_do_not_stop_the_stream(pair):
    bad = [("no_such_cache", ["x"]), ("demo_values", ["too", "many"]), ("demo_member_profile", ["!r:hs"])]
    for i in range(1, 31):
        assert pair.read("get_value", "k")["value"] in (None, str(i - 1))  # fill the cache
        if i % 10 == 0:
            cache_func, keys = bad[i // 10 - 1]
            pair.ask("main", "bad_row", cache_func=cache_func, keys=keys)
        sid = pair.ask("main", "set", key="k", value=str(i))["stream_ids"][0]
        assert pair.read("get_value", "k", wait_for=sid)["value"] == str(i)

    log = pair.cluster.processes["worker1"].log()
    assert log.count("skipped a caches-stream row") == 3, pair.logs()
    assert "no cache named 'no_such_cache'" in log
