"""The demo's deployment: a fresh ``factstream_demo`` database on the embedded server, a generated
configuration, and ``main`` and ``worker`` as real ``factstream run`` processes replicating over TCP.

The demo process holds the embedded server (``start_embedded``) for the whole run; the instances reach
the demo database through its Unix socket with an explicit ``database.url``, so the server outlives
neither the demo nor them: :meth:`DemoCluster.stop` stops the instances, then lets go of the server.
Each instance runs in a session of its own, so a Ctrl-C in the terminal reaches the demo only, which
stops them in order (SIGTERM, then SIGKILL after a grace period).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import yaml

from factstream.errors import FactstreamError
from factstream.sockets import free_port

DEMO_DATABASE = "factstream_demo"
SERVER_NAME = "demo.local"
INSTANCES = ("main", "worker")
USERS = ("alice", "bob", "carol")
START_TIMEOUT = 60.0
STOP_TIMEOUT = 15.0


class DemoError(FactstreamError):
    """The demo could not go on (an instance did not start, a request failed): the message says why."""


def user_id(name: str) -> str:
    return f"@{name}:{SERVER_NAME}"


@dataclass
class Instance:
    """One ``factstream run --instance NAME`` of the demo, logging to ``<workdir>/NAME.log``."""

    name: str
    http_port: int
    config: Path
    workdir: Path
    popen: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    @property
    def log_path(self) -> Path:
        return self.workdir / f"{self.name}.log"

    def command(self) -> list[str]:
        return [sys.executable, "-m", "factstream", "-c", str(self.config), "-v", "run", "--instance", self.name]

    def start(self, env: dict[str, str]) -> None:
        with open(self.log_path, "wb") as log:
            self.popen = subprocess.Popen(
                self.command(),
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                cwd=self.workdir,
                start_new_session=True,  # Ctrl-C reaches the demo, which stops the instances in order
            )

    def tail(self, lines: int = 20) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return "(no log)"
        return "\n".join(line.rstrip() for line in text.splitlines()[-lines:])

    def started(self) -> bool:
        """Whether the log shows ``instance NAME started``; a :class:`DemoError` if the process exited."""
        if self.popen is None:
            return False
        if self.popen.poll() is not None:
            raise DemoError(
                f"instance {self.name} exited with status {self.popen.returncode} while starting; "
                f"the end of its log ({self.log_path}):\n{self.tail()}"
            )
        try:
            return f"instance {self.name} started" in self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return False

    def stop(self) -> None:
        """SIGTERM, then SIGKILL (the whole session: nothing it started survives) after a grace period."""
        popen = self.popen
        if popen is None or popen.poll() is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            popen.send_signal(signal.SIGTERM)
        try:
            popen.wait(STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(popen.pid, signal.SIGKILL)
            popen.wait(5)


@dataclass
class DemoCluster:
    """The demo's two instances on a fresh database; see the module docstring."""

    state_dir: Path
    workdir: Path = field(init=False)
    config_path: Path = field(init=False)
    database_url: str = ""
    tokens: dict[str, str] = field(default_factory=dict)
    instances: dict[str, Instance] = field(default_factory=dict)
    _holds_server: bool = False

    def __post_init__(self) -> None:
        self.workdir = self.state_dir / "demo"
        self.config_path = self.workdir / "factstream.yaml"

    @property
    def main(self) -> Instance:
        return self.instances["main"]

    @property
    def worker(self) -> Instance:
        return self.instances["worker"]

    def prepare_database(self) -> None:
        """Start (or join) the embedded server and create the demo database afresh."""
        import psycopg

        from factstream.db.embedded import start_embedded

        self.workdir.mkdir(parents=True, exist_ok=True)
        self._holds_server = True
        url = start_embedded(self.state_dir)
        socket_dir = parse_qs(urlsplit(url).query).get("host", [""])[0]
        admin = f"postgresql://postgres@/postgres?host={socket_dir}"
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{DEMO_DATABASE}" WITH (FORCE)')
            conn.execute(f'CREATE DATABASE "{DEMO_DATABASE}"')
        self.database_url = f"postgresql://postgres@/{DEMO_DATABASE}?host={socket_dir}"

    def migrate(self, plugins: Any) -> None:
        from factstream.migrate import Migrator

        migrator = Migrator(self.database_url, plugins)
        try:
            migrator.upgrade()
        finally:
            migrator.close()

    def write_config(self) -> Path:
        """The generated configuration: free ports, a fresh replication secret and fresh tokens."""
        self.tokens = {name: f"demo-{name}-{secrets.token_urlsafe(12)}" for name in (*USERS, "server")}
        ports = {name: free_port() for name in INSTANCES}
        instance_map: dict[str, Any] = {name: {"host": "127.0.0.1", "http_port": port} for name, port in ports.items()}
        instance_map["main"]["replication_port"] = free_port()
        data = {
            "deployment": SERVER_NAME,
            "instance_name": "main",
            "state_dir": str(self.workdir / "state"),
            "database": {"url": self.database_url},
            "replication": {"secret": secrets.token_urlsafe(32)},
            "instance_map": instance_map,
            "http": {
                "tokens": {
                    # alice and bob write their own account data and to-device messages (writer routes)
                    self.tokens[name]: {"user": user_id(name), "write": name != "carol"}
                    for name in USERS
                }
                | {self.tokens["server"]: {"user": user_id("server"), "write": True}},
            },
        }
        self.config_path.write_text(
            "# Generated by `factstream demo` for this run; replaced by the next one.\n"
            + yaml.safe_dump(data, sort_keys=False)
        )
        self.config_path.chmod(0o600)  # it holds the replication secret and the tokens
        self.instances = {name: Instance(name, ports[name], self.config_path, self.workdir) for name in INSTANCES}
        return self.config_path

    def env(self) -> dict[str, str]:
        """The instances' environment: this one without ``FACTSTREAM_*`` (the generated file decides)."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("FACTSTREAM_")}
        return env | {"NO_COLOR": "1", "COLUMNS": "200", "PYTHONUNBUFFERED": "1"}

    def start(self) -> None:
        """Start main, then the worker; return once both logged ``instance NAME started``."""
        env = self.env()
        for inst in self.instances.values():
            inst.start(env)
        deadline = time.monotonic() + START_TIMEOUT
        waiting = list(self.instances.values())
        while waiting:
            waiting = [inst for inst in waiting if not inst.started()]
            if waiting and time.monotonic() > deadline:
                names = ", ".join(i.name for i in waiting)
                raise DemoError(
                    f"{names} did not start within {START_TIMEOUT:.0f} s; the end of the log:\n{waiting[0].tail()}"
                )
            time.sleep(0.05)

    def pids(self) -> list[int]:
        return [i.popen.pid for i in self.instances.values() if i.popen is not None and i.popen.poll() is None]

    def stop(self) -> None:
        """Stop the instances (worker first), then let go of the embedded server."""
        for inst in reversed(self.instances.values()):
            inst.stop()
        if self._holds_server:
            from factstream.db.embedded import stop_embedded

            stop_embedded(self.state_dir)
            self._holds_server = False
