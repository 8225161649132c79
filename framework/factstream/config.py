"""Host configuration: a YAML file, overridden by ``FACTSTREAM_*`` environment variables.

Where the file comes from: ``--config PATH``, else ``$FACTSTREAM_CONFIG``, else ``./factstream.yaml``
when it exists, else built-in defaults (one instance called ``main``, embedded PostgreSQL, TCP
replication). Nested keys are overridden with ``__``: ``FACTSTREAM_DATABASE__URL``,
``FACTSTREAM_INSTANCE_NAME``, ``FACTSTREAM_REDIS__URL``. Every problem is reported as a
:class:`ConfigError` naming the file, the key and what is wrong with it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationError, field_validator, model_validator
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from factstream.errors import ConfigError
from factstream.names import NAME_RE

DEFAULT_CONFIG_FILE = "factstream.yaml"
ENV_PREFIX = "FACTSTREAM_"
#: Shortest accepted ``replication.secret``.
MIN_SECRET_LENGTH = 16


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class DatabaseConfig(_Section):
    """``database``: where the one PostgreSQL database is. No ``url`` means the embedded server."""

    url: str | None = Field(default=None, description="postgresql://user@host:port/dbname; absent = embedded")
    pool_size: int = Field(default=10, ge=1, le=1000)
    connect_timeout: float = Field(default=5.0, gt=0, description="seconds to wait for a connection")

    @field_validator("url")
    @classmethod
    def _postgres_only(cls, value: str | None) -> str | None:
        if value is None or value == "":
            return None
        scheme = value.split("://", 1)[0] if "://" in value else ""
        if scheme not in {"postgresql", "postgres", "postgresql+psycopg"}:
            raise ValueError(f"must be a postgresql:// URL, not {value!r}")
        return value


class RedisConfig(_Section):
    """``redis``: pub/sub replication. No ``url`` means TCP replication between instances."""

    url: str | None = Field(default=None, description="redis://host:port/db; absent = TCP replication")

    @field_validator("url")
    @classmethod
    def _redis_only(cls, value: str | None) -> str | None:
        if value is None or value == "":
            return None
        if not value.startswith(("redis://", "rediss://", "unix://")):
            raise ValueError(f"must be a redis://, rediss:// or unix:// URL, not {value!r}")
        return value


class ReplicationConfig(_Section):
    """``replication``: limits of the replication links."""

    max_line: int = Field(default=64 * 1024, ge=1024, description="longest accepted TCP line, bytes")
    max_queue: int = Field(default=10_000, ge=10, description="commands queued per TCP peer before disconnecting it")
    max_backlog: int = Field(
        default=10_000, ge=10, description="received commands waiting to be processed before reading pauses"
    )
    linger_ms: float = Field(
        default=2.0,
        ge=0,
        le=100,
        description="after sending a bulk of rows, wait this long before the next send, to coalesce (0: never)",
    )
    linger_rows: int = Field(
        default=50, ge=1, description="a send of at least this many rows is a bulk (smaller sends never linger)"
    )
    redis_packing: bool = Field(
        default=True,
        description=(
            "over Redis, pack RDATA lines several to a message while every subscriber has announced that "
            "it reads them (false: always one command per message, as the reference)"
        ),
    )
    secret: SecretStr | None = Field(
        default=None,
        description=(
            "shared secret of the deployment's replication links: TCP peers prove it (HMAC over a nonce) and "
            "Redis messages are signed with it; absent = no authentication, as the reference"
        ),
    )

    tls: bool = Field(
        default=False, description="TCP replication over TLS: the main instance serves tls_cert, clients verify it"
    )
    tls_cert: Path | None = Field(
        default=None, description="the main instance's certificate chain, PEM (needed there when tls is on)"
    )
    tls_key: Path | None = Field(
        default=None, description="the main instance's private key, PEM (needed there when tls is on)"
    )
    tls_ca: Path | None = Field(
        default=None, description="CA certificates trusted for the main instance's certificate; default: the system's"
    )

    @field_validator("secret")
    @classmethod
    def _secret(cls, value: SecretStr | None) -> SecretStr | None:
        if value is None or value.get_secret_value() == "":
            return None
        if len(value.get_secret_value()) < MIN_SECRET_LENGTH:
            raise ValueError(f"must be at least {MIN_SECRET_LENGTH} characters long (a random string)")
        return value


class CachesConfig(_Section):
    """``caches``: retention of the caches stream (its rows are only needed while readers catch up)."""

    retention_seconds: float = Field(
        default=7 * 24 * 3600, gt=0, description="rows of the caches stream older than this are deleted"
    )
    retention_batch_ids: int = Field(default=20_000, ge=1, description="stream IDs covered by one delete")
    retention_interval_seconds: float = Field(
        default=3600, gt=0, description="pause between retention runs (at most 60 s while behind)"
    )


class HttpToken(_Section):
    """One entry of ``http.tokens``: the user a bearer token stands for, and whether it may write."""

    user: str = Field(min_length=1, description="the user ID requests with this token act as")
    write: bool = Field(default=False, description="may call write routes (access 'writer')")


class HttpConfig(_Section):
    """``http``: the host's HTTP API (see docs/http-api.md)."""

    port: int | None = Field(
        default=None,
        ge=0,
        le=65535,
        description="overrides this instance's instance_map http_port; 0 = no HTTP server",
    )
    bind: str | None = Field(default=None, description="address to listen on; default the instance's instance_map host")
    tokens: dict[str, HttpToken] = Field(default_factory=dict, description="bearer token -> user (and write right)")
    token_table: bool = Field(default=True, description="also accept tokens from the access_tokens table")
    token_cache_seconds: float = Field(default=10.0, ge=0, description="seconds a table lookup is kept")
    sync_timeout_max_seconds: float = Field(
        default=30.0, gt=0, le=600, description="longest /sync long poll; larger timeouts are capped"
    )
    catch_up_timeout_seconds: float = Field(
        default=10.0, gt=0, description="how long /sync waits for this instance to reach a client's token"
    )
    sync_limit: int = Field(default=1000, ge=1, le=100_000, description="most items per stream in one /sync response")
    shutdown_grace_seconds: int = Field(
        default=1, ge=1, le=3600, description="on shutdown, how long open requests get before they are cancelled"
    )

    @field_validator("tokens")
    @classmethod
    def _tokens(cls, value: dict[str, HttpToken]) -> dict[str, HttpToken]:
        for token in value:
            if not token or any(c.isspace() for c in token):
                raise ValueError("a token must be non-empty and contain no whitespace")
        return value


class DashboardConfig(_Section):
    """``dashboard``: the operator's page ``GET /dashboard`` and its ``/dashboard/state`` (see docs/dashboard.md).

    Loopback clients are always let in while it is enabled; ``token`` lets any other client in that
    sends ``Authorization: Bearer TOKEN`` or ``?token=TOKEN``.
    """

    enabled: bool = Field(default=True, description="serve /dashboard and its state (false: they answer 404)")
    token: SecretStr | None = Field(
        default=None, description="also let in non-loopback clients that send this token (bearer or ?token=)"
    )

    @field_validator("token")
    @classmethod
    def _token(cls, value: SecretStr | None) -> SecretStr | None:
        if value is not None and (not value.get_secret_value() or any(c.isspace() for c in value.get_secret_value())):
            raise ValueError("the dashboard token must be non-empty and contain no whitespace")
        return value


class HealthConfig(_Section):
    """``health``: when ``/health`` reports ``degraded`` (see docs/http-api.md)."""

    link_grace_seconds: float = Field(
        default=10.0, ge=0, description="a replication link down longer than this makes the instance degraded"
    )
    writer_stall_seconds: float = Field(
        default=30.0, gt=0, description="unfinished IDs of a stream written here that have not moved for this long"
    )
    database_timeout_seconds: float = Field(
        default=2.0, gt=0, description="a SELECT 1 on the pool that fails or takes longer makes the instance degraded"
    )


class MetricsConfig(_Section):
    """``metrics``: what ``/metrics`` measures (see docs/configuration.md)."""

    enabled: bool = Field(
        default=True,
        description=(
            "count each HTTP request and replication command (false: those metrics stay at 0, and "
            "the per-request and per-command bookkeeping costs nothing; scrape-time metrics remain)"
        ),
    )


class LoggingConfig(_Section):
    """``logging``: how log lines are written (``factstream run --log-format`` overrides ``format``)."""

    format: Literal["text", "json"] = Field(
        default="text", description="text: a line with key=value fields; json: one JSON object per line"
    )


class InstanceEndpoint(_Section):
    """One entry of ``instance_map``: where an instance listens."""

    host: str = "127.0.0.1"
    replication_port: int | None = Field(default=None, ge=1, le=65535)
    http_port: int | None = Field(default=None, ge=1, le=65535)


class Settings(BaseSettings):
    """The whole configuration of one host process."""

    model_config = SettingsConfigDict(
        env_prefix=ENV_PREFIX, env_nested_delimiter="__", extra="forbid", frozen=True, validate_default=True
    )

    deployment: str = Field(default="factstream", description="server name; also the Redis channel")
    instance_name: str = Field(default="main", description="this process's instance name")
    state_dir: Path = Field(default=Path(".factstream"), description="embedded database, exports, checkpoints")
    database: DatabaseConfig = DatabaseConfig()
    redis: RedisConfig = RedisConfig()
    replication: ReplicationConfig = ReplicationConfig()
    caches: CachesConfig = CachesConfig()
    http: HttpConfig = HttpConfig()
    dashboard: DashboardConfig = DashboardConfig()
    health: HealthConfig = HealthConfig()
    metrics: MetricsConfig = MetricsConfig()
    logging: LoggingConfig = LoggingConfig()
    instance_map: dict[str, InstanceEndpoint] = Field(default_factory=dict)
    stream_writers: dict[str, list[str]] = Field(default_factory=dict)
    #: ``plugins.<name>``: each plugin's own settings, validated when the host starts against the
    #: model the plugin registered (``register_settings``); see docs/configuration.md.
    plugins: dict[str, dict[str, Any]] = Field(default_factory=dict)

    @field_validator("instance_name")
    @classmethod
    def _instance_name(cls, value: str) -> str:
        if not value or any(c.isspace() for c in value):
            raise ValueError(f"must be a non-empty name without spaces, not {value!r}")
        return value

    @field_validator("stream_writers")
    @classmethod
    def _stream_names(cls, value: dict[str, list[str]]) -> dict[str, list[str]]:
        for stream, writers in value.items():
            if not NAME_RE.match(stream):
                raise ValueError(f"{stream!r} is not a valid stream name")
            if len(set(writers)) != len(writers):
                raise ValueError(f"stream {stream!r} lists a writer twice: {writers}")
        return value

    @field_validator("plugins")
    @classmethod
    def _plugin_names(cls, value: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
        for name in value:
            if not NAME_RE.match(name):
                raise ValueError(f"{name!r} is not a valid plugin name")
        return value

    @model_validator(mode="after")
    def _writers_are_instances(self) -> Settings:
        if self.instance_map:
            if self.instance_name not in self.instance_map:
                raise ValueError(
                    f"instance_name {self.instance_name!r} is not in instance_map "
                    f"(known: {', '.join(sorted(self.instance_map))})"
                )
            for stream, writers in self.stream_writers.items():
                unknown = [w for w in writers if w not in self.instance_map]
                if unknown:
                    raise ValueError(
                        f"stream_writers.{stream} names {', '.join(map(repr, unknown))}, missing from instance_map"
                    )
        return self

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # The file's values arrive as init kwargs; the environment overrides them.
        return (env_settings, init_settings)

    # -- derived -----------------------------------------------------------------------------------

    def writers_for(self, stream: str) -> list[str]:
        """Configured writers of ``stream``; by default the first instance (``main`` alone)."""
        return list(self.stream_writers.get(stream, [self.main_instance]))

    def http_endpoint(self) -> tuple[str, int] | None:
        """Where this instance's HTTP API listens, or None when it has none.

        The port is ``http.port`` when set, else this instance's ``instance_map`` ``http_port``;
        0 or absent means no HTTP server. The address is ``http.bind``, else the instance's
        ``instance_map`` host, else 127.0.0.1.
        """
        endpoint = self.instance_map.get(self.instance_name)
        port = self.http.port if self.http.port is not None else (endpoint.http_port if endpoint else None)
        if not port:
            return None
        host = self.http.bind or (endpoint.host if endpoint else "127.0.0.1")
        return host, port

    @property
    def main_instance(self) -> str:
        """The instance that runs the TCP replication server and owns unconfigured streams."""
        return next(iter(self.instance_map), self.instance_name) if self.instance_map else self.instance_name


class HostSettings:
    """The part of the core configuration a plugin may read: ``host.settings`` (:class:`~factstream.HostApi`).

    A read-only view of the host's :class:`Settings`, not the settings themselves. A plugin gets what
    it has a use for (the deployment's name, a stream's writers, the caches stream's retention), so
    the rest of the configuration may change shape between releases without breaking plugins, and
    its secrets (the replication secret, the bearer tokens, a database URL with its password) are
    not handed to every plugin. A plugin's own settings come from ``host.plugin_settings(Model)``.
    """

    __slots__ = ("_settings",)

    def __init__(self, settings: Settings) -> None:
        self._settings = settings

    @property
    def deployment(self) -> str:
        """The deployment's name (``deployment``): the server name, also the Redis channel."""
        return self._settings.deployment

    @property
    def caches(self) -> CachesConfig:
        """The caches stream's retention (``caches``: ``retention_seconds``, ``retention_batch_ids``,
        ``retention_interval_seconds``), read by the bundled ``caches`` plugin."""
        return self._settings.caches

    def writers_for(self, stream: str) -> list[str]:
        """The instances configured to write ``stream`` (``stream_writers``); by default the main one."""
        return self._settings.writers_for(stream)

    def http_url_of(self, instance: str) -> str | None:
        """The HTTP base URL of ``instance`` from ``instance_map`` (``http://host:http_port``), or None
        when the map does not give it an HTTP port: what a refusal names so a client knows where to go."""
        endpoint = self._settings.instance_map.get(instance)
        if endpoint is None or not endpoint.http_port:
            return None
        return f"http://{endpoint.host}:{endpoint.http_port}"


def resolve_config_path(path: Path | str | None, environ: Mapping[str, str] | None = None) -> Path | None:
    """Which config file to read: the argument, ``$FACTSTREAM_CONFIG``, ``./factstream.yaml``, or none."""
    env = os.environ if environ is None else environ
    if path is None and env.get("FACTSTREAM_CONFIG"):
        path = env["FACTSTREAM_CONFIG"]
    if path is not None:
        p = Path(path)
        if not p.is_file():
            raise ConfigError(f"config file {str(p)!r} does not exist")
        return p
    default = Path(DEFAULT_CONFIG_FILE)
    return default if default.is_file() else None


def _read_yaml(path: Path) -> dict[str, Any]:
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        raise ConfigError(f"config file {str(path)!r} is not valid YAML{where}: {exc.problem}") from exc
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise ConfigError(f"config file {str(path)!r} cannot be read: {exc}") from exc
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"config file {str(path)!r} must be a mapping of keys to values, not a {type(data).__name__}")
    return data


def _describe(exc: ValidationError, source: str, environ: Mapping[str, str]) -> str:
    lines = []
    for err in exc.errors():
        loc = [str(p) for p in err["loc"]]
        key = ".".join(loc) or "(top level)"
        env_name = ENV_PREFIX + "__".join(loc).upper()
        origin = f" (from environment variable {env_name})" if loc and env_name in environ else ""
        msg = err["msg"].removeprefix("Value error, ")
        if err["type"] == "extra_forbidden":
            msg = "unknown key"
        value = err.get("input")
        hidden = (
            err["type"] in {"extra_forbidden", "missing"}
            or isinstance(value, dict)
            or repr(value) in msg
            or loc[-1:] == ["secret"]  # never echo a secret into logs
        )
        shown = "" if hidden else f" (got {value!r})"
        lines.append(f"{key}{origin}: {msg}{shown}")
    return f"invalid configuration in {source}: " + "; ".join(lines)


def load_config(path: Path | str | None = None, environ: Mapping[str, str] | None = None, **overrides: Any) -> Settings:
    """Read the configuration (file + environment + ``overrides``), or raise :class:`ConfigError`."""
    env = os.environ if environ is None else environ
    resolved = resolve_config_path(path, env)
    data = _read_yaml(resolved) if resolved is not None else {}
    data.update(overrides)
    source = repr(str(resolved)) if resolved is not None else "the environment"
    saved = None
    if environ is not None:  # pydantic-settings reads os.environ; substitute the given mapping
        saved = dict(os.environ)
        os.environ.clear()
        os.environ.update(environ)
    try:
        settings = Settings(**data)
    except ValidationError as exc:
        raise ConfigError(_describe(exc, source, env)) from None
    finally:
        if saved is not None:
            os.environ.clear()
            os.environ.update(saved)
    if resolved is not None:
        # Files named in the configuration are relative to it, like state_dir.
        files = {
            key: (resolved.parent / value).resolve()
            for key in ("tls_cert", "tls_key", "tls_ca")
            if isinstance(value := getattr(settings.replication, key), Path) and not value.is_absolute()
        }
        if files:
            settings = settings.model_copy(update={"replication": settings.replication.model_copy(update=files)})
    if resolved is not None and not settings.state_dir.is_absolute():
        settings = settings.model_copy(update={"state_dir": (resolved.parent / settings.state_dir).resolve()})
    elif not settings.state_dir.is_absolute():
        settings = settings.model_copy(update={"state_dir": settings.state_dir.resolve()})
    return settings
