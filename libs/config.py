"""One typed settings object, read once at start and passed in.

Values come from the environment (``MNEMESH_*``, plus the conventional
``REDIS_URL``, ``DATABASE_URL``, ``QDRANT_URL`` and ``OTEL_EXPORTER_OTLP_ENDPOINT``)
and from an optional TOML file named by ``MNEMESH_CONFIG``. The environment wins.
"""

from __future__ import annotations

import os
import tomllib
from pathlib import Path
from typing import Literal
from urllib.parse import urlsplit, urlunsplit

from pydantic import AliasChoices, Field, SecretStr, ValidationError, field_validator
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    TomlConfigSettingsSource,
)

__all__ = ["PUBLISHED_JWT_SECRETS", "SERVICES", "ConfigError", "ServicePorts", "Settings", "load_settings",
           "redacted"]

# Secrets anyone can read in this repository: the default below and the Kubernetes placeholder.
# Outside development mode a service refuses to start with one of them (see libs/auth.py).
PUBLISHED_JWT_SECRETS = frozenset({"mnemesh-dev-secret-change-me-0123456789",
                                   "change-me-placeholder-dev-only-0123456789abcdef"})


class ServicePorts:
    """Fixed default ports of one service (overridable per setting)."""

    def __init__(self, grpc: int, metrics: int) -> None:
        self.grpc, self.metrics = grpc, metrics


SERVICES: dict[str, ServicePorts] = {
    "memory-writer": ServicePorts(50051, 9101),
    "retriever": ServicePorts(50052, 9102),
    "tool-gateway": ServicePorts(50053, 9103),
    "adapter": ServicePorts(50054, 9104),
    "orchestrator": ServicePorts(50055, 9105),
}


class ConfigError(Exception):
    """A setting is invalid or missing; the message names it and says what to do."""


def _env(*names: str) -> AliasChoices:
    return AliasChoices(*names)


class Settings(BaseSettings):
    model_config = SettingsConfigDict(env_prefix="MNEMESH_", extra="ignore", populate_by_name=True)

    data_dir: Path = Path(".mnemesh")
    # Lets several meshes share one Redis and one database: prefixes stream names and schemas.
    namespace: str = Field("", pattern=r"^[a-z0-9_]{0,32}$")
    host: str = "127.0.0.1"
    # The services' event loop: uvloop (libuv, in C; less CPU per operation, see README) or asyncio's own.
    event_loop: Literal["uvloop", "asyncio"] = "uvloop"
    # This process's name among the replicas of its service (stream consumer names): the host name when
    # empty, which is unique per pod or container; two processes of one service on one host need two.
    replica: str = Field("", pattern=r"^[A-Za-z0-9_.-]{0,64}$")

    # Infrastructure: unset means "embedded" under data_dir (see mnemesh/infra.py).
    redis_url: str | None = Field(None, validation_alias=_env("REDIS_URL", "MNEMESH_REDIS_URL"))
    database_url: str | None = Field(None, validation_alias=_env("DATABASE_URL", "MNEMESH_DATABASE_URL"))
    qdrant_url: str | None = Field(None, validation_alias=_env("QDRANT_URL", "MNEMESH_QDRANT_URL"))
    # The services act as this PostgreSQL role, bound by row-level security; migrations run as the
    # login of DATABASE_URL (the owner). DATABASE_APP_URL: a separate login for the services instead
    # of taking the role over the owner's login (production).
    database_app_role: str = Field("mnemesh_app", pattern=r"^[a-z_][a-z0-9_]{0,62}$")
    database_app_url: str | None = Field(None, validation_alias=_env("DATABASE_APP_URL", "MNEMESH_DATABASE_APP_URL"))
    hnsw_m: int = Field(16, ge=4, le=128, description="HNSW graph degree of the vector index")
    hnsw_ef_construct: int = Field(100, ge=4, le=1000, description="HNSW build-time candidate list size")
    # Retriever embeddings: a local model (no network) or an OpenAI-compatible endpoint.
    embedder: Literal["use-multilingual", "minilm", "openai", "hash"] = "use-multilingual"
    embeddings_url: str | None = None
    embeddings_model: str = "text-embedding-3-small"
    embeddings_api_key: SecretStr = SecretStr("")
    embeddings_dim: int = Field(0, ge=0, description="0: learnt from the endpoint's first answer")
    embedder_threads: int = Field(1, ge=0, le=64, description="threads per forward pass; 0: up to 4 cores")
    # Where a local model runs: "process" (a worker process of its own: no interpreter lock shared with the
    # pipeline) or "thread" (in the service process). README, retriever benchmark, has the measurements.
    embedder_runner: Literal["thread", "process"] = "process"
    index_optimize_seconds: float = Field(30.0, gt=0, description="embedded Qdrant: segment optimizer period")
    bm25_avg_len: float = Field(16.0, gt=0, description="BM25 length normalisation: terms in a typical memory")
    embedded_redis_port: int = Field(16379, ge=1, le=65535)
    embedded_postgres_port: int = Field(15432, ge=1, le=65535)

    # Development mode allows what production must not: today, the published default JWT secret.
    # `make run` and `mnemesh run --dev` set it; nothing else does.
    dev_mode: bool = False

    # Auth: HS256 with a shared secret for development, RS256 (JWKS or PEM) for production.
    auth_enabled: bool = True
    jwt_algorithm: Literal["HS256", "RS256"] = "HS256"
    jwt_secret: SecretStr = SecretStr("mnemesh-dev-secret-change-me-0123456789")
    jwt_jwks_url: str | None = None
    jwt_public_key_file: Path | None = None
    jwt_issuer: str = "mnemesh"
    jwt_audience: str = "mnemesh"
    jwt_leeway_seconds: float = Field(30.0, ge=0, le=300, description="clock skew allowed on exp, nbf and iat")

    # Telemetry.
    otlp_endpoint: str | None = Field(
        None, validation_alias=_env("OTEL_EXPORTER_OTLP_ENDPOINT", "MNEMESH_OTLP_ENDPOINT")
    )
    log_level: Literal["debug", "info", "warning", "error"] = "info"
    metrics_enabled: bool = True

    # Ports; defaults in SERVICES.
    memory_writer_grpc_port: int = Field(SERVICES["memory-writer"].grpc, ge=1, le=65535)
    retriever_grpc_port: int = Field(SERVICES["retriever"].grpc, ge=1, le=65535)
    tool_gateway_grpc_port: int = Field(SERVICES["tool-gateway"].grpc, ge=1, le=65535)
    adapter_grpc_port: int = Field(SERVICES["adapter"].grpc, ge=1, le=65535)
    orchestrator_grpc_port: int = Field(SERVICES["orchestrator"].grpc, ge=1, le=65535)
    memory_writer_metrics_port: int = Field(SERVICES["memory-writer"].metrics, ge=0, le=65535)
    retriever_metrics_port: int = Field(SERVICES["retriever"].metrics, ge=0, le=65535)
    tool_gateway_metrics_port: int = Field(SERVICES["tool-gateway"].metrics, ge=0, le=65535)
    adapter_metrics_port: int = Field(SERVICES["adapter"].metrics, ge=0, le=65535)
    orchestrator_metrics_port: int = Field(SERVICES["orchestrator"].metrics, ge=0, le=65535)
    mcp_http_port: int = Field(8765, ge=1, le=65535)
    # Host headers the MCP endpoint accepts besides loopback ones (DNS rebinding protection), e.g.
    # "tool-gateway:*,mcp.example.com"; the Origin headers browsers may send from those hosts.
    mcp_allowed_hosts: str = ""
    mcp_allowed_origins: str = ""
    # OAuth protected-resource metadata (RFC 9728) of the MCP endpoint: the URL clients reach it at
    # (default: the request's own scheme and Host) and the authorization servers that issue its tokens
    # (comma-separated issuer URLs).
    mcp_resource_url: str = ""
    mcp_authorization_servers: str = ""
    # The tool-gateway's call pipeline: token buckets shared in Redis (calls per second, burst twice
    # that), circuit breakers shared in Redis, results above the cap stored and linked (mem://step/<id>).
    tool_rate_per_caller: float = Field(50.0, gt=0, description="calls/s one caller may make (all tools)")
    tool_rate_per_tool: float = Field(500.0, gt=0, description="calls/s one tool takes (all callers)")
    tool_breaker_failures: int = Field(5, ge=1, description="consecutive failures that open a tool's breaker")
    tool_breaker_error_rate: float = Field(0.5, gt=0, le=1, description="error share over the window that opens it")
    tool_breaker_min_calls: int = Field(20, ge=1, description="calls in the window before the error rate counts")
    tool_breaker_window_seconds: float = Field(30.0, gt=0)
    tool_breaker_open_seconds: float = Field(10.0, gt=0, description="time open before one half-open probe")
    tool_breaker_cache_ms: float = Field(100.0, ge=0, le=10_000, description="how long a replica trusts a breaker "
                                         "it saw closed before asking Redis again (0: every call asks)")
    tool_rate_batch_ms: float = Field(50.0, ge=0, le=10_000, description="a replica takes this long's worth of a "
                                      "bucket's rate in one Redis round trip (at most 64 tokens; 0: one per call)")
    tool_result_max_bytes: int = Field(16_384, ge=256, description="result size past which it is truncated")
    tool_audit_flush_ms: float = Field(50.0, gt=0, le=60_000, description="how long audit rows of calls gather "
                                       "before they are written in one batch")
    tool_result_ttl_hours: float = Field(24.0, gt=0, description="how long full results stay readable")
    tool_chain_ttl_seconds: float = Field(3600.0, gt=0, description="how long a tool chain's state lives after "
                                                                    "its last step")
    tool_chain_max_steps: int = Field(256, ge=1, le=100_000, description="steps one tool chain may hold (a new "
                                                                         "step past them is refused chain_full)")
    tool_task_ttl_seconds: float = Field(86_400.0, gt=0, description="how long a task's state and result stay "
                                                                    "readable (GetTask, MCP tasks/get)")
    tool_relay_timeout_seconds: float = Field(120.0, gt=0, le=3600, description="how long an upstream's "
                                              "sampling or elicitation request relayed to the calling MCP client "
                                              "waits for its answer")
    tool_tasks_per_caller: int = Field(16, ge=1, le=10_000, description="working tasks one caller (tenant and "
                                                                         "subject) may have at once")
    tool_task_lease_seconds: float = Field(15.0, gt=0, description="a working task whose replica has not renewed "
                                                                   "its lease for this long answers failed (lost)")
    tool_upstreams_file: str = Field("", description="JSON file of upstream MCP servers to federate")
    tool_upstream_commands: str = Field("", description="executables AddUpstream may start as stdio upstreams "
                                                        "(comma-separated, e.g. uvx,npx); empty: URLs only")
    tool_upstream_poll_seconds: float = Field(2.0, gt=0, description="how often a replica picks up upstreams "
                                                                      "added or removed through another one")
    tool_list_experience: bool = Field(True, description="tools/list appends each tool's experience note")
    tool_adapter_token: SecretStr = Field(SecretStr(""), description="the gateway's token for Adapter.Invoke")

    adapter_backends: str = Field("", description="legacy backends, id=kind:location,...")
    # The tool-gateway the adapter registers its tools with (default: host and tool-gateway gRPC port),
    # and the service token it sends (needs tools:admin); unset with HS256: minted from jwt_secret.
    adapter_gateway_address: str = ""
    adapter_gateway_token: SecretStr | None = None
    # Backend secrets, JSON: {"name": {"type": "basic"|"wsse_text"|"wsse_digest", "username": ..., "password": ...}};
    # an import names one (options.credentials); tool arguments never carry them.
    adapter_credentials: SecretStr = SecretStr("")
    adapter_wsdl_dir: Path | None = Field(None, description="WSDL files ImportWsdl(path) may read (default data_dir/wsdl)")
    adapter_concurrency_per_endpoint: int = Field(8, ge=1, le=256, description="concurrent calls per SOAP endpoint")
    # COM objects (Windows hosts with pywin32): JSON file of backend id -> ProgID and method allow-list.
    adapter_com_file: Path | None = Field(None, description="JSON file of COM objects the adapter exposes (Windows)")

    # Streams.
    stream_max_deliveries: int = Field(5, ge=1, description="deliveries before a message is dead-lettered")
    stream_min_idle_ms: int = Field(30_000, ge=100, description="idle time before a pending entry is reclaimed")
    stream_maxlen: int = Field(100_000, ge=1000, description="length past which streams are trimmed")
    stream_retention_hours: float = Field(24.0, gt=0, description="entries younger than this are never trimmed")
    outbox_poll_seconds: float = Field(0.5, gt=0)
    housekeeping_seconds: float = Field(60.0, gt=0, description="how often streams are trimmed and tables purged")
    processed_retention_days: float = Field(7.0, gt=0, description="how long processed-event ids are kept")
    # The memory-writer's master key: file:<path> (development; `file:` alone is <data_dir>/master.key) or
    # pkcs11:<library .so>|<token label>|<key label> for an HSM, with its PIN below.
    master_key: str = Field("file:", description="key provider of the memory-writer's master key")
    pkcs11_pin: SecretStr = Field(SecretStr(""), description="PIN of the PKCS#11 token holding the master key")
    # The memory-writer's sweeper: expiry, decay, archive (one replica at a time holds its Redis lease).
    memory_sweep_seconds: float = Field(30.0, gt=0, description="how often the sweeper runs")
    memory_archive_after_days: float = Field(90.0, gt=0, description="idle time after which a memory is archived")
    memory_engagement_half_life_days: float = Field(30.0, gt=0, description="half-life of the engagement score")
    # Session compression: the context window it protects; an OpenAI-compatible endpoint for the
    # abstractive and hybrid strategies (none: extractive only).
    memory_context_window_tokens: int = Field(8_000, ge=256, description="context window compression protects")
    memory_compress_turns: int = Field(10, ge=2, description="uncovered turns that trigger compression")
    memory_compress_share: float = Field(0.65, gt=0, le=1, description="token share of the window that triggers it")
    llm_base_url: str = Field("", description="OpenAI-compatible endpoint, e.g. http://127.0.0.1:11434/v1")
    llm_model: str = Field("", description="model name for the LLM endpoint")
    llm_api_key: SecretStr = Field(SecretStr(""), description="API key of the LLM endpoint, if it needs one")
    # The memory-writer takes commands in batches: one transaction per batch (and tenant).
    memory_batch_size: int = Field(200, ge=1, le=1000, description="commands read and written per batch")
    memory_batch_block_ms: int = Field(500, ge=1, le=60_000, description="how long a batch read waits for commands")
    # A stream batch is CPU-bound Python: one process uses one core (README, "Worker processes").
    memory_writer_workers: int = Field(default_factory=lambda: min(2, os.cpu_count() or 1), ge=1, le=8,
                                       description="memory-writer processes `mnemesh run` starts, all consuming "
                                                   "the commands stream (default: 2, or 1 on a one-core machine)")
    memory_batches_in_flight: int = Field(2, ge=1, le=8, description="command batches handled at once (one user's in "
                                                                      "stream order)")
    memory_burst_limit: int = Field(120, ge=1, description="writes of one user per minute before the poisoning guard"
                                    " quarantines the rest of the burst")
    memory_sensitive_contacts: str = Field("", description="tenants whose phone numbers and e-mails are sensitive"
                                           " (sealed, redacted): comma-separated tenant ids, or * for every tenant")

    # At most 3 s: a service then stops within 6.5 s, and `mnemesh run` as a whole within 10 s.
    shutdown_grace_seconds: float = Field(2.5, ge=0, le=3, description="time in-flight calls get to finish")

    @field_validator("redis_url")
    @classmethod
    def _redis_scheme(cls, value: str | None) -> str | None:
        if value and not value.startswith(("redis://", "rediss://", "unix://")):
            raise ValueError("must start with redis://, rediss:// or unix://")
        return value

    @field_validator("jwt_secret")
    @classmethod
    def _secret_length(cls, value: SecretStr) -> SecretStr:
        if len(value.get_secret_value().encode()) < 32:
            raise ValueError("must be at least 32 bytes for HS256 (RFC 7518 section 3.2)")
        return value

    @field_validator("database_url", "database_app_url")
    @classmethod
    def _pg_scheme(cls, value: str | None) -> str | None:
        if value and not value.startswith(("postgresql://", "postgres://")):
            raise ValueError("must start with postgresql://")
        return value

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        sources: list[PydanticBaseSettingsSource] = [init_settings, env_settings]
        config_file = os.environ.get("MNEMESH_CONFIG")
        if config_file:
            sources.append(TomlConfigSettingsSource(settings_cls, toml_file=Path(config_file)))
        return tuple(sources)

    def grpc_port(self, service: str) -> int:
        return getattr(self, f"{service.replace('-', '_')}_grpc_port")

    def metrics_port(self, service: str) -> int:
        return getattr(self, f"{service.replace('-', '_')}_metrics_port")


def _setting_name(loc: tuple[object, ...]) -> str:
    field = str(loc[0]) if loc else "?"
    if field.isupper():  # an alias such as REDIS_URL
        return field
    return f"MNEMESH_{field.upper()}"


_SECRET_FIELDS = {"jwt_secret", "database_url", "redis_url", "qdrant_url", "database_app_url", "REDIS_URL",
                  "adapter_credentials", "adapter_gateway_token",
                  "DATABASE_URL", "QDRANT_URL", "DATABASE_APP_URL"}


def _shown(loc: tuple[object, ...], value: object) -> str:
    """The refused value, unless it may hold a secret (a key, a URL with a password)."""
    return "<hidden>" if loc and str(loc[0]) in _SECRET_FIELDS else repr(value)


def _check_config_file(path: Path) -> None:
    """The file must parse and name only known settings: a misspelt key must not pass silently."""
    if not path.is_file():
        raise ConfigError(f"MNEMESH_CONFIG points to {str(path)!r}, which is not a file: fix or unset it")
    try:
        keys = tomllib.loads(path.read_text())
    except (tomllib.TOMLDecodeError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path} (MNEMESH_CONFIG) is not valid TOML: {exc}") from None
    known = set(Settings.model_fields)
    unknown = sorted(set(keys) - known)
    if unknown:
        raise ConfigError(f"{path} (MNEMESH_CONFIG) has unknown settings {', '.join(unknown)}; "
                          "known ones are the fields of libs/config.py Settings, e.g. data_dir, log_level")


def load_settings(**overrides: object) -> Settings:
    """Read the settings once; raise ConfigError naming each bad setting."""
    config_file = os.environ.get("MNEMESH_CONFIG")
    if config_file:
        _check_config_file(Path(config_file))
    try:
        return Settings(**overrides)
    except ValidationError as exc:
        problems = [
            f"{_setting_name(err['loc'])}={_shown(err['loc'], err.get('input'))}: {err['msg']}" for err in exc.errors()
        ]
        raise ConfigError("invalid configuration: " + "; ".join(problems)) from None


def redacted(url: str) -> str:
    """`url` fit to print: a password in it is replaced by ***."""
    parts = urlsplit(url)
    if not parts.password:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
    return urlunsplit(parts._replace(netloc=netloc))
