"""``HostCluster``: named in-process hosts on one database, over TCP or Redis (the ``host_cluster`` fixture).

Every host of a cluster gets the same configuration, built as ``factstream run`` builds it
(:func:`factstream.config.load_config`, with no environment unless a start gives ``environ``) from,
in turn:

1. the cluster's base: ``deployment``, ``instance_name``, ``state_dir``, ``database.url``, an
   ``instance_map`` of the cluster's instances on 127.0.0.1 (the first one, main, serving TCP
   replication on :attr:`HostCluster.main_port`), and ``redis.url`` when the transport is Redis;
2. the defaults given to :meth:`HostCluster.configure`;
3. the overrides given when starting that host.

Mappings are merged key by key (``http={"port": 8080}`` at a start keeps the ``http.tokens`` given to
``configure``); lists and scalars replace (``stream_writers={"notes": ["main", "worker1"]}``).
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Callable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from factstream.config import Settings, load_config
from factstream.host.app import Host
from factstream.plugin.manager import PluginHost, load_plugins
from factstream.testing.helpers import bearer, free_port, merge_config, require_httpx, until

if TYPE_CHECKING:
    import httpx

#: The instances of a cluster's ``instance_map`` unless configured otherwise (the first is main).
DEFAULT_INSTANCES = ("main", "worker1", "worker2")
TRANSPORTS = ("tcp", "redis")

PluginSource = PluginHost | Callable[[], PluginHost]


class HostCluster:
    """Named in-process :class:`~factstream.host.app.Host` s sharing one database.

    ``await cluster("worker1", replication={"secret": "s"})`` starts a host (see :meth:`start`);
    :meth:`close` stops every host still running, in the reverse order of their starts.

    ``database`` is the URL of a migrated database, or a function returning one (called at the first
    start: the fixture migrates a fresh database then, with the plugins installed by that time).
    ``redis_url`` likewise gives the Redis URL when the transport is ``"redis"``. ``plugin_host`` is
    the :class:`~factstream.plugin.manager.PluginHost` of every host, or a function called for each
    host as it starts; by default each host loads the installed plugins (``load_plugins()``).
    """

    def __init__(
        self,
        state_dir: Path,
        *,
        database: str | Callable[[], str],
        redis_url: str | Callable[[], str] | None = None,
        plugin_host: PluginSource | None = None,
        transport: str = "tcp",
        deployment: str | None = None,
        instances: Sequence[str] = DEFAULT_INSTANCES,
    ) -> None:
        self.state_dir = state_dir
        #: The TCP replication port of the first instance (main).
        self.main_port = free_port()
        #: Every host started, in order (stopped ones too).
        self.started: list[Host] = []
        self._database = database
        self._database_url: str | None = None
        self._redis = redis_url
        self._plugin_host = plugin_host
        self._transport = "tcp"
        self._deployment = deployment
        #: The Redis channel when no deployment was named: the cluster's own, so that clusters of
        #: parallel test runs (pytest-xdist workers) on one Redis never hear each other.
        self._channel = f"test-{uuid.uuid4().hex[:8]}"
        self._instances: tuple[str, ...] = ()
        self._defaults: dict[str, Any] = {}
        self._clients: list[httpx.AsyncClient] = []
        self.configure(transport=transport, instances=instances)

    # -- configuration -------------------------------------------------------------------------------

    def configure(
        self,
        *,
        database: str | Callable[[], str] | None = None,
        plugin_host: PluginSource | None = None,
        transport: str | None = None,
        deployment: str | None = None,
        instances: Sequence[str] | None = None,
        **config: Any,
    ) -> HostCluster:
        """Set what the hosts started from now on get; returns the cluster.

        ``database``: the URL of an already migrated database to use instead of the fixture's.
        ``plugin_host``: see the class. ``transport``: ``"tcp"`` (default) or ``"redis"``.
        ``deployment``: the server name (and Redis channel): ``"test"`` by default over TCP, a name of
        the cluster's own over Redis. ``instances``: the
        names of the ``instance_map``, main first. ``config``: configuration defaults of every host
        (``stream_writers={...}``, ``http={...}``, ``plugins={...}``...), merged into those given before.
        """
        if database is not None:
            if self.started:
                raise RuntimeError("the database of a cluster cannot change once a host has started")
            self._database, self._database_url = database, None
        if plugin_host is not None:
            self._plugin_host = plugin_host
        if transport is not None:
            if transport not in TRANSPORTS:
                raise ValueError(f"transport must be one of {', '.join(TRANSPORTS)}, not {transport!r}")
            self._transport = transport
        if deployment is not None:
            self._deployment = deployment
        if instances is not None:
            if not instances:
                raise ValueError("a cluster needs at least one instance")
            self._instances = tuple(instances)
        self._defaults = merge_config(self._defaults, config)
        return self

    @property
    def transport(self) -> str:
        return self._transport

    @property
    def instances(self) -> tuple[str, ...]:
        return self._instances

    @property
    def database_url(self) -> str:
        """The URL of the cluster's database (migrated now if the fixture provides it and this is the first use)."""
        if self._database_url is None:
            self._database_url = self._database if isinstance(self._database, str) else self._database()
        return self._database_url

    @property
    def redis_url(self) -> str:
        if self._redis is None:
            raise RuntimeError("this cluster has no Redis URL")
        return self._redis if isinstance(self._redis, str) else self._redis()

    def plugin_host(self) -> PluginHost:
        """The plugins of the next host to start."""
        if self._plugin_host is None:
            return load_plugins()
        return self._plugin_host if isinstance(self._plugin_host, PluginHost) else self._plugin_host()

    @property
    def deployment(self) -> str:
        """The deployment name: the one configured, else ``"test"`` over TCP and the cluster's own over Redis."""
        if self._deployment is not None:
            return self._deployment
        return self._channel if self._transport == "redis" else "test"

    def config(self, name: str = "main", **overrides: Any) -> dict[str, Any]:
        """The configuration (a mapping, as in a YAML file) host ``name`` would start with."""
        endpoints: dict[str, dict[str, Any]] = {n: {"host": "127.0.0.1"} for n in self._instances}
        endpoints[self._instances[0]]["replication_port"] = self.main_port
        base: dict[str, Any] = {
            "deployment": self.deployment,
            "instance_name": name,
            "state_dir": str(self.state_dir),
            "database": {"url": self.database_url},
            "instance_map": endpoints,
        }
        if self._transport == "redis":
            base["redis"] = {"url": self.redis_url}
        return merge_config(base, self._defaults, overrides)

    def settings(self, name: str = "main", *, environ: Mapping[str, str] | None = None, **overrides: Any) -> Settings:
        """The :class:`~factstream.config.Settings` host ``name`` would start with: read from
        :meth:`config` and ``environ`` (``FACTSTREAM_...`` variables; none by default), as ``factstream
        run`` reads its file and the environment."""
        return load_config(environ=dict(environ or {}), **self.config(name, **overrides))

    # -- hosts -----------------------------------------------------------------------------------------

    async def start(self, name: str = "main", *, environ: Mapping[str, str] | None = None, **overrides: Any) -> Host:
        """Start host ``name`` with its configuration overrides (``stream_writers=...``, ``http=...``,
        ``replication={"secret": ...}``, ``plugins={...}``...) and environment (see :meth:`settings`);
        returns it once started.

        A host whose start fails is stopped again (what it had started) before the error propagates.
        """
        host = Host(self.settings(name, environ=environ, **overrides), self.plugin_host())
        try:
            await host.start()
        except Exception:
            with contextlib.suppress(Exception):  # what the failed start left half done; its error matters
                await host.stop()
            raise
        self.started.append(host)
        return host

    async def __call__(self, name: str = "main", *, environ: Mapping[str, str] | None = None, **overrides: Any) -> Host:
        """``await cluster(name, **overrides)``: :meth:`start`."""
        return await self.start(name, environ=environ, **overrides)

    def __getitem__(self, name: str) -> Host:
        """The host named ``name`` started last."""
        for host in reversed(self.started):
            if host.instance_name == name:
                return host
        raise KeyError(name)

    def __iter__(self) -> Iterator[Host]:
        return iter(self.started)

    async def following(self, host: Host | str, *streams: str, timeout: float = 10.0) -> None:
        """Wait until ``host`` follows every one of ``streams`` on a replication link: it has processed a
        POSITION of each, so it accepts their rows from then on (``ReplicationHandler.following``)."""
        target = self[host] if isinstance(host, str) else host
        handler = target.handler
        if handler is None:
            raise RuntimeError(f"host {target.instance_name} has not started")
        if not streams:
            raise ValueError("name at least one stream")
        await until(
            lambda: all(handler.following(stream) for stream in streams),
            timeout,
            f"{target.instance_name} to follow {', '.join(streams)}",
        )

    def client(self, host: Host | str, token: str | None = None, *, timeout: float = 5.0) -> httpx.AsyncClient:
        """An HTTP client of ``host``'s API, sending ``Authorization: Bearer <token>`` when a token is given.

        Requests go straight to the host's ASGI application in this process (no socket, no port);
        responses are the API's own. A request that takes over ``timeout`` seconds (httpx's default; a
        long poll wants more) fails. The client is closed with the cluster. Needs ``httpx``.
        """
        require_httpx("host_cluster.client")
        import httpx

        target = self[host] if isinstance(host, str) else host
        client = httpx.AsyncClient(
            transport=httpx.ASGITransport(app=target.app),
            base_url=f"http://{target.instance_name}",
            headers=bearer(token),
            timeout=timeout,
        )
        self._clients.append(client)
        return client

    async def close(self) -> None:
        """Close the clients, then stop every host still running (one whose database is open), last started first."""
        errors: list[BaseException] = []
        for client in self._clients:
            await client.aclose()
        self._clients.clear()
        for host in reversed(self.started):
            if host.db is not None:
                try:
                    await host.stop()
                except Exception as exc:
                    errors.append(exc)
        if errors:
            raise errors[0]
