"""Configuration: a TOML file decoded into msgspec Structs.

Errors name the key and the expected type (msgspec's `Expected `int`, got `str` - at
`$.server.port``), and unknown keys are refused, so a typo never passes silently.
`config.example.toml` documents every option with its default.
"""

from __future__ import annotations

import msgspec


class ServerConfig(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    host: str = "127.0.0.1"
    port: int = 27017
    # host:port drivers are told to connect to (hello's hosts/primary/me); default host:port.
    advertised_host: str = ""
    set_name: str = "cdcserver"
    idle_cursor_timeout_s: float = 600.0
    max_connections: int = 10_000
    # configureFailPoint (failCommand, failGetMoreAfterCursorCheckout) for resume tests; false
    # removes the command (CommandNotFound), as on a mongod without enableTestCommands.
    enable_fail_points: bool = True
    # Largest message a client may send (mongod's maxMessageSizeBytes); larger frames close
    # that connection.
    max_message_bytes: int = 48_000_000
    # Close a connection that sends nothing for this long (0: never).
    idle_connection_timeout_s: float = 0.0
    # On SIGTERM/SIGINT: how long in-flight requests (awaitData getMores) get to finish.
    shutdown_grace_s: float = 5.0


class SourceConfig(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    # Recorded oplogs to serve (mongodump BSON or Extended JSON lines), in timestamp order.
    oplog: list[str] = msgspec.field(default_factory=list)
    # Keep reading the last file as it grows.
    follow: bool = False


class StoreConfig(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    # The embedded store (served when no recorded oplog is given).
    data_dir: str = "./cdcserver-data"
    in_memory: bool = False
    synchronous: str = "full"  # off | normal | full | extra
    oplog_size_mb: int = 1024
    noop_interval_s: float = 10.0
    # A transaction's applyOps is split into entries chained with partialTxn past these.
    txn_oplog_entry_bytes: int = 16 * 1024 * 1024
    txn_oplog_entry_ops: int = 2_147_483_647


class UpstreamConfig(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    # A live replica set to tail and serve (`--upstream`); empty: not this mode. See
    # config.example.toml [upstream] and cdcserver/sources/mongo.py.
    uri: str = ""
    batch_size: int = 1000
    max_await_ms: int = 1000
    window_entries: int = 100_000
    window_bytes: int = 256 * 1024 * 1024
    history_batch: int = 1000
    history_keep: int = 20_000
    history_segments: int = 16
    history_idle_s: float = 60.0
    majority_poll_ms: float = 2.0
    backoff_initial_ms: float = 50.0
    backoff_max_ms: float = 5000.0
    oldest_refresh_s: float = 5.0
    lookup_timeout_ms: float = 2000.0
    uuid_cache_s: float = 1.0
    # Extra pymongo client options (beyond the URI's), e.g. {serverSelectionTimeoutMS = 5000}.
    client_options: dict[str, str | int | float | bool] = msgspec.field(default_factory=dict)


class ScramCredentials(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    # RFC 5802 stored credentials, base64; `cdcserver hash-password` makes them.
    iteration_count: int
    salt: str
    stored_key: str
    server_key: str


class RoleConfig(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    role: str  # read | readWrite | readAnyDatabase | readWriteAnyDatabase | root | ...
    db: str = "admin"


class UserConfig(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    user: str
    db: str = "admin"  # the authentication database
    roles: list[RoleConfig] = msgspec.field(default_factory=list)
    scram_sha_256: ScramCredentials | None = None
    scram_sha_1: ScramCredentials | None = None


class AuthConfig(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    # Off: every client may run every command (bind to 127.0.0.1 then).
    enabled: bool = False
    mechanisms: list[str] = msgspec.field(
        default_factory=lambda: ["SCRAM-SHA-256", "SCRAM-SHA-1"]
    )
    users: list[UserConfig] = msgspec.field(default_factory=list)


class TlsConfig(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    # TLS on the wire listener: PEM certificate chain and its key (one file may hold both).
    enabled: bool = False
    certificate_file: str = ""
    key_file: str = ""
    # CA bundle to verify client certificates against; empty: none asked for.
    ca_file: str = ""
    # With ca_file: refuse clients that present no certificate.
    require_client_certificate: bool = False


class MetricsConfig(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    # Prometheus text exposition at http://host:port/metrics (port 0: any free port, logged).
    enabled: bool = True
    host: str = "127.0.0.1"
    port: int = 9216


class LogConfig(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    level: str = "info"
    format: str = "text"  # text | json


class Config(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    server: ServerConfig = msgspec.field(default_factory=ServerConfig)
    store: StoreConfig = msgspec.field(default_factory=StoreConfig)
    source: SourceConfig = msgspec.field(default_factory=SourceConfig)
    upstream: UpstreamConfig = msgspec.field(default_factory=UpstreamConfig)
    log: LogConfig = msgspec.field(default_factory=LogConfig)
    auth: AuthConfig = msgspec.field(default_factory=AuthConfig)
    tls: TlsConfig = msgspec.field(default_factory=TlsConfig)
    metrics: MetricsConfig = msgspec.field(default_factory=MetricsConfig)


class ConfigError(ValueError):
    pass


def load_config(path: str | None) -> Config:
    if path is None:
        return Config()
    try:
        with open(path, "rb") as f:
            data = f.read()
    except OSError as exc:
        raise ConfigError(f"{path}: {exc.strerror or exc}") from None
    try:
        return msgspec.toml.decode(data, type=Config)
    except msgspec.ValidationError as exc:
        raise ConfigError(f"{path}: {exc}") from None
    except msgspec.DecodeError as exc:
        raise ConfigError(f"{path}: invalid TOML: {exc}") from None
