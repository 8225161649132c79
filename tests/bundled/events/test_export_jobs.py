"""The events plugin's export jobs, run for real on local Spark over events two writers persisted.

Two in-process writers ``w1`` and ``w2`` of the ``events`` and ``backfill`` streams each write the
rooms that ``factstream_events.shared.sharding.writer_for`` gives them (remote histories, so the room IDs are
chosen), with a redaction, state changes, days apart, and backfilled older events. The jobs run
incrementally, through an interruption and ``--full``; every time, the output is checked against the
``events`` table: each event exactly once, every field, redacted events pruned, and ``room_daily``
merged over its ranges equal to the same counts computed here.
"""

from __future__ import annotations

import asyncio
import json
from collections import defaultdict
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import psycopg
import pytest
from factstream_events.shared.served import pruned_json
from factstream_events.shared.sharding import writer_for

from factstream.db.engine import libpq_url
from factstream.export import checkpoints
from factstream.export.output import JobOutput
from factstream.export.runner import ExportRunner
from factstream.export.watermark import persisted_upto, sequence_head
from factstream.plugin.manager import load_plugins
from factstream.testing import HostCluster, until
from tests.bundled.events.remote_history import RemoteRoom, persist
from tests.export import conftest as export_conftest

pytestmark = [pytest.mark.spark, pytest.mark.slow]

#: The session's local Spark (a fixture of tests/export).
spark = export_conftest.spark

WRITERS = ("w1", "w2")
CREATOR = "@zed:elsewhere"
BOB = "@bob:elsewhere"
DAY_MS = 86_400_000
#: The columns compared with the ``events`` table as they are (``json`` is checked on its own).
PLAIN = (
    "room_id",
    "event_id",
    "type",
    "sender",
    "state_key",
    "stream_ordering",
    "topological_ordering",
    "instance_name",
    "origin_server_ts",
    "received_ts",
    "outlier",
    "backfilled",
    "redacted",
    "redacts",
    "room_version",
)


class Killed(BaseException):
    """Stands for the process dying at an injected point (not an Exception: nothing catches it)."""


def rooms_of(writer: str, n: int) -> list[str]:
    """``n`` room IDs that ``writer`` owns among :data:`WRITERS`."""
    found: list[str] = []
    i = 0
    while len(found) < n:
        room_id = f"!export{i}:elsewhere"
        if writer_for(room_id, WRITERS) == writer:
            found.append(room_id)
        i += 1
    return found


class History:
    """One room's remote history: the events persisted so far, and older ones kept for backfill."""

    def __init__(self, room_id: str) -> None:
        self.room = RemoteRoom(room_id)
        self.room.create(CREATOR)
        self.room.add("m.room.member", BOB, {"membership": "join"}, state_key=BOB)
        # older history, persisted later as backfill (their children are persisted first)
        self.old = [self.room.add("m.room.message", BOB, {"msgtype": "m.text", "body": f"old {i}"}) for i in range(3)]
        self.sent = 0

    def more(self, n: int, *, next_day: bool = False) -> None:
        """``n`` messages (the first a day later with ``next_day``) and a topic change."""
        for i in range(n):
            depth = self.room.events[-1].depth + (DAY_MS if next_day and i == 0 else 1)
            self.room.add("m.room.message", CREATOR if i % 2 else BOB, {"body": f"m{i}"}, depth=depth)
        self.room.add("m.room.topic", CREATOR, {"topic": f"t{len(self.room.events)}"}, state_key="")


async def persist_new(host: Any, h: History, *, skip_old: bool = True) -> None:
    from factstream_events import EventsStore

    old = {b.event_id for b in h.old}
    new = [b for b in h.room.events[h.sent :] if not (skip_old and b.event_id in old)]
    await persist(host.api.state(EventsStore), h.room.room_id, new)
    h.sent = len(h.room.events)


def db_events(url: str, *, backfilled: bool) -> dict[str, dict[str, Any]]:
    """The ``events`` rows of one stream (with their stored JSON and room version), by event ID."""
    sign = "<" if backfilled else ">"
    with psycopg.connect(libpq_url(url)) as conn:
        cur = conn.execute(
            "SELECT e.room_id, e.event_id, e.type, e.sender, e.state_key, e.stream_ordering, e.topological_ordering,"
            " e.instance_name, e.origin_server_ts, e.received_ts, e.outlier, e.backfilled, e.redacted_by IS NOT NULL,"
            " e.redacts, r.room_version, j.json FROM events e JOIN event_json j USING (event_id)"
            f" JOIN rooms r ON r.room_id = e.room_id WHERE e.stream_ordering {sign} 0"
        )
        return {row[1]: dict(zip((*PLAIN, "raw"), row, strict=True)) for row in cur}


def exported(spark: Any, root: Path, job: str) -> list[dict[str, Any]]:
    """The job's rows, without the ``export_range`` partition column Spark adds."""
    return [r.asDict() for r in spark.read.parquet(str(root / job)).drop("export_range").collect()]


def check_events(spark: Any, root: Path, url: str, job: str, *, backfilled: bool, raw: bool) -> dict[str, Any]:
    """The job's output holds every event of its stream once, every field as stored; returns the rows."""
    expected = db_events(url, backfilled=backfilled)
    rows = exported(spark, root, job)
    ids = [r["event_id"] for r in rows]
    assert len(ids) == len(set(ids)), f"{job}: an event exported twice"
    assert set(ids) == set(expected), f"{job}: missing {set(expected) - set(ids)}, extra {set(ids) - set(expected)}"
    for r in rows:
        want = expected[r["event_id"]]
        assert {c: r[c] for c in PLAIN} == {c: want[c] for c in PLAIN}
        stored = bytes(want["raw"])
        if raw or not want["redacted"]:
            assert r["json"] == stored.decode()
        else:
            assert r["json"] == pruned_json(stored, want["room_version"]).decode()
    return {r["event_id"]: r for r in rows}


def daily_from(events: dict[str, dict[str, Any]]) -> dict[tuple[str, str], tuple[int, int, int, list[str]]]:
    """``room_daily`` computed here: (events, messages, state changes, sorted senders) per room and day."""
    counts: dict[tuple[str, str], list[Any]] = defaultdict(lambda: [0, 0, 0, set()])
    for e in events.values():
        day = datetime.fromtimestamp(e["origin_server_ts"] / 1000, UTC).date().isoformat()
        c = counts[(e["room_id"], day)]
        c[0] += 1
        c[1] += e["type"] == "m.room.message"
        c[2] += e["state_key"] is not None
        c[3].add(e["sender"])
    return {k: (a, b, s, sorted(senders)) for k, (a, b, s, senders) in counts.items()}


def daily_exported(spark: Any, root: Path, job: str) -> dict[tuple[str, str], tuple[int, int, int, list[str]]]:
    """The job's ranges merged per room and day (counts summed, senders united)."""
    merged: dict[tuple[str, str], list[Any]] = defaultdict(lambda: [0, 0, 0, set()])
    for r in exported(spark, root, job):
        assert r["senders"] == len(r["sender_ids"])
        m = merged[(r["room_id"], r["day"].isoformat())]
        m[0] += r["events"]
        m[1] += r["messages"]
        m[2] += r["state_changes"]
        m[3] |= set(r["sender_ids"])
    return {k: (a, b, s, sorted(senders)) for k, (a, b, s, senders) in merged.items()}


def ranges(root: Path, job: str) -> list[str]:
    return sorted(p.name for p in (root / job).glob("export_range=*"))


async def test_events_jobs_export_each_event_once_across_two_writers_backfill_interruptions_and_full(
    host_cluster: HostCluster, tmp_path: Path, spark: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    host_cluster.configure(instances=WRITERS, stream_writers={"events": list(WRITERS), "backfill": list(WRITERS)})
    hosts = {w: await host_cluster(w) for w in WRITERS}
    histories = {w: [History(r) for r in rooms_of(w, 2)] for w in WRITERS}
    url = hosts["w1"].database().url
    plugins = load_plugins()
    out = tmp_path / "out"
    out.mkdir()
    runner = ExportRunner(spark, plugins, url, out.as_uri())

    def run(job: str, **kwargs: Any) -> Any:
        return asyncio.to_thread(runner.run, plugins.registry.export_jobs.get(job), **kwargs)

    def settled() -> bool:
        """Both streams' watermarks reached their sequence heads: the writers have persisted their
        positions (every 0.1 s), so an export now reads every event written so far."""
        plans = [runner.plan(plugins.registry.export_jobs.get(j)) for j in ("events", "events_backfilled")]
        with psycopg.connect(libpq_url(url)) as conn:
            return all(persisted_upto(conn, plan) >= sequence_head(conn, plan) for plan in plans)

    # 1. both writers persist their rooms; one message is redacted; everything is exported
    for w, hs in histories.items():
        for h in hs:
            h.more(4)
            await persist_new(hosts[w], h)
    h0 = histories["w1"][0]
    secret = h0.room.add("m.room.message", BOB, {"msgtype": "m.text", "body": "the secret"})
    h0.room.add("m.room.redaction", CREATOR, {}, redacts=secret.event_id)
    await persist_new(hosts["w1"], h0)
    await until(settled, 10, "the events watermarks to reach the sequence heads")
    for job in ("events", "events_raw", "room_daily"):
        assert (await run(job)).status == "exported"
    check_events(spark, out, url, "events", backfilled=False, raw=False)
    assert (await run("events_backfilled")).rows == 0

    # 2. more events a day later on both writers, and backfill of older history on both
    for w, hs in histories.items():
        for h in hs:
            h.more(3, next_day=True)
            await persist_new(hosts[w], h)
            await persist(hosts[w].api.state(_store()), h.room.room_id, h.old, backfill=True)
    await until(settled, 10, "the events watermarks to reach the sequence heads")
    # ... exported by runs that die: between the commit and the checkpoint, and before the commit
    with monkeypatch.context() as m:
        m.setattr(checkpoints, "advance", _die)
        with pytest.raises(Killed):
            await run("events")
    with monkeypatch.context() as m:
        m.setattr(JobOutput, "commit", _die)
        with pytest.raises(Killed):
            await run("events_backfilled")
    recovered = await run("events")
    assert (recovered.status, len(recovered.adopted)) == ("recovered", 1)
    assert (await run("events_backfilled")).status == "exported"
    for job in ("events_raw", "room_daily", "room_daily_backfilled", "events_raw_backfilled"):
        assert (await run(job)).status == "exported"

    # 3. more events, an incremental run of every job (nothing new for the backfill jobs: no new range)
    backfilled_ranges = ranges(out, "events_backfilled")
    for w, hs in histories.items():
        for h in hs:
            h.more(2)
            await persist_new(hosts[w], h)
    await until(settled, 10, "the events watermarks to reach the sequence heads")
    for job in ("events", "events_raw", "room_daily"):
        assert (await run(job)).status == "exported"
    for job in ("events_backfilled", "events_raw_backfilled", "room_daily_backfilled"):
        assert (await run(job)).status == "up to date"
    assert len(ranges(out, "events")) == 3 and ranges(out, "events_backfilled") == backfilled_ranges

    rows = check_events(spark, out, url, "events", backfilled=False, raw=False)
    raw_rows = check_events(spark, out, url, "events_raw", backfilled=False, raw=True)
    back = check_events(spark, out, url, "events_backfilled", backfilled=True, raw=False)
    check_events(spark, out, url, "events_raw_backfilled", backfilled=True, raw=True)
    # each writer's rooms, by that writer; backfilled events on the backfill stream only
    for r in (*rows.values(), *back.values()):
        assert r["instance_name"] == writer_for(r["room_id"], WRITERS)
    assert {r["instance_name"] for r in rows.values()} == set(WRITERS)
    assert len(back) == 3 * 4 and all(r["backfilled"] and r["stream_ordering"] < 0 for r in back.values())
    assert not set(back) & set(rows)
    # the redacted message: pruned in events, as stored in events_raw
    assert rows[secret.event_id]["redacted"] and "the secret" not in rows[secret.event_id]["json"]
    assert json.loads(rows[secret.event_id]["json"])["content"] == {}
    assert "the secret" in raw_rows[secret.event_id]["json"]
    # room_daily: per room and day, equal to the counts over the same events (two days per room)
    db = db_events(url, backfilled=False)
    assert daily_exported(spark, out, "room_daily") == daily_from(db)
    assert {day for _, day in daily_from(db)} == {"2020-09-13", "2020-09-14"}
    assert daily_exported(spark, out, "room_daily_backfilled") == daily_from(db_events(url, backfilled=True))

    # 4. --full: everything again, once, in one range
    full = await run("events", full=True)
    assert (full.start, full.status) == (0, "exported")
    assert len(ranges(out, "events")) == 1
    assert check_events(spark, out, url, "events", backfilled=False, raw=False) == rows


def _store() -> Any:
    from factstream_events import EventsStore

    return EventsStore


def _die(*args: Any, **kwargs: Any) -> None:
    raise Killed("injected")
