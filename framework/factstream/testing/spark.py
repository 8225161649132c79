"""A Spark standalone cluster for tests and benchmarks of export jobs: a master and one worker, each a JVM
started by the installed pyspark's own ``spark-class`` launcher in its own process group, as an operator
starts them. Needs Java and pyspark (the export extra); nothing is downloaded."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

import psutil  # type: ignore[import-untyped]

from factstream.testing.helpers import free_port, wait_until

__all__ = ["SparkStandalone"]


def _listening(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1):
            return True
    except OSError:
        return False


class SparkStandalone:
    """A master and one worker on 127.0.0.1, their logs and work directories under ``work``.

    ``start()`` returns once the worker has registered with the master (``start_seconds`` at most for
    each JVM); ``url`` is the ``spark://`` URL to give ``--master``; ``ui`` the master's web UI port
    (its ``/json/`` lists workers and applications). ``stop()`` ends both process groups (TERM, then
    KILL) and waits until every process they started (executors, Python workers) is gone. Executors run
    ``sys.executable`` (``PYSPARK_PYTHON``), so they import what this process imports.
    """

    def __init__(self, work: Path, *, cores: int = 1, memory: str = "1g", start_seconds: float = 120) -> None:
        import pyspark

        self.spark_class = str(Path(pyspark.__file__).parent / "bin" / "spark-class")
        self.work = work
        self.cores, self.memory, self.start_seconds = cores, memory, start_seconds
        self.port, self.ui = free_port(), free_port()
        self.url = f"spark://127.0.0.1:{self.port}"
        self.env = {
            **os.environ,
            "SPARK_LOCAL_IP": "127.0.0.1",
            "SPARK_WORKER_DIR": str(work / "worker"),
            "PYSPARK_PYTHON": sys.executable,
        }
        self.procs: list[subprocess.Popen[bytes]] = []

    def start(self) -> None:
        master = "org.apache.spark.deploy.master.Master"
        self._start("master", master, "--host", "127.0.0.1", "--port", str(self.port), "--webui-port", str(self.ui))
        wait_until(lambda: _listening(self.port), self.start_seconds, "the Spark master to listen", detail=self.logs)
        worker = "org.apache.spark.deploy.worker.Worker"
        self._start("worker", worker, self.url, "--host", "127.0.0.1", "--cores", str(self.cores), "--memory",
                    self.memory)  # fmt: skip
        wait_until(lambda: len(self.workers()) == 1, self.start_seconds, "the worker to register", detail=self.logs)

    def _start(self, name: str, *args: str) -> None:
        with (self.work / f"{name}.log").open("wb") as log:
            self.procs.append(
                subprocess.Popen(
                    [self.spark_class, *args],
                    env=self.env,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,  # its own process group: stopped as one
                )
            )

    def state(self) -> dict[str, Any]:
        """The master's ``/json/`` (workers, applications), or ``{}`` while it does not answer."""
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.ui}/json/", timeout=2) as answer:
                return dict(json.load(answer))
        except (OSError, ValueError):
            return {}

    def workers(self) -> list[dict[str, Any]]:
        """The workers the master knows alive."""
        return [w for w in self.state().get("workers", []) if w.get("state") == "ALIVE"]

    def logs(self) -> str:
        """The end of each JVM's log, for a failure's message."""
        return "\n".join(p.read_text(errors="replace")[-3000:] for p in sorted(self.work.glob("*.log")))

    def pids(self) -> set[int]:
        """Every process of the cluster: the JVMs and what they started (executors, Python workers)."""
        found = set()
        for p in self.procs:
            try:
                proc = psutil.Process(p.pid)
                found |= {proc.pid, *(c.pid for c in proc.children(recursive=True))}
            except psutil.NoSuchProcess:
                pass
        return found

    def stop(self) -> None:
        pids = self.pids()
        for p in reversed(self.procs):
            try:
                os.killpg(p.pid, signal.SIGTERM)
            except ProcessLookupError:
                continue
        for p in reversed(self.procs):
            try:
                p.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait(timeout=10)
        # executors are the worker's children, in its group; whatever outlived the TERM goes now
        wait_until(lambda: not any(psutil.pid_exists(pid) for pid in pids), 20, "the cluster's processes to end")
