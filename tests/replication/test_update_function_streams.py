"""A stream with its own update function replicates its rows live, not only its position.

Such a stream's rows are not what the ID generator captures at the insert (the plugin builds them,
maybe from several tables), so its writer must read them back through the update function for a
connected reader. A regression here left readers advancing without ever seeing a row.
"""

from __future__ import annotations

import psycopg
import pytest

from factstream.db.engine import libpq_url
from factstream.testing import HostCluster, RowRecorder, until

SHADOW = """
    import msgspec

    import factstream
    from factstream import StreamSpec, StreamTable

    class ShadowRow(msgspec.Struct, frozen=True):
        kind: str
        data: tuple

    SELECT = (
        "SELECT stream_id, who FROM shadow WHERE instance_name = %(i)s AND stream_id > %(lo)s"
        " AND stream_id <= %(hi)s ORDER BY stream_id LIMIT %(n)s"
    )

    async def updates(db, instance, low, high, target):
        rows = await db.fetchall(SELECT, {"i": instance, "lo": low, "hi": high, "n": target})
        limited = len(rows) == target
        return [(int(t), ShadowRow("who", (w,))) for t, w in rows], int(rows[-1][0]) if limited else high, limited

    @factstream.hookimpl
    def register_streams(register):
        table = StreamTable("shadow", "instance_name", "stream_id")
        register(StreamSpec(name="shadow", row_type=ShadowRow, tables=(table,), update_function=updates))
"""

SCHEMA = [
    "DROP TABLE IF EXISTS shadow",
    "DROP SEQUENCE IF EXISTS shadow_seq",
    "CREATE SEQUENCE shadow_seq",
    "SELECT nextval('shadow_seq')",
    "CREATE TABLE shadow (stream_id bigint PRIMARY KEY, instance_name text NOT NULL, who text NOT NULL)",
]


@pytest.fixture
def shadow_db(notes_db, plugin_installer) -> str:
    plugin_installer.from_source("shadow", SHADOW)
    with psycopg.connect(libpq_url(notes_db), autocommit=True) as conn:
        for statement in SCHEMA:
            conn.execute(statement)
    return notes_db


async def test_rows_of_a_stream_with_its_own_update_function_reach_a_connected_reader(
    shadow_db, host_cluster: HostCluster, row_recorder: RowRecorder
):
    main = await host_cluster("main")
    worker = await host_cluster("worker1")
    await host_cluster.following(worker, "shadow")
    gen = main.id_generator("shadow")
    written = []
    for who in ("ada", "bob", "cy"):
        async with main.database().transaction() as txn:
            token = await gen.get_next_txn(txn)
            await txn.execute(
                "INSERT INTO shadow (stream_id, instance_name, who) VALUES (%(t)s, 'main', %(w)s)",
                {"t": token, "w": who},
            )
        written.append((token, who))
    await until(lambda: worker.id_generator("shadow").get_current_token_for_writer("main") == written[-1][0])
    received = [(r.token, r.row.data[0]) for r in row_recorder.rows("worker1", "shadow")]
    assert received == written
