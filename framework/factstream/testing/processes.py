"""Real ``factstream run`` processes for tests (the ``process_cluster`` fixture), and the tools of fault
injection around them: a restartable ``redis-server`` (the ``redis_server`` fixture) and a TCP proxy
that can cut its connections and refuse new ones.

A :class:`ProcessCluster` writes configuration files (one database, an ``instance_map`` on 127.0.0.1,
a deployment name of its own), migrates the database with ``factstream migrate`` and starts
``factstream -c FILE -v run --instance NAME`` processes, each logging to ``<workdir>/<name>.log``. A
process has started when its log shows ``instance NAME started`` (the host logs it once its plugins'
``startup`` hooks ran and its HTTP API listens). Every process still running is stopped at teardown.

Instances given a port by :meth:`ProcessCluster.serve_http` serve their HTTP API on it:
:meth:`ProcessCluster.client` is a client of it, :meth:`ProcessCluster.wait_healthy` waits until its
``/health`` answers 200.
"""

from __future__ import annotations

import asyncio
import contextlib
import shutil
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Coroutine, Mapping, Sequence
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, Self, TypeVar

import yaml

from factstream.sockets import nodelay, set_nodelay
from factstream.testing.helpers import bearer, free_port, merge_config, require_httpx, wait_until

if TYPE_CHECKING:
    import httpx

START_TIMEOUT = 30.0
T = TypeVar("T")


class FactstreamProcess:
    """One ``factstream run --instance INSTANCE`` process, restartable; its output goes to a log file.

    ``hang_dump``: a file where the process writes the stacks of its asyncio tasks on ``SIGUSR1`` (a
    test plugin may install such a handler); when the process does not stop in time, it is asked for
    them and they are shown with the error.
    """

    def __init__(
        self,
        name: str,
        instance: str,
        config: Path,
        env: Mapping[str, str],
        workdir: Path,
        *,
        args: Sequence[str] = (),
        hang_dump: Path | None = None,
    ) -> None:
        self.name = name
        self.instance = instance
        self.config = config
        self.env = dict(env)
        self.workdir = workdir
        self.args = list(args)
        self.hang_dump = hang_dump
        self.log_path = workdir / f"{name}.log"
        self.popen: subprocess.Popen[bytes] | None = None
        #: How many times the process was started.
        self.starts = 0
        self._log_offset = 0

    @property
    def running(self) -> bool:
        return self.popen is not None and self.popen.poll() is None

    def command(self) -> list[str]:
        return [
            *(sys.executable, "-m", "factstream", "-c", str(self.config), "-v", "run", "--instance", self.instance),
            *self.args,
        ]

    def start(self) -> None:
        """Start the process (again); see :meth:`wait_started`."""
        assert not self.running, f"{self.name} is already running"
        self.starts += 1
        with open(self.log_path, "ab") as log:
            log.write(f"===== start #{self.starts} of {self.name} =====\n".encode())
            log.flush()
            self._log_offset = log.tell()
            self.popen = subprocess.Popen(
                self.command(), stdout=log, stderr=subprocess.STDOUT, env=self.env, cwd=self.workdir
            )

    def started(self) -> bool:
        """Whether this start of the process has logged ``instance NAME started``; an ``AssertionError``
        with the log's tail if it has exited."""
        if self.popen is not None and self.popen.poll() is not None:
            raise AssertionError(f"{self.name} exited with {self.popen.returncode}:\n{self.tail()}")
        try:
            with open(self.log_path, "rb") as log:
                log.seek(self._log_offset)
                text = log.read().decode(errors="replace")
        except FileNotFoundError:
            return False
        return f"instance {self.instance} started" in text

    def wait_started(self, timeout: float = START_TIMEOUT) -> None:
        """Wait until the process has started (its streams, replication, plugins and HTTP API are up)."""
        assert self.popen is not None, f"{self.name} was never started"
        wait_until(self.started, timeout, f"{self.name} to start", detail=lambda: f"\n{self.tail()}")

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 15.0) -> int:
        """Send ``sig`` and wait for the exit; returns the exit code (an ``AssertionError`` if it does not
        exit within ``timeout`` seconds: it is killed then)."""
        assert self.popen is not None
        self.popen.send_signal(sig)
        try:
            return self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            dump = ""
            if self.hang_dump is not None:
                self.popen.send_signal(signal.SIGUSR1)
                time.sleep(1.0)
            self.popen.kill()
            self.popen.wait(5)
            if self.hang_dump is not None:
                dump = "\n" + (
                    self.hang_dump.read_text(errors="replace") if self.hang_dump.exists() else "(no task dump)"
                )
            stopped = f"{self.name} did not exit within {timeout:.0f}s of {sig!r}"
            raise AssertionError(f"{stopped}:\n{self.tail()}{dump}") from None

    def kill(self) -> None:
        """Terminate the process if it runs (kill it if it does not exit within 5 seconds)."""
        if self.popen is not None and self.popen.poll() is None:
            self.popen.terminate()
            try:
                self.popen.wait(5)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(5)

    def log(self) -> str:
        """Everything the process logged, over all its starts."""
        try:
            text = self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""
        return "\n".join(line.rstrip() for line in text.splitlines())  # rich pads lines to the width

    def tail(self, lines: int = 60) -> str:
        return "\n".join(self.log().splitlines()[-lines:])


class ProcessCluster:
    """``factstream run`` processes of one deployment on one database (the ``process_cluster`` fixture).

    Configuration files are built like :class:`~factstream.testing.hosts.HostCluster` configurations:
    the cluster's base (``deployment``, ``state_dir``, ``database.url``, an ``instance_map`` of
    :attr:`instances` on 127.0.0.1 whose first one, main, serves TCP replication on :attr:`main_port`),
    then the defaults given to :meth:`configure`, then the overrides of one :meth:`config` call.
    ``env`` is the processes' environment (``plugin_installer.env()`` in the fixture, so they see the
    test's plugins), with ``NO_COLOR``, ``COLUMNS`` and ``PYTHONUNBUFFERED`` set.

    Used as a context manager (as the fixture uses it), the cluster is closed on leaving: see :meth:`close`.
    """

    def __init__(
        self,
        workdir: Path,
        database_url: str,
        env: Mapping[str, str],
        *,
        deployment: str | None = None,
        instances: Sequence[str] = ("main", "worker1"),
        migrate_empty: Callable[[str, Mapping[str, str]], bool] | None = None,
    ) -> None:
        self.workdir = workdir
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.database_url = database_url
        #: The deployment name (the Redis channel): unique to the cluster unless given.
        self.deployment = deployment or f"fs-{uuid.uuid4().hex[:8]}"
        #: The TCP replication port of main (the first instance).
        self.main_port = free_port()
        self.instances = tuple(instances)
        self.env = {**env, "COLUMNS": "200", "NO_COLOR": "1", "PYTHONUNBUFFERED": "1"}
        #: Every process started, by name, in the order of their first start.
        self.processes: dict[str, FactstreamProcess] = {}
        #: Called (last added first) at :meth:`stop_all`, after the processes stopped.
        self.cleanups: list[Callable[[], None]] = []
        self.migrated = False
        #: How the fixture migrates the cluster's own database while it is still empty, in this process
        #: (``(url, env) -> done``): see :meth:`migrate`.
        self._migrate_empty = migrate_empty
        #: The HTTP port of each instance that serves its API (:meth:`serve_http`).
        self.http_ports: dict[str, int] = {}
        self._defaults: dict[str, Any] = {}
        self._clients: list[httpx.Client] = []

    def configure(self, *, instances: Sequence[str] | None = None, **config: Any) -> ProcessCluster:
        """Configuration defaults of every file written from now on (merged into those given before);
        ``instances``: the names of the ``instance_map``, main first. Returns the cluster."""
        if instances is not None:
            self.instances = tuple(instances)
        self._defaults = merge_config(self._defaults, config)
        return self

    def config_data(
        self, *, replication_port: int | None = None, redis_url: str | None = None, **overrides: Any
    ) -> dict[str, Any]:
        """What :meth:`config` writes (see there)."""
        endpoints: dict[str, dict[str, Any]] = {name: {"host": "127.0.0.1"} for name in self.instances}
        endpoints[self.instances[0]]["replication_port"] = replication_port or self.main_port
        base: dict[str, Any] = {
            "deployment": self.deployment,
            "instance_name": self.instances[0],
            "state_dir": str(self.workdir / "state"),
            "database": {"url": self.database_url},
            "instance_map": endpoints,
        }
        if redis_url:
            base["redis"] = {"url": redis_url}
        return merge_config(base, self._defaults, overrides)

    def config(
        self,
        name: str = "factstream",
        *,
        replication_port: int | None = None,
        redis_url: str | None = None,
        **overrides: Any,
    ) -> Path:
        """Write the configuration file ``<workdir>/<name>.yaml``; returns its path.

        ``replication_port`` is where the processes started with this file reach main (a proxy's port,
        for one); ``redis_url`` makes them replicate over Redis; ``overrides`` are merged last.
        """
        path = self.workdir / f"{name}.yaml"
        data = self.config_data(replication_port=replication_port, redis_url=redis_url, **overrides)
        path.write_text(yaml.safe_dump(data, sort_keys=False))
        return path

    def migrate(self, config: Path | None = None) -> None:
        """``factstream -c CONFIG migrate`` (the default configuration file when none is given).

        In the ``process_cluster`` fixture, a configuration naming the cluster's own database while that
        database is still empty is migrated in this process instead, to the same heads for the same
        plugins (those the processes' environment selects), by copying the migrated template database of
        that set of migrations (:func:`factstream.testing.migrated_database`): what a subprocess and
        alembic took 2-3 s of CPU for, every process test. ``factstream migrate`` itself is tested where
        it is what the test is about (it runs whenever this shortcut does not apply).
        """
        shortcut = self._migrate_empty
        if shortcut is not None and self._names_own_database(config) and shortcut(self.database_url, self.env):
            self.migrated = True
            return
        result = subprocess.run(
            [sys.executable, "-m", "factstream", "-c", str(config or self.config()), "migrate"],
            capture_output=True,
            text=True,
            env=self.env,
            cwd=self.workdir,
            timeout=120,
        )
        assert result.returncode == 0, f"migrate failed:\n{result.stdout}\n{result.stderr}"
        self.migrated = True

    def _names_own_database(self, config: Path | None) -> bool:
        """Whether ``config`` (default: the default file) names this cluster's database."""
        if config is None:
            return True
        data = yaml.safe_load(config.read_text()) or {}
        return bool(data.get("database", {}).get("url") == self.database_url)

    def start(
        self,
        instance: str,
        config: Path | None = None,
        *,
        name: str | None = None,
        env: Mapping[str, str] | None = None,
        args: Sequence[str] = (),
        hang_dump: Path | None = None,
        wait: bool = True,
    ) -> FactstreamProcess:
        """Start ``factstream run --instance INSTANCE`` as process ``name`` (default: the instance name)
        and, with ``wait``, wait until it has started.

        ``config`` defaults to the default configuration file (written now if it does not exist);
        ``env`` is added to the cluster's environment; ``args`` follow ``run --instance NAME``. The
        database is migrated first if nothing migrated it yet. Starting a name again restarts that
        process, as it was configured the first time.
        """
        name = name or instance
        proc = self.processes.get(name)
        if proc is None:
            if config is None:
                default = self.workdir / "factstream.yaml"
                config = default if default.exists() else self.config()
            if not self.migrated:
                self.migrate(config)
            proc = FactstreamProcess(
                name, instance, config, {**self.env, **(env or {})}, self.workdir, args=args, hang_dump=hang_dump
            )
            self.processes[name] = proc
        proc.start()
        if wait:
            proc.wait_started()
        return proc

    # -- the HTTP API of the processes ----------------------------------------------------------------------

    def serve_http(self, *instances: str) -> dict[str, int]:
        """Give each of ``instances`` (by default, each of :attr:`instances`) a free port for its HTTP API,
        its ``http_port`` in the ``instance_map`` of every file written from now on; returns the ports
        (kept in :attr:`http_ports`)."""
        ports = {name: free_port() for name in instances or self.instances}
        self.http_ports.update(ports)
        self.configure(instance_map={name: {"http_port": port} for name, port in ports.items()})
        return ports

    def url(self, instance: str) -> str:
        """The base URL of ``instance``'s HTTP API (on its port in :attr:`http_ports`)."""
        return f"http://127.0.0.1:{self.http_ports[instance]}"

    def client(self, instance: str, token: str | None = None, *, timeout: float = 5.0) -> httpx.Client:
        """A (blocking) HTTP client of ``instance``'s API, sending ``Authorization: Bearer <token>`` when a
        token is given; a request that takes over ``timeout`` seconds fails. The cluster closes it when
        it closes (a ``with`` block may close it sooner). Needs ``httpx``."""
        require_httpx("process_cluster.client")
        import httpx

        client = httpx.Client(base_url=self.url(instance), headers=bearer(token), timeout=timeout)
        self._clients.append(client)
        return client

    def healthy(self, instance: str) -> bool:
        """Whether ``instance``'s ``/health`` answers 200 now (not while it is degraded or does not listen)."""
        require_httpx("process_cluster.healthy")
        import httpx

        try:
            return httpx.get(f"{self.url(instance)}/health", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    def wait_healthy(self, instance: str, timeout: float = START_TIMEOUT) -> None:
        """Wait until ``instance``'s ``/health`` answers 200 (its HTTP API listens, and it is not degraded)."""
        wait_until(lambda: self.healthy(instance), timeout, f"{instance} to answer /health", detail=self.logs)

    # -- teardown -----------------------------------------------------------------------------------------

    def logs(self, lines: int = 40) -> str:
        """The last ``lines`` of every process's log, for an assertion message."""
        return "".join(f"\n--- {p.name} (last {lines} lines) ---\n{p.tail(lines)}" for p in self.processes.values())

    def stop_all(self) -> None:
        """Stop every process (last started first), then run the cleanups."""
        for proc in reversed(self.processes.values()):
            proc.kill()
        for cleanup in reversed(self.cleanups):
            with contextlib.suppress(Exception):
                cleanup()

    def close(self) -> None:
        """The end of a test: close the clients, :meth:`stop_all`, then print the tail of every log, which
        pytest shows when the test failed."""
        for client in self._clients:
            client.close()
        self._clients.clear()
        self.stop_all()
        for proc in self.processes.values():
            print(f"===== {proc.name} log ({proc.log_path}) =====\n{proc.tail(300)}")

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, error: BaseException | None, traceback: TracebackType | None
    ) -> None:
        self.close()


# -- fault injection ---------------------------------------------------------------------------------------


class RedisServer:
    """A dedicated ``redis-server`` on a free port, without persistence, that a test may stop, restart
    and reconfigure (the ``redis_server`` fixture)."""

    def __init__(self, workdir: Path) -> None:
        self.port = free_port()
        self.workdir = workdir
        self.log_path = workdir / "redis-server.log"
        self.popen: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        binary = shutil.which("redis-server")
        assert binary, "the redis-server binary is not on PATH"
        with open(self.log_path, "ab") as log:
            self.popen = subprocess.Popen(
                [binary, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"],
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.workdir,
            )
        wait_until(self._pings, 10, "redis-server to answer PING", detail=lambda: f"\n{self.log()}")

    def _pings(self) -> bool:
        try:
            return bool(self.client().ping())
        except Exception:
            return False

    def client(self) -> Any:
        """A (blocking) ``redis.Redis`` client of the server."""
        import redis

        return redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=5, socket_connect_timeout=2)

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def stop(self) -> None:
        if self.popen is not None and self.popen.poll() is None:
            self.popen.terminate()
            try:
                self.popen.wait(10)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait(5)


class TcpProxy:
    """A TCP proxy to ``127.0.0.1:target_port`` (its own thread and event loop) that can drop its
    connections and refuse new ones: put it between a process and main, or a process and Redis."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.port = free_port()
        #: Connections accepted (and connected through) so far.
        self.accepted = 0
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="proxy", daemon=True)
        self._server: asyncio.Server | None = None
        self._links: set[tuple[asyncio.StreamWriter, asyncio.StreamWriter]] = set()

    def _call(self, coro: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(10)

    def start(self) -> None:
        self._thread.start()
        self.accept()

    def accept(self) -> None:
        """Listen (again) for new connections."""

        async def listen() -> None:
            if self._server is None:
                self._server = await asyncio.start_server(self._serve, "127.0.0.1", self.port)

        self._call(listen())

    def refuse(self) -> None:
        """Stop listening: new connections are refused; established ones are kept."""

        async def close() -> None:
            if self._server is not None:
                self._server.close()
                self._server = None

        self._call(close())

    def drop(self) -> int:
        """Abort every established connection (both sides); returns how many there were."""

        async def abort() -> int:
            links = list(self._links)
            for down, up in links:
                down.transport.abort()
                up.transport.abort()
            return len(links)

        return self._call(abort())

    def inject(self, data: bytes) -> int:
        """Write ``data`` to every established link towards the process that connected, as if the
        target had sent it (a forged or replayed line on an authenticated link); returns how many links."""

        async def write() -> int:
            links = list(self._links)
            for down, _ in links:
                down.write(data)
            return len(links)

        return self._call(write())

    def connections(self) -> int:
        async def count() -> int:
            return len(self._links)

        return self._call(count())

    def nodelay(self) -> list[bool]:
        """Whether TCP_NODELAY is set on each socket of each established link (accepted side, then target side)."""

        async def read() -> list[bool]:
            return [nodelay(w.transport) for link in list(self._links) for w in link]

        return self._call(read())

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target_port)
        except OSError:
            writer.transport.abort()
            return
        for side in (writer, up_writer):  # the proxy must not add Nagle's delays to what it relays
            set_nodelay(side.transport)
        self.accepted += 1
        link = (writer, up_writer)
        self._links.add(link)

        async def pipe(src: asyncio.StreamReader, dst: asyncio.StreamWriter) -> None:
            try:
                while data := await src.read(65536):
                    dst.write(data)
                    await dst.drain()
            except (ConnectionError, OSError):
                pass
            finally:
                dst.close()

        try:
            await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))
        finally:
            self._links.discard(link)

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.refuse()
            self.drop()
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(5)
