"""The reader pipeline's order, seen by a plugin: invalidate caches, then the rows handlers, then
advance, then wake.

And a writer's own rows take the same pipeline, from memory: the rows handlers with ``local=True``, in
token order, once each, with the stream's invalidations already applied.
"""

from __future__ import annotations

import asyncio
import importlib

import pytest

from factstream.testing import until

PROBE = """
    import factstream
    from factstream import CacheSpec, InvalidationSpec, RowsHandlerSpec
    from factstream_notes import NOTES_STREAM

    #: (host, writer, token, authors, local, what the cache held for each author inside the handler)
    seen = []

    @factstream.hookimpl
    def register_caches(register):
        register(CacheSpec(name="note_authors", max_size=1000))

    @factstream.hookimpl
    def register_invalidations(register):
        register(InvalidationSpec(stream="notes", cache="note_authors", keys=lambda row: [(row.author,)]))

    def remember_notes(host, instance, token, rows, local):
        cache = host.caches.get("note_authors")
        held = [cache.get((r.author,), "absent") for r in rows]
        seen.append((host.instance_name, instance, token, [r.author for r in rows], local, held))

    @factstream.hookimpl
    def register_rows_handlers(register):
        register(RowsHandlerSpec(stream=NOTES_STREAM, handler=remember_notes))
"""


@pytest.fixture
def probe(plugin_installer, notes_db):
    plugin_installer.from_source("pipeline_probe", PROBE)
    return importlib.import_module("factstream_pipeline_probe")


def _stale(host, authors):
    """Put a stale entry for every author in the host's cache, as a read before the write would."""
    cache = host.caches.get("note_authors")
    for author in authors:
        cache.set((author,), "stale")


async def _write(host, authors, *, per_txn=1):
    notes = importlib.import_module("factstream_notes")
    writer = host.api.stream("notes", notes.NoteRow)
    ids = []
    for start in range(0, len(authors), per_txn):
        async with host.database().transaction() as txn:
            chunk = authors[start : start + per_txn]
            rows = [notes.NoteRow(a) for a in chunk]
            ids += await writer.append_many(txn, rows, columns=[{"body": f"by {a}"} for a in chunk])
    return ids


async def test_a_rows_handler_and_a_waiter_after_the_advance_both_see_the_invalidation(probe, host_cluster):
    main = await host_cluster("main")
    worker = await host_cluster("worker1")
    await host_cluster.following(worker, "notes")
    authors = [f"@a{i}:hs" for i in range(40)]
    _stale(worker, authors)

    ids = await _write(main, authors, per_txn=3)
    assert await worker.wait_for_stream_position("main", "notes", ids[-1], timeout=10)
    # The waiter woke after the advance: every entry is gone, none came back.
    cache = worker.caches.get("note_authors")
    assert [cache.get((a,), "absent") for a in authors] == ["absent"] * len(authors)

    replicated = [s for s in probe.seen if s[0] == "worker1"]
    assert [a for s in replicated for a in s[3]] == authors
    assert {s[4] for s in replicated} == {False}
    # Inside the handler the rows' entries were already invalidated.
    assert {h for s in replicated for h in s[5]} == {"absent"}
    tokens = [s[2] for s in replicated]
    assert tokens == sorted(tokens) and set(tokens) == set(ids)


async def test_a_writers_own_rows_reach_its_rows_handlers_locally_in_order_once(probe, host_cluster):
    main = await host_cluster("main")
    authors = [f"@w{i}:hs" for i in range(30)]
    _stale(main, authors)

    # Concurrent transactions: commits finish out of order, a handler must not see them so.
    chunks = [authors[i : i + 3] for i in range(0, len(authors), 3)]
    results = await asyncio.gather(*(_write(main, chunk, per_txn=3) for chunk in chunks))
    ids = sorted(i for r in results for i in r)
    # The invalidations ran at commit: the writer's next read is fresh.
    cache = main.caches.get("note_authors")
    assert [cache.get((a,), "absent") for a in authors] == ["absent"] * len(authors)

    await until(lambda: sum(len(s[3]) for s in probe.seen) == len(authors))
    await asyncio.sleep(0.2)  # nothing more arrives: once each
    local = [s for s in probe.seen if s[0] == "main"]
    assert {s[4] for s in local} == {True}
    assert {s[1] for s in local} == {"main"}
    tokens = [s[2] for s in local]
    assert tokens == ids  # in token order, each once
    assert sorted(a for s in local for a in s[3]) == sorted(authors)
    assert {h for s in local for h in s[5]} == {"absent"}


async def test_rows_of_a_rolled_back_transaction_never_reach_a_rows_handler(probe, host_cluster):
    main = await host_cluster("main")
    notes = importlib.import_module("factstream_notes")
    writer = main.api.stream("notes", notes.NoteRow)
    with pytest.raises(RuntimeError):
        async with main.database().transaction() as txn:
            await writer.append(txn, notes.NoteRow("@gone:hs"), columns={"body": "never"})
            raise RuntimeError("roll back")
    ids = await _write(main, ["@kept:hs"])
    await until(lambda: any(s[0] == "main" for s in probe.seen))
    await asyncio.sleep(0.2)
    assert [(s[2], s[3]) for s in probe.seen if s[0] == "main"] == [(ids[0], ["@kept:hs"])]


CHOOSY = """
    import factstream
    from factstream import RowsHandlerSpec
    from factstream_notes import NOTES_STREAM

    seen = []

    def handler(stream):
        def record(host, instance, token, rows, local):
            seen.append((host.instance_name, stream, local))

        return record

    @factstream.hookimpl
    def register_rows_handlers(register, streams):
        for spec in {STREAMS}:
            register(RowsHandlerSpec(stream=spec, handler=handler(spec.name)))
"""


async def test_a_rows_handler_gets_its_streams_rows_and_no_other_streams(plugin_installer, host_cluster):
    plugin_installer.from_source("choosy", CHOOSY.replace("{STREAMS}", "[NOTES_STREAM]"))
    plugin_installer.from_source("curious", CHOOSY.replace("{STREAMS}", "streams"))
    choosy = importlib.import_module("factstream_choosy")
    curious = importlib.import_module("factstream_curious")
    from factstream_events import EventsStore

    main = await host_cluster("main")
    worker = await host_cluster("worker1")
    await host_cluster.following(worker, "notes")
    await host_cluster.following(worker, "events")
    ids = await _write(main, ["@n1:hs", "@n2:hs"])
    store = main.api.state(EventsStore)
    room = await store.create_room("@alice:hs")
    await store.send(room, "@alice:hs", "m.room.message", {"msgtype": "m.text", "body": "hello"})
    await until(
        lambda: (
            {(h, s) for h, s, _ in curious.seen} >= {(i, s) for i in ("main", "worker1") for s in ("notes", "events")}
        )
    )
    assert await worker.wait_for_stream_position("main", "notes", ids[-1], timeout=10)
    # the plugin that registered a handler for every stream saw both in both processes; the choosy one only notes
    assert {(h, s, local) for h, s, local in choosy.seen} == {("main", "notes", True), ("worker1", "notes", False)}
    assert len([1 for h, s, _ in choosy.seen if s == "notes"]) == 2 * len(ids)


@pytest.mark.parametrize(
    ("register", "what"),
    [
        ('RowsHandlerSpec(stream="notes", handler=print)', "stream must be a StreamSpec, not 'notes'"),
        ("RowsHandlerSpec(stream=NOTES_STREAM, handler=42)", "handler must be callable"),
        ("NOTES_STREAM", "registered StreamSpec(name='notes'"),
    ],
)
async def test_a_bad_rows_handler_registration_stops_the_start_naming_the_plugin(
    plugin_installer, host_cluster, register, what
):
    source = CHOOSY.replace(
        "for spec in {STREAMS}:\n            register(RowsHandlerSpec(stream=spec, handler=handler(spec.name)))",
        f"register({register})",
    )
    plugin_installer.from_source("choosy", source)
    with pytest.raises(Exception, match="plugin 'choosy'") as failed:
        await host_cluster("main")
    assert "register_rows_handlers" in str(failed.value) and what in str(failed.value)
