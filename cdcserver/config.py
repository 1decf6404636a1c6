"""Configuration: a TOML file decoded into msgspec Structs, then CDCSERVER_<SECTION>_<KEY>
environment variables, then command-line flags.

Every error is reported at once and names its key (msgspec's `Expected `int`, got `str``,
walked key by key), and so are the values startup would refuse (semantic_errors); unknown
keys are refused, so a typo never passes silently. `cdcserver check-config FILE` prints them.
`config.example.toml` documents every option with its default; `cdcserver config --defaults`
prints the package's copy of it (cdcserver/data/).
"""

from __future__ import annotations

import base64
import binascii
import datetime
import os
import typing
from collections.abc import Mapping
from typing import Any

import msgspec

from cdcserver.roles import parse_role
from pipeline_stages.release import RELEASES


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
    # The embedded store as a sharded cluster: this many shards behind a mongos front
    # (`--shards N`; 0: one replica set).
    shards: int = 0
    # The address the shards' own ports listen on (each a free port). Loopback unless set:
    # they take the same [auth] and [tls] as the front, but clients are meant to use the front.
    shards_host: str = "127.0.0.1"
    # mongod's net.unixDomainSocket: also listen on <unix_socket_prefix>/mongodb-<port>.sock
    # with these permissions (octal), as mongod does by default (`--nounixsocket`,
    # `--unixSocketPrefix`, `--filePermissions`).
    unix_socket: bool = True
    unix_socket_prefix: str = "/tmp"
    unix_socket_permissions: str = "0700"
    # The MongoDB release answered as: "8.0" or "9.0" (version, wire version, $changeStream
    # options, serverStatus counters). A sidecar answers as its upstream, whatever this says.
    compatibility: str = "8.0"


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
    # mongod's oplogMinRetentionHours: entries younger than this outlive the size; 0: none.
    oplog_min_retention_hours: float = 0.0
    noop_interval_s: float = 10.0
    # A transaction's applyOps is split into entries chained with partialTxn past these.
    txn_oplog_entry_bytes: int = 16 * 1024 * 1024
    txn_oplog_entry_ops: int = 2_147_483_647
    ttl_monitor_sleep_secs: float = 60.0  # TTL index pass interval (mongod's); 0: off
    transaction_lifetime_limit_seconds: float = 60.0  # older transactions abort; 0: never


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
    # The durable log of what was tailed (cdcserver/sources/retained.py): its directory ("":
    # none), kept until either limit is exceeded (0: no limit of that kind).
    retain_dir: str = ""
    retain_mb: float = 1024
    retain_hours: float = 168.0
    # Namespaces copied and kept up to date from the tail, with their documents' versions
    # (cdcserver/materialize/): "db.coll" or "db.*"; needs retain_dir.
    materialize: list[str] = msgspec.field(default_factory=list)
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
    # Unset: 9216, or a free port (logged with a warning) when something else holds 9216; a
    # port that is set must be free (startup fails otherwise).
    port: int | None = None


class LogConfig(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    level: str = "info"
    format: str = "text"  # text | json
    # Commands slower than this are logged as "Slow query" (mongod's slowms).
    slow_ms: int = 100


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
    """Every problem found in a configuration, each naming its key (`errors`)."""

    def __init__(self, errors: list[str] | str, source: str | None = None) -> None:
        self.errors = [errors] if isinstance(errors, str) else list(errors)
        self.source = source
        prefix = f"{source}: " if source else ""
        if len(self.errors) == 1:
            text = prefix + self.errors[0]
        else:
            text = f"{prefix}{len(self.errors)} errors\n" + "\n".join(
                f"  {e}" for e in self.errors
            )
        super().__init__(text)


# Environment overrides: CDCSERVER_<SECTION>_<KEY>=<TOML value or plain string>.
ENV_PREFIX = "CDCSERVER_"
# Lists of tables are too structured for one variable: only a file sets them.
FILE_ONLY_KEYS = frozenset({"auth.users"})
_TOML_TYPES = (datetime.datetime, datetime.date, datetime.time)


def sections() -> dict[str, type[msgspec.Struct]]:
    """Section name ([server], [store], ...) -> its Struct."""
    return {f.name: f.type for f in msgspec.structs.fields(Config)}


def _env_value(raw: str, field_type: Any) -> Any:
    """A TOML value where the text is one (numbers, booleans, arrays, inline tables), else
    the text itself; a `str` key takes the text as is unless it is a quoted TOML string."""
    try:
        parsed = msgspec.toml.decode(f"v = {raw}\n".encode())
    except msgspec.DecodeError:
        return raw
    if set(parsed) != {"v"}:  # text with newlines that happened to parse as more keys
        return raw
    value = parsed["v"]
    if field_type is str and not isinstance(value, str):
        return raw
    return value


def env_overrides(
    env: Mapping[str, str],
) -> tuple[dict[str, dict[str, Any]], dict[str, str], list[str]]:
    """The overrides that `env` sets: ({section: {key: value}}, {"section.key": variable},
    errors). Only variables whose SECTION part names a section are read (others, such as
    CDCSERVER_SPARK_MILLION, belong to someone else); among those an unknown key is an error."""
    known = sections()
    by_length = sorted(known, key=len, reverse=True)  # longest section name wins
    values: dict[str, dict[str, Any]] = {}
    origins: dict[str, str] = {}
    errors: list[str] = []
    for variable in sorted(env):
        if not variable.upper().startswith(ENV_PREFIX):
            continue
        rest = variable[len(ENV_PREFIX):].lower()
        section = next((s for s in by_length if rest.startswith(s + "_")), None)
        if section is None:
            continue
        key = rest[len(section) + 1:]
        fields = {f.name: f for f in msgspec.structs.fields(known[section])}
        if key not in fields:
            errors.append(
                f"{variable}: [{section}] has no key {key!r}"
                f" (keys: {', '.join(sorted(fields))})"
            )
            continue
        if f"{section}.{key}" in FILE_ONLY_KEYS:
            errors.append(f"{variable}: {section}.{key} can only be set in the config file")
            continue
        values.setdefault(section, {})[key] = _env_value(env[variable], fields[key].type)
        origins[f"{section}.{key}"] = variable
    return values, origins, errors


def _struct_of(tp: Any) -> type[msgspec.Struct] | None:
    """The Struct in `tp` (itself, or the non-None side of `Struct | None`)."""
    if isinstance(tp, type) and issubclass(tp, msgspec.Struct):
        return tp
    args = [a for a in typing.get_args(tp) if a is not type(None)]
    if len(args) == 1 and type(None) in typing.get_args(tp):
        return _struct_of(args[0])
    return None


def _convert(value: Any, tp: Any) -> Any:
    return msgspec.convert(value, tp, str_keys=True, builtin_types=_TOML_TYPES)


_DROP = object()  # _check's "nothing valid here"


def _check(value: Any, tp: Any, path: str, errors: list[tuple[str, str]]) -> Any:
    """Validate `value` against `tp`, recording every error (msgspec stops at the first, so
    Structs and lists of Structs are walked key by key). Returns the value with the invalid
    keys left out (_DROP when nothing of it stands), so the rest can be checked for meaning."""
    struct = _struct_of(tp)
    if struct is not None and isinstance(value, dict):
        fields = {f.name: f for f in msgspec.structs.fields(struct)}
        kept = {}
        for key, item in value.items():
            where = f"{path}.{key}" if path else str(key)
            if key not in fields:
                what = "section" if not path else "key"
                errors.append((where, f"unknown {what} (expected one of: "
                                      f"{', '.join(sorted(fields))})"))
                continue
            clean = _check(item, fields[key].type, where, errors)
            if clean is not _DROP:
                kept[key] = clean
        for name, f in fields.items():
            if f.required and name not in value:
                errors.append((f"{path}.{name}" if path else name, "required key missing"))
        if any(f.required and n not in kept for n, f in fields.items()):
            return _DROP  # without a required key the table itself cannot stand
        return kept
    if typing.get_origin(tp) is list and isinstance(value, list):
        (item_type,) = typing.get_args(tp)
        if _struct_of(item_type) is not None:
            items = (_check(item, item_type, f"{path}[{i}]", errors)
                     for i, item in enumerate(value))
            return [item for item in items if item is not _DROP]
    try:
        _convert(value, tp)
    except msgspec.ValidationError as exc:
        message, _, at = str(exc).partition(" - at `$")
        errors.append((path + at.rstrip("`"), message))
        return _DROP
    return value


# What startup needs beyond types. Keep in step with the code that uses each option.
LOG_LEVELS = ("debug", "info", "warning", "error", "critical")
LOG_FORMATS = ("text", "json")
SYNCHRONOUS = ("off", "normal", "full", "extra")  # SQLite's PRAGMA synchronous
MECHANISMS = ("SCRAM-SHA-256", "SCRAM-SHA-1")
# Lower bounds of numeric keys: (bound, inclusive).
_MINIMUM: dict[str, tuple[float, bool]] = {
    "server.idle_cursor_timeout_s": (0, False),
    "server.max_connections": (1, True),
    "server.max_message_bytes": (1, True),
    "server.idle_connection_timeout_s": (0, True),
    "server.shutdown_grace_s": (0, True),
    "store.oplog_size_mb": (1, True),
    "store.oplog_min_retention_hours": (0, True),
    "log.slow_ms": (0, True),
    "store.noop_interval_s": (0, True),
    "store.txn_oplog_entry_bytes": (1, True),
    "store.txn_oplog_entry_ops": (1, True),
    "store.transaction_lifetime_limit_seconds": (0, True),
    "upstream.batch_size": (1, True),
    "upstream.max_await_ms": (0, True),
    "upstream.window_entries": (1, True),
    "upstream.window_bytes": (1, True),
    "upstream.history_batch": (1, True),
    "upstream.history_keep": (1, True),
    "upstream.history_segments": (1, True),
    "upstream.history_idle_s": (0, False),
    "upstream.majority_poll_ms": (0, False),
    "upstream.backoff_initial_ms": (0, False),
    "upstream.backoff_max_ms": (0, False),
    "upstream.oldest_refresh_s": (0, False),
    "upstream.lookup_timeout_ms": (0, False),
    "upstream.uuid_cache_s": (0, True),
    "upstream.retain_mb": (0, True),
    "upstream.retain_hours": (0, True),
}


def _port_ok(port: int) -> bool:
    return 0 <= port <= 65535


def _check_credentials(creds: ScramCredentials, key_bytes: int, path: str,
                       errors: list[tuple[str, str]]) -> None:
    if creds.iteration_count < 4096:  # RFC 7677's minimum; cdcserver.auth refuses fewer
        errors.append((f"{path}.iteration_count", "must be at least 4096"))
    for name in ("salt", "stored_key", "server_key"):
        try:
            raw = base64.b64decode(getattr(creds, name), validate=True)
        except (binascii.Error, ValueError):
            errors.append((f"{path}.{name}", "not valid base64"))
            continue
        if name == "salt" and not raw:
            errors.append((f"{path}.salt", "must not be empty"))
        elif name != "salt" and len(raw) != key_bytes:
            errors.append((f"{path}.{name}", f"must decode to {key_bytes} bytes, not {len(raw)}"))


def _check_uri(uri: str) -> str | None:
    if not uri.startswith(("mongodb://", "mongodb+srv://")):
        return "not a mongodb:// or mongodb+srv:// URI"
    if uri.startswith("mongodb+srv://"):
        # parse_uri would resolve the SRV record here; the host part is all we can check.
        host = uri[len("mongodb+srv://"):].split("/")[0].rpartition("@")[2]
        if not host or ":" in host or "," in host:
            return "mongodb+srv:// takes one host name, without a port"
        return None
    from pymongo.uri_parser import parse_uri  # only when there is a URI to check

    try:
        parse_uri(uri)
    except Exception as exc:  # pymongo's InvalidURI, ConfigurationError, ValueError...
        return str(exc)
    return None


def semantic_errors(config: Config) -> list[tuple[str, str]]:
    """What a well-typed config can still get wrong (values startup would refuse), as
    (key, message) pairs."""
    errors: list[tuple[str, str]] = []
    sv, st, src, up = config.server, config.store, config.source, config.upstream
    for path, (bound, inclusive) in _MINIMUM.items():
        section, key = path.split(".")
        value = getattr(getattr(config, section), key)
        if value < bound or (value == bound and not inclusive):
            errors.append((path, f"must be {'at least' if inclusive else 'more than'} "
                                 f"{bound:g}, got {value}"))
    if not _port_ok(sv.port):
        errors.append(("server.port", f"must be 0..65535, got {sv.port}"))
    if not sv.host:
        errors.append(("server.host", "must not be empty"))
    if sv.advertised_host:
        _, colon, port = sv.advertised_host.rpartition(":")
        if not colon or not port.isdigit() or not _port_ok(int(port)):
            errors.append(("server.advertised_host", "must be host:port"))
    if not sv.set_name:
        errors.append(("server.set_name", "must not be empty"))
    if sv.compatibility not in RELEASES:
        errors.append(("server.compatibility", "must be one of "
                       + ", ".join(f'"{name}"' for name in RELEASES)
                       + f", got {sv.compatibility!r}"))
    if sv.unix_socket and not sv.unix_socket_prefix:
        errors.append(("server.unix_socket_prefix", "must not be empty (or set "
                                                    "server.unix_socket = false)"))
    if unix_socket_mode(sv.unix_socket_permissions) is None:
        errors.append(("server.unix_socket_permissions",
                       f"must be an octal file mode such as 0700, got "
                       f"{sv.unix_socket_permissions!r}"))
    if st.synchronous not in SYNCHRONOUS:
        errors.append(("store.synchronous",
                       f"must be one of {' | '.join(SYNCHRONOUS)}, got {st.synchronous!r}"))
    embedded = not up.uri and not src.oplog
    if embedded and not st.in_memory:
        if not st.data_dir:
            errors.append(("store.data_dir", "must not be empty (or set store.in_memory)"))
        elif os.path.exists(st.data_dir) and not os.path.isdir(st.data_dir):
            errors.append(("store.data_dir", f"{st.data_dir} exists and is not a directory"))
    for i, path in enumerate(src.oplog):
        problem = oplog_path_problem(path)
        if problem:
            errors.append((f"source.oplog[{i}]", f"{path}: {problem}"))
    if up.uri and src.oplog:  # one source is served: a second one would be ignored
        errors.append(("source.oplog", "cannot be used with upstream.uri (serve a recorded "
                                       "oplog or a live upstream, not both)"))
    if up.uri:
        problem = _check_uri(up.uri)
        if problem:
            errors.append(("upstream.uri", problem))
    if up.retain_dir and os.path.exists(up.retain_dir) and not os.path.isdir(up.retain_dir):
        errors.append(("upstream.retain_dir", f"{up.retain_dir} exists and is not a directory"))
    if up.retain_dir and up.retain_mb == 0 and up.retain_hours == 0:
        errors.append(("upstream.retain_mb", "retain_mb and retain_hours cannot both be 0 "
                                             "(the retained log would grow without limit)"))
    if up.materialize:
        from cdcserver.materialize.patterns import pattern_problem

        for i, pattern in enumerate(up.materialize):
            problem = pattern_problem(pattern)
            if problem:
                errors.append((f"upstream.materialize[{i}]", problem))
        if not up.retain_dir:
            errors.append(("upstream.materialize", "needs upstream.retain_dir (the copy keeps "
                                                   "versions as long as the retained log)"))
    if up.backoff_max_ms < up.backoff_initial_ms:
        errors.append(("upstream.backoff_max_ms", "must not be less than backoff_initial_ms"))
    if up.client_options:
        from pymongo.common import validate

        for option, value in up.client_options.items():
            try:
                validate(option, value)
            except Exception as exc:  # ConfigurationError, ValueError, TypeError
                errors.append((f"upstream.client_options.{option}", str(exc)))
    if config.log.level.lower() not in LOG_LEVELS:
        errors.append(("log.level",
                       f"must be one of {' | '.join(LOG_LEVELS)}, got {config.log.level!r}"))
    if config.log.format not in LOG_FORMATS:
        errors.append(("log.format",
                       f"must be one of {' | '.join(LOG_FORMATS)}, got {config.log.format!r}"))
    errors.extend(_auth_errors(config.auth))
    tls = config.tls
    if tls.enabled:
        if not tls.certificate_file:
            errors.append(("tls.certificate_file", "required when tls.enabled is true"))
        for key in ("certificate_file", "key_file", "ca_file"):
            path = getattr(tls, key)
            if path and not os.path.isfile(path):
                errors.append((f"tls.{key}", f"no such file: {path}"))
        if tls.require_client_certificate and not tls.ca_file:
            errors.append(("tls.require_client_certificate",
                           "needs tls.ca_file to verify client certificates against"))
    m = config.metrics
    if m.port is not None and not _port_ok(m.port):
        errors.append(("metrics.port", f"must be 0..65535, got {m.port}"))
    elif m.enabled and m.port and m.port == sv.port and m.host == sv.host:
        errors.append(("metrics.port", f"{m.host}:{m.port} is also server's listener"))
    elif m.enabled and m.port is None and sv.port == METRICS_PORT and m.host == sv.host:
        errors.append(("metrics.port", f"its default {METRICS_PORT} is server.port: "
                                       "set another metrics.port"))
    return errors


def unix_socket_mode(text: str) -> int | None:
    """server.unix_socket_permissions as a mode (mongod reads --filePermissions 0700 as
    octal); None when it is not one."""
    digits = text[2:] if text[:2].lower() == "0o" else text
    if not digits or any(c not in "01234567" for c in digits):
        return None
    mode = int(digits, 8)
    return mode if mode <= 0o7777 else None


# [metrics] port when none is set (Prometheus exporters' registry lists 9216 for MongoDB).
METRICS_PORT = 9216


def oplog_path_problem(path: str) -> str | None:
    """Why `path` cannot be read as an oplog file (None: it can be tried)."""
    if os.path.isdir(path):
        for inside in ("oplog.bson", os.path.join("local", "oplog.rs.bson")):
            if os.path.isfile(os.path.join(path, inside)):  # a mongodump output directory
                return f"is a directory (the oplog in it: {os.path.join(path, inside)})"
        return "is a directory, not an oplog file (mongodump BSON or Extended JSON lines)"
    if not os.path.exists(path):
        return "no such file"
    if not os.path.isfile(path):
        return "not a regular file"
    return None


# Keys holding file paths: a relative one in a config file is relative to that file's
# directory (as nginx, systemd units or docker compose read theirs), so a config works from
# any working directory; environment variables and flags stay relative to the working one.
PATH_KEYS = {
    "store": ("data_dir",),
    "upstream": ("retain_dir",),
    "tls": ("certificate_file", "key_file", "ca_file"),
}
# pymongo options naming files, in [upstream] client_options.
_CLIENT_PATH_OPTIONS = ("tlscafile", "tlscertificatekeyfile", "tlscrlfile")


def _resolve_paths(data: dict[str, Any], base: str) -> None:
    """Make the relative paths a config file gives relative to `base` (its directory)."""

    def resolve(value: Any) -> Any:
        if isinstance(value, str) and value and not os.path.isabs(value):
            return os.path.normpath(os.path.join(base, value))
        return value

    for section, keys in PATH_KEYS.items():
        table = data.get(section)
        if isinstance(table, dict):
            for key in keys:
                if key in table:
                    table[key] = resolve(table[key])
    source = data.get("source")
    if isinstance(source, dict) and isinstance(source.get("oplog"), list):
        source["oplog"] = [resolve(p) for p in source["oplog"]]
    upstream = data.get("upstream")
    options = upstream.get("client_options") if isinstance(upstream, dict) else None
    if isinstance(options, dict):
        for key in options:
            if key.lower() in _CLIENT_PATH_OPTIONS:  # pymongo's option names ignore case
                options[key] = resolve(options[key])


def _auth_errors(auth: AuthConfig) -> list[tuple[str, str]]:
    errors: list[tuple[str, str]] = []
    for i, mech in enumerate(auth.mechanisms):
        if mech not in MECHANISMS:
            errors.append((f"auth.mechanisms[{i}]",
                           f"must be one of {' | '.join(MECHANISMS)}, got {mech!r}"))
    if auth.enabled and not auth.mechanisms:
        errors.append(("auth.mechanisms", "must not be empty when auth.enabled is true"))
    if auth.enabled and not auth.users:
        errors.append(("auth.users", "auth.enabled is true but no user is configured"))
    seen: set[tuple[str, str]] = set()
    for i, user in enumerate(auth.users):
        at = f"auth.users[{i}]"
        if not user.user:
            errors.append((f"{at}.user", "must not be empty"))
        if (user.user, user.db) in seen:
            errors.append((f"{at}.user", f"{user.user}@{user.db} is configured twice"))
        seen.add((user.user, user.db))
        usable = [
            mech for mech, creds in (("SCRAM-SHA-256", user.scram_sha_256),
                                     ("SCRAM-SHA-1", user.scram_sha_1))
            if creds is not None and mech in auth.mechanisms
        ]
        if not usable:
            errors.append((at, f"user {user.user!r} has no credentials for any of "
                               f"auth.mechanisms (make them with `cdcserver hash-password`)"))
        if user.scram_sha_256 is not None:
            _check_credentials(user.scram_sha_256, 32, f"{at}.scram_sha_256", errors)
        if user.scram_sha_1 is not None:
            _check_credentials(user.scram_sha_1, 20, f"{at}.scram_sha_1", errors)
        for j, role in enumerate(user.roles):
            try:
                parse_role(f"{role.role}@{role.db}")  # the roles startup knows, where they exist
            except ValueError as exc:
                errors.append((f"{at}.roles[{j}]", str(exc)))
    return errors


def check_config(
    path: str | None,
    env: Mapping[str, str] | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> tuple[Config | None, list[str]]:
    """Read `path` (None: defaults), apply `env`'s CDCSERVER_<SECTION>_<KEY> variables (None:
    os.environ) and then `overrides` ({"section.key": value}: command-line flags), and check
    it all. Returns the Config (None when it cannot be built) and every error, each naming
    its key (and the variable or flag that set it)."""
    data: dict[str, Any] = {}
    if path is not None:
        try:
            with open(path, "rb") as f:
                raw = f.read()
        except OSError as exc:
            return None, [f"cannot read {path}: {exc.strerror or exc}"]
        try:
            data = msgspec.toml.decode(raw)
        except msgspec.DecodeError as exc:
            return None, [f"invalid TOML: {exc}"]
        _resolve_paths(data, os.path.dirname(os.path.abspath(path)))
    env_values, origins, messages = env_overrides(os.environ if env is None else env)
    # A section that is not a table in the file keeps its error; overrides go elsewhere.
    for section, values in env_values.items():
        target = data.setdefault(section, {})
        if isinstance(target, dict):
            target.update(values)
    for dotted, value in (overrides or {}).items():
        section, _, key = dotted.partition(".")
        target = data.setdefault(section, {})
        if isinstance(target, dict):
            target[key] = value
            origins[dotted] = "command line"

    def name(key: str) -> str:
        base = key.split("[")[0]
        base = ".".join(base.split(".")[:2])
        origin = origins.get(base)
        return f"{key} (from {origin})" if origin else key

    found: list[tuple[str, str]] = []
    clean = _check(data, Config, "", found)
    messages += [f"{name(key)}: {message}" for key, message in found]
    try:
        config = _convert({} if clean is _DROP else clean, Config)
    except msgspec.ValidationError as exc:  # a gap in _check: still say what and where
        return None, [*messages, str(exc)]
    messages += [f"{name(key)}: {message}" for key, message in semantic_errors(config)]
    return config, messages


def load_config(
    path: str | None,
    env: Mapping[str, str] | None = None,
    overrides: Mapping[str, Any] | None = None,
) -> Config:
    """The config from `path`, environment overrides and then `overrides` (see
    check_config); ConfigError lists every problem at once."""
    config, errors = check_config(path, env, overrides)
    if errors or config is None:
        raise ConfigError(errors, path)
    return config


def port_in_use(setting: str, flag: str, host: str, port: int) -> str:
    """What `serve` says when a port it was told to use is taken: which flag to change, and
    that 0 takes any free port."""
    return (
        f"{setting}: cannot listen on {host}:{port}: address already in use (another server "
        f"listens there): give a free port with {flag} N ({setting} in the config file), or "
        f"{flag} 0 to take any free port (the URI to use is logged once it listens)"
    )
