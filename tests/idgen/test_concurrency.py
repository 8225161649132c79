"""Several OS processes write one stream concurrently; a reader never skips or repeats a fact.

The reader knows only what the database says: it starts a fresh generator (as a process restarting
would) and reads the rows in ``(last watermark, current watermark]``. Writers hold transactions open
for random moments, roll back one fact in five, and one of them is killed with SIGKILL in the middle
of its work and restarted.
"""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from sqlalchemy import text

from factstream.db.database import Database
from factstream.idgen.generator import MultiWriterIdGenerator
from factstream.idgen.leases import WriterLeases

WRITER = Path(__file__).with_name("writer_process.py")
WRITERS = ["w1", "w2", "w3"]


def spawn(url: str, instance: str, seconds: float, seed: int) -> subprocess.Popen[str]:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    proc = subprocess.Popen(
        [sys.executable, str(WRITER), url, instance, ",".join(WRITERS), str(seconds), str(seed)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == "ready", proc.stderr.read() if proc.stderr else ""
    return proc


async def read_watermark(db: Database) -> int:
    leases = WriterLeases(db)
    gen = MultiWriterIdGenerator(
        db,
        stream_name="facts",
        sequence_name="facts_seq",
        tables=[("facts", "instance_name", "stream_id")],
        writers=WRITERS,
        instance_name="reader",
        leases=leases,
    )
    await gen.start()
    await leases.close()
    return gen.get_current_token()


@pytest.mark.slow
async def test_reader_sees_every_committed_fact_exactly_once_across_a_sigkill(stream_db):
    db = Database.from_url(stream_db, instance_name="reader")
    procs = {name: spawn(stream_db, name, 6.0, seed) for seed, name in enumerate(WRITERS)}
    seen: list[int] = []
    last = 1
    killed = restarted = False
    loop = asyncio.get_running_loop()
    start = loop.time()
    try:
        while any(p.poll() is None for p in procs.values()) or not restarted:
            now = loop.time() - start
            if not killed and now > 2.0:
                procs["w2"].send_signal(signal.SIGKILL)
                procs["w2"].wait()
                killed = True
            if killed and not restarted and now > 3.0:
                procs["w2"] = spawn(stream_db, "w2", 2.5, 99)
                restarted = True
            current = await read_watermark(db)
            if current > last:
                rows = await db.fetchall(
                    text("SELECT stream_id FROM facts WHERE stream_id > :a AND stream_id <= :b"),
                    {"a": last, "b": current},
                )
                seen += [r[0] for r in rows]
                last = current
            await asyncio.sleep(0.01)
        # Everyone has stopped: whatever is left is now below a final watermark.
        current = await read_watermark(db)
        tail = [r[0] for r in await db.fetchall("SELECT stream_id FROM facts WHERE stream_id > %(a)s", {"a": last})]
        everything = [r[0] for r in await db.fetchall("SELECT stream_id FROM facts")]
    finally:
        for p in procs.values():
            if p.poll() is None:
                p.kill()
        await db.close()

    outputs = {name: p.stdout.read() if p.stdout else "" for name, p in procs.items()}
    rolled_back = {
        int(line.split()[1]) for out in outputs.values() for line in out.splitlines() if line.startswith("rollback")
    }
    assert all(p.returncode == 0 for name, p in procs.items()), {
        n: p.stderr.read() for n, p in procs.items() if p.stderr
    }
    assert len(everything) > 200  # the writers really wrote concurrently
    assert max(tail, default=0) <= current
    assert len(seen) == len(set(seen)), "a fact was read twice"
    assert sorted(seen + tail) == sorted(everything), "a committed fact was skipped"
    assert not set(seen) & rolled_back
    assert len(tail) < len(everything) / 4, "the reader should mostly keep up while writers run"
