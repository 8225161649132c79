"""Forged replication commands against real ``factstream run`` processes (main and worker1).

Defect 1 of issue 15: a raw client that named itself ``x`` sent ``RDATA notes main 900000``; main
relayed it, worker1's position for main jumped to 900000 and real facts written afterwards were
dropped as already seen. Defect 2: ``POSITION notes forger 0 50`` moved main's own watermark to 50,
and main's next append failed ("stream ID 4 handed out twice"). Over Redis the same lines are
published on the deployment's channel by a client that does not know ``replication.secret``.
"""

from __future__ import annotations

import socket
import time
from pathlib import Path

import psycopg
import pytest
import yaml

from factstream.db.engine import libpq_url
from tests.replication.test_processes import Cluster, start_pair

pytestmark = pytest.mark.slow

SECRET = "a long random replication secret"


def with_secret(path: Path) -> Path:
    data = yaml.safe_load(path.read_text())
    data["replication"] = {"secret": SECRET}
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def send_raw(port: int, lines: list[bytes]) -> list[str]:
    """Send lines to main's replication port; what it answered until it closed the connection."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        sock.sendall(b"".join(lines))
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    return data.decode(errors="replace").splitlines()


def positions_in_database(cluster: Cluster) -> dict[str, int]:
    with psycopg.connect(libpq_url(cluster.database_url), autocommit=True) as conn:
        rows = conn.execute("SELECT instance_name, stream_id FROM stream_positions WHERE stream_name = 'notes'")
        positions = {str(r[0]): int(r[1]) for r in rows.fetchall()}
        last = conn.execute("SELECT last_value FROM notes_seq").fetchone()
    positions["(sequence)"] = int(last[0]) if last else 0
    return positions


def test_forged_rdata_and_position_over_tcp_are_refused_and_the_worker_keeps_every_fact(cluster):
    config = cluster.config("main")
    start_pair(cluster, config, config)
    cluster.write_and_wait(10)

    forged_rdata = send_raw(cluster.main_port, [b"NAME x\n", b"PING 1\n", b'RDATA notes main 900000 ["eve"]\n'])
    forged_position = send_raw(cluster.main_port, [b"NAME forger\n", b"POSITION notes forger 0 50\n"])

    assert forged_rdata[-1] == "ERROR RDATA notes main: main is this process's own instance name", forged_rdata
    assert forged_position[-1].startswith("ERROR POSITION notes forger: instance forger is not configured"), (
        forged_position
    )
    ack = cluster.write_and_wait(50)  # failed with "handed out twice (watermark 50)" before
    assert ack["status"] == "done"
    cluster.wait_until_worker_has_everything()  # "eve" would be a recorded token not in the table
    assert len(cluster.recorded()) == 61
    time.sleep(1.5)  # positions are persisted lazily
    positions = positions_in_database(cluster)
    assert "forger" not in positions
    assert positions["main"] <= positions["(sequence)"]


def test_forged_messages_over_redis_are_dropped_with_a_secret_and_the_worker_keeps_every_fact(cluster, redis_server):
    config = with_secret(cluster.config("main", redis_url=redis_server.url))
    start_pair(cluster, config, config)
    cluster.write_and_wait(10)

    client = redis_server.client()
    client.publish(cluster.deployment, b'RDATA notes main 900000 ["eve"]')
    client.publish(cluster.deployment, b"POSITION notes forger 0 50")
    client.publish(cluster.deployment, b"POSITION notes main 0 900000")

    ack = cluster.write_and_wait(50)
    assert ack["status"] == "done"
    cluster.wait_until_worker_has_everything()
    assert len(cluster.recorded()) == 61
    worker_log = cluster.processes["worker1"].log()
    assert "without a valid signature" in worker_log
    time.sleep(1.5)
    positions = positions_in_database(cluster)
    assert "forger" not in positions
    assert positions["main"] <= positions["(sequence)"]


def test_a_worker_without_the_secret_gets_nothing_from_a_main_that_has_one(cluster):
    main_config = with_secret(cluster.config("main"))
    worker_config = cluster.config("worker1")
    main = cluster.main(main_config)
    main.wait_started()
    worker = cluster.worker(worker_config)
    worker.wait_started()

    cluster.write_and_wait(20)
    time.sleep(1.0)

    assert cluster.recorded() == []
    assert "replication.secret is not set on this instance" in worker.log() or "authentication required" in (
        worker.log()
    ), worker.tail()
