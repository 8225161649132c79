"""``factstream run`` starting and stopping as real processes (issue 33).

A start that fails (another process already runs the instance, the HTTP or the replication port is
taken) closes what it opened and exits at once with its error and exit code 2: it used to hang in
about one try in four, after ``WARNING psycopg.pool: error connecting``, in ``asyncio.run``'s
cancellation of the pool's reconnection task, deaf to SIGTERM and Ctrl-C. So each failing start is
tried several times. A signal during the start-up stops it; Ctrl-C exits 130, SIGTERM 0.
"""

from __future__ import annotations

import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest

from factstream.testing import FactstreamProcess, PluginInstaller, ProcessCluster, free_port, wait_until
from tests.host.conftest import INBOX_PROJECT

pytestmark = pytest.mark.slow

#: How long a failing start may take, start-up included: 4 s here when idle, 15 s on a busy 2-core machine;
#: a hang never ends.
FAILED_START_SECONDS = 60.0

STALL_PLUGIN = '''
"""A plugin whose startup hook says it runs (a file) and then never returns."""
import asyncio
import os
from pathlib import Path

import factstream


@factstream.hookimpl
async def startup(host: factstream.HostApi) -> None:
    Path(os.environ["STALL_MARKER"]).write_text("starting")
    await asyncio.sleep(3600)
'''


@pytest.fixture
def cluster(process_cluster: ProcessCluster, plugin_installer: PluginInstaller) -> ProcessCluster:
    plugin_installer.from_project(INBOX_PROJECT)
    process_cluster.env["FACTSTREAM_LOAD_PLUGINS"] = "inbox"
    process_cluster.configure(stream_writers={"inbox": ["main"]})
    return process_cluster


def started(cluster: ProcessCluster, name: str, args: list[str] | None = None) -> FactstreamProcess:
    """Start a process and wait until it has started (a minute and more when the machine is busy)."""
    proc = cluster.start(name, args=args or [], wait=False)
    proc.wait_started(timeout=FAILED_START_SECONDS * 2)
    return proc


def failed_start(cluster: ProcessCluster, name: str, instance: str, args: list[str] | None = None) -> str:
    """Start a process expected to fail; return its output once it exited 2 within the limit."""
    if not cluster.migrated:
        cluster.migrate(cluster.config())
    proc = cluster.processes.get(name)
    if proc is None:
        proc = FactstreamProcess(name, instance, cluster.config(), cluster.env, cluster.workdir, args=args or [])
        cluster.processes[name] = proc
    began = time.monotonic()
    proc.start()
    assert proc.popen is not None
    try:
        code = proc.popen.wait(FAILED_START_SECONDS)
    except subprocess.TimeoutExpired:
        proc.popen.kill()
        proc.popen.wait(5)
        raise AssertionError(f"{name} (try {proc.starts}) hung in a failed start:\n{proc.tail()}") from None
    took = time.monotonic() - began
    output = proc.tail(30).split(f"===== start #{proc.starts} of {name} =====")[-1]
    assert code == 2, f"{name} (try {proc.starts}) exited {code} after {took:.1f}s:\n{output}"
    assert "Traceback" not in output, output
    return output


def test_a_duplicate_instance_exits_promptly_with_its_error(cluster: ProcessCluster) -> None:
    started(cluster, "main")
    for _ in range(8):
        output = failed_start(cluster, "duplicate", "main", ["--http-port", "0"])
        assert "another process is already running as instance 'main'" in output, output
    assert cluster.processes["main"].running  # the refused duplicates did not disturb it


def test_a_busy_http_port_exits_promptly_with_its_error(cluster: ProcessCluster) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        for _ in range(4):
            output = failed_start(cluster, "main", "main", ["--http-port", str(port)])
            assert f"cannot listen for HTTP on 127.0.0.1:{port}" in output, output
    started(cluster, "main")  # then it starts: the failed tries left nothing behind


def test_a_busy_replication_port_exits_promptly_with_its_error(cluster: ProcessCluster) -> None:
    with socket.socket() as busy:
        busy.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        busy.bind(("127.0.0.1", cluster.main_port))
        busy.listen()
        for _ in range(4):
            output = failed_start(cluster, "main", "main", ["--http-port", "0"])
            assert f"cannot listen for replication on 127.0.0.1:{cluster.main_port}" in output, output


@pytest.mark.parametrize(("sig", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 0)])
def test_a_running_instance_exits_130_on_ctrl_c_and_0_on_sigterm(
    cluster: ProcessCluster, sig: signal.Signals, code: int
) -> None:
    proc = started(cluster, "main", ["--http-port", str(free_port())])
    assert proc.stop(sig, timeout=20) == code, proc.tail()
    assert "Traceback" not in proc.log(), proc.log()


@pytest.mark.parametrize(("sig", "code"), [(signal.SIGTERM, 0), (signal.SIGINT, 130)])
def test_a_signal_during_the_start_up_stops_it(
    cluster: ProcessCluster, plugin_installer: PluginInstaller, tmp_path: Path, sig: signal.Signals, code: int
) -> None:
    project = tmp_path / "stall"
    (project / "factstream_stall").mkdir(parents=True)
    (project / "factstream_stall" / "__init__.py").write_text(STALL_PLUGIN)
    (project / "pyproject.toml").write_text(
        '[project]\nname = "factstream-teststall"\nversion = "0"\n'
        '[project.entry-points.factstream]\nstall = "factstream_stall"\n'
    )
    plugin_installer.from_project(project)
    marker = tmp_path / "stalled"
    cluster.env["FACTSTREAM_LOAD_PLUGINS"] = "inbox,stall"
    proc = cluster.start("main", env={"STALL_MARKER": str(marker)}, wait=False)
    wait_until(marker.exists, 60, "the start-up to reach the stalling plugin", detail=lambda: proc.tail())
    assert not proc.started()
    assert proc.stop(sig, timeout=15) == code, proc.tail()
    assert "Traceback" not in proc.log(), proc.log()
