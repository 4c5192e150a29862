"""Settings from the environment. Built by ``create_app`` / the CLI, never at import."""

from __future__ import annotations

import ipaddress
from pathlib import Path
from typing import Annotated, Literal

import platformdirs
from pydantic import AliasChoices, Field, ValidationError, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from app.storage import dsn

MiB = 1024 * 1024


def split_list(value: str) -> list[str]:
    """The entries of a comma-separated setting, trimmed, empty ones dropped."""
    return [entry.strip() for entry in value.split(",") if entry.strip()]


def _default_data_dir() -> Path:
    return Path(platformdirs.user_data_dir("messagex"))


class Settings(BaseSettings):
    """Every setting the contract names (§11), plus the broker's own ``MESSAGEX_*`` ones."""

    model_config = SettingsConfigDict(env_prefix="MESSAGEX_", extra="ignore", frozen=True)

    database_url: Annotated[
        str | None, Field(validation_alias=AliasChoices("DATABASE_URL", "MESSAGEX_DATABASE_URL"))
    ] = None
    ack_timeout_seconds: Annotated[
        int, Field(ge=1, validation_alias=AliasChoices("ACK_TIMEOUT_SECONDS"))
    ] = 30
    ack_timeout_check_interval_ms: Annotated[
        int, Field(ge=10, validation_alias=AliasChoices("ACK_TIMEOUT_CHECK_INTERVAL_MS"))
    ] = 5000

    host: str = "127.0.0.1"
    port: Annotated[int, Field(ge=0, le=65535)] = 8000
    data_dir: Path = Field(default_factory=_default_data_dir)
    admin_user: str | None = None
    admin_password: str | None = None
    max_message_bytes: Annotated[int, Field(ge=1)] = MiB
    max_request_bytes: Annotated[int, Field(ge=1024)] = 16 * MiB
    #: a message's headers and properties together, as compact JSON (contract §1)
    max_header_bytes: Annotated[int, Field(ge=1024)] = 64 * 1024
    #: subscriptions one WebSocket connection may hold (contract §8)
    max_subscriptions_per_connection: Annotated[int, Field(ge=1)] = 100
    #: WebSocket connections one user may hold, across every broker process (contract §8)
    max_connections_per_user: Annotated[int, Field(ge=1)] = 1000
    #: bytes waiting to be sent to one WebSocket connection (its outbox and its socket's
    #: write buffer) past which it is sent no more deliveries until it reads (contract §8)
    max_connection_buffer_bytes: Annotated[int, Field(ge=64 * 1024)] = 16 * MiB
    session_ttl_seconds: Annotated[int, Field(ge=1)] = 86400
    allowed_origins: str = ""
    #: Host header names (any port) requests may carry, comma-separated, or "*"; "" = only
    #: localhost, 127.0.0.1 and [::1] when listening on loopback, any host otherwise
    allowed_hosts: str = ""
    #: addresses and networks (comma-separated) whose X-Forwarded-For / Forwarded are
    #: believed; "" = none: the client address is the socket's peer
    trusted_proxies: str = ""
    log_level: str = "info"
    log_format: str = "json"
    db_pool_size: Annotated[int, Field(ge=1, le=500)] = 10
    db_max_overflow: Annotated[int, Field(ge=0, le=500)] = 10
    db_connect_timeout_seconds: Annotated[float, Field(gt=0)] = 5.0
    db_pool_timeout_seconds: Annotated[float, Field(gt=0)] = 5.0
    db_statement_timeout_ms: Annotated[int, Field(ge=0)] = 30_000
    #: how DATABASE_URL reaches PostgreSQL: "session" (directly, or a pooler in session mode)
    #: or "transaction" (a pooler in transaction mode, such as PgBouncer's): docs/operations.md
    database_pool_mode: Literal["session", "transaction"] = "session"
    #: a URL that reaches PostgreSQL without a transaction pooler, for the LISTEN connection;
    #: None: DATABASE_URL, or polling when that is transaction-pooled
    listen_database_url: str | None = None
    #: warn (log) when a snapshot held on the database (a session's transaction, a replication
    #: slot) has kept VACUUM from cleaning up for longer than this; 0: never
    xmin_warn_seconds: Annotated[float, Field(ge=0)] = 300.0
    migrate_on_start: bool = True
    #: at most this many concurrent publish calls share one INSERT (group commit); 1 = none
    publish_group_max: Annotated[int, Field(ge=1, le=1000)] = 256
    #: at most this many bindings are kept compiled per broker process (least recently
    #: published-to exchanges dropped first); 0 reads every exchange's bindings per publish
    routing_cache_bindings: Annotated[int, Field(ge=0)] = 200_000
    #: how old the message counts of ``/overview`` may be once there are 100,000 messages
    #: or more (counting them is slow); 0 counts them for every request
    overview_max_age_ms: Annotated[int, Field(ge=0)] = 5000
    #: ``/metrics`` exports per-queue gauges for at most this many queues (the deepest); 0: none
    metrics_max_queues: Annotated[int, Field(ge=0, le=100_000)] = 1000
    #: the charts' history samples message rates and queue depths this often (seconds; the
    #: same on every broker process sharing the database)
    history_interval_seconds: Annotated[int, Field(ge=1, le=60)] = 5
    #: OpenTelemetry spans for publish, delivery and settlement (needs ``messagex[otel]``)
    tracing: bool = False
    #: broker processes ``messagex serve`` runs on one port (each a whole broker)
    workers: Annotated[int, Field(ge=1, le=64)] = 1
    #: Argon2id cost of new password hashes (RFC 9106 "second recommended" by default);
    #: stored hashes with other parameters are re-hashed at the next successful login.
    argon2_time_cost: Annotated[int, Field(ge=1, le=20)] = 3
    argon2_memory_kib: Annotated[int, Field(ge=1024, le=4 * 1024 * 1024)] = 65536
    argon2_parallelism: Annotated[int, Field(ge=1, le=64)] = 4
    #: passwords set with PUT /users have at least this many characters (and at most 1024)
    min_password_length: Annotated[int, Field(ge=1, le=1024)] = 8
    #: verified Basic credentials are cached this long (contract: at most 5 s)
    auth_cache_seconds: Annotated[float, Field(ge=0, le=5)] = 5.0
    #: permessage-deflate (RFC 7692) for WebSocket clients that offer it. Off by default, as in
    #: RabbitMQ's Web STOMP and Web MQTT: it costs the broker about a quarter more CPU per
    #: delivered message (docs/performance.md), and clients offer it by default.
    ws_compression: bool = False
    #: a WebSocket that sent nothing for this long is pinged (0: never); one that does not
    #: answer within ``ws_ping_timeout_seconds`` is closed (1011) and its deliveries released
    ws_ping_interval_seconds: Annotated[float, Field(ge=0, le=3600)] = 30.0
    ws_ping_timeout_seconds: Annotated[float, Field(gt=0, le=3600)] = 20.0

    @field_validator("database_url")
    @classmethod
    def _check_database_url(cls, value: str | None) -> str | None:
        if value in (None, ""):
            return None
        assert value is not None
        return dsn.check(value)

    @field_validator("listen_database_url")
    @classmethod
    def _check_listen_database_url(cls, value: str | None) -> str | None:
        return cls._check_database_url(value)

    @field_validator("trusted_proxies")
    @classmethod
    def _check_trusted_proxies(cls, value: str) -> str:
        for entry in split_list(value):
            try:
                ipaddress.ip_network(entry, strict=False)
            except ValueError:
                raise ValueError(f"{entry!r} is not an IP address or network") from None
        return value

    @field_validator("log_level")
    @classmethod
    def _check_log_level(cls, value: str) -> str:
        if value.lower() not in ("critical", "error", "warning", "info", "debug"):
            raise ValueError("must be one of critical, error, warning, info, debug")
        return value.lower()

    @property
    def ws_max_frame_bytes(self) -> int:
        """Largest inbound WebSocket frame: a maximal message as base64 plus its envelope."""
        return self.max_message_bytes * 4 // 3 + 64 * 1024


class SettingsError(Exception):
    """Settings are invalid; the message is one line fit for a log."""


def _env_name(loc: tuple[int | str, ...]) -> str:
    """The environment variable a validation error is about (``port`` → ``MESSAGEX_PORT``)."""
    if not loc:
        return "settings"
    name = str(loc[0])
    field = Settings.model_fields.get(name)
    if field is None:
        return name  # already an alias such as DATABASE_URL
    alias = field.validation_alias
    if isinstance(alias, AliasChoices):
        return str(alias.choices[0])
    return f"MESSAGEX_{name.upper()}"


def load_settings(**overrides: object) -> Settings:
    try:
        return Settings(**overrides)  # type: ignore[arg-type]
    except ValidationError as exc:
        problems = "; ".join(
            f"{_env_name(err['loc'])}: {err['msg']}" for err in exc.errors(include_input=False)
        )
        raise SettingsError(f"invalid settings: {problems}") from None
