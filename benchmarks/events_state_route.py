"""``GET /rooms/{room_id}/state`` of a 2,000-member room: the answer's size and the CPU time a request costs.

One host in this process (instance ``main``); a room written as a remote server writes it
(``events_storage.RemoteRoom``: room version 10, hashes, a signature, ``origin``), its creator and
2,000 members joined (remote batches of 100). The creator reads the room's current state through the
HTTP API (the ASGI application in this process, no socket): the size of the answer's body, and the
process CPU time (``time.process_time``) of each request: the first one (the read path's caches
empty, the state groups as the writes left them), and the median and p90 of ``samples`` requests
after three. PostgreSQL's own CPU time is not counted.

    uv run python benchmarks/events_state_route.py URL    # URL: a migrated database, as events_storage.py takes
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path

from events_storage import SERVER, RemoteRoom, persist, store_of

from factstream.testing import HostCluster

READER = f"@creator:{SERVER}"
TOKEN = "tok-reader"


async def measure(url: str, members: int = 2_000, samples: int = 30) -> str:
    """One line: the answer's size and the CPU time per request (median, p90)."""
    with tempfile.TemporaryDirectory(prefix="factstream-state-route-") as state:
        cluster = HostCluster(Path(state), database=url, instances=("main",))
        cluster.configure(http={"tokens": {TOKEN: {"user": READER}}})
        try:
            host = await cluster("main")
            room = RemoteRoom(READER)
            await persist(store_of(host), room.room_id, room.start())
            users = [f"@u{i}:{SERVER}" for i in range(members)]
            for start in range(0, members, 100):
                await persist(
                    store_of(host), room.room_id, [room.member(u, "join") for u in users[start : start + 100]]
                )
            client = cluster.client(host, TOKEN)
            cpu: list[float] = []
            size = 0
            for _ in range(samples + 3):
                started = time.process_time()
                r = await client.get(f"/rooms/{room.room_id}/state")
                cpu.append(time.process_time() - started)
                assert r.status_code == 200, r.text
                size = len(r.content)
            first, warm = cpu[0], sorted(cpu[3:])
            return (
                f"GET /state, {members + 1:,} members: {size / 1e6:.2f} MB ({size / (members + 5):.0f} bytes an event),"
                f" CPU {statistics.median(warm) * 1e3:.1f} ms median, {warm[int(len(warm) * 0.9)] * 1e3:.1f} ms p90"
                f" ({samples} requests after 3), the first request {first * 1e3:.1f} ms"
            )
        finally:
            await cluster.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("url", help="a migrated database (every plugin's branch, events included)")
    parser.add_argument("--members", type=int, default=2_000)
    parser.add_argument("--samples", type=int, default=30)
    args = parser.parse_args()
    print(asyncio.run(measure(args.url, args.members, args.samples)), flush=True)


if __name__ == "__main__":
    main()
