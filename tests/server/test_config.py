"""Config: CDCSERVER_* overrides, every error at once with its key, `cdcserver check-config`,
config.example.toml documenting every option (printed by `cdcserver config --defaults`), and
`cdcserver ping` against a real server."""

from __future__ import annotations

import os
import pathlib
import re
import socket
import subprocess
import sys
import typing
from collections.abc import Iterator
from typing import Any

import msgspec
import pytest
from pymongo import MongoClient

from cdcserver.cli import ping_uri
from cdcserver.config import (
    Config,
    ConfigError,
    check_config,
    env_overrides,
    load_config,
    sections,
)

ROOT = pathlib.Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "config.example.toml"
CLI = [sys.executable, "-m", "cdcserver.cli"]


def _env(**extra: str) -> dict[str, str]:
    """The environment for a child: no CDCSERVER_* of ours leaking in, metrics on any port
    (several servers run at once)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CDCSERVER_")}
    env["CDCSERVER_METRICS_PORT"] = "0"
    env.update(extra)
    return env


def _run(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*CLI, *args], capture_output=True, text=True, env=env or _env(), timeout=120
    )


def _write(tmp_path: pathlib.Path, text: str, name: str = "c.toml") -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _keys(errors: list[str]) -> list[str]:
    return [e.split(":")[0].split(" (from")[0] for e in errors]


# --- config.example.toml ------------------------------------------------------------------


def _leaf_defaults() -> Iterator[tuple[str, str, Any]]:
    for section, struct in sections().items():
        for f in msgspec.structs.fields(struct):
            default = f.default_factory() if f.default_factory is not msgspec.NODEFAULT \
                else f.default
            yield section, f.name, msgspec.to_builtins(default)


def test_example_has_every_option_with_its_default() -> None:
    example = msgspec.toml.decode(EXAMPLE.read_bytes())
    assert set(example) == set(sections())
    missing, wrong = [], []
    text = EXAMPLE.read_text()
    for section, key, default in _leaf_defaults():
        if default is None:  # TOML has no null: shown commented out, as an example value
            if key in example[section] or not re.search(rf"^# {key} = ", text, re.M):
                missing.append(f"{section}.{key} (unset: as a commented-out line)")
        elif key not in example[section]:
            missing.append(f"{section}.{key}")
        elif example[section][key] != default or type(example[section][key]) is not type(
            default
        ):
            wrong.append(f"{section}.{key}: {example[section][key]!r} != {default!r}")
    assert missing == []
    assert wrong == []
    # And nothing the structs do not know.
    assert msgspec.toml.decode(EXAMPLE.read_bytes(), type=Config) == Config()


def test_example_comments_every_option() -> None:
    """Each key line sits in a block of keys led by a comment (or has its own comment)."""
    lines = EXAMPLE.read_text().splitlines()
    key_line = re.compile(r"^[a-z_0-9]+ = ")
    uncommented = []
    for i, line in enumerate(lines):
        if not key_line.match(line) or " # " in line:
            continue
        j = i - 1
        while j >= 0 and key_line.match(lines[j]):
            j -= 1
        if j < 0 or not lines[j].startswith("#"):
            uncommented.append(line)
    assert uncommented == []


def test_the_package_ships_the_example_unchanged() -> None:
    """A wheel has no repository files: the package's copy is what `config --defaults` prints."""
    packaged = ROOT / "cdcserver" / "data" / "config.example.toml"
    assert packaged.read_bytes() == EXAMPLE.read_bytes()


def test_config_defaults_prints_every_option_with_comments() -> None:
    result = _run("config", "--defaults")
    assert result.returncode == 0, result.stderr
    assert result.stdout == EXAMPLE.read_text()
    assert msgspec.toml.decode(result.stdout.encode(), type=Config) == Config()
    assert _run("config").returncode == 2  # nothing else to print yet: --defaults is required
    help_text = _run("--help").stdout + _run("serve", "--help").stdout
    assert "config.example.toml" not in help_text  # a wheel's user has no such file
    assert help_text.count("cdcserver config --defaults") == 2


def test_example_passes_check_config() -> None:
    result = _run("check-config", str(EXAMPLE))
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.startswith("OK: ")
    assert "listen 127.0.0.1:27017" in result.stdout


# --- every error, each naming its key -----------------------------------------------------

BROKEN = """
[server]
port = 70000
host = 5
prot = 1
[store]
synchronous = "fast"
in_memory = "yes"
[log]
level = "loud"
format = "xml"
[tls]
enabled = true
[auth]
enabled = true
[[auth.users]]
user = "app"
roles = [{role = "reader", db = "shop"}, {role = 3}]
[upstream]
uri = "http://db:27017"
batch_size = 0
[bogus]
x = 1
"""
BROKEN_KEYS = [
    "server.port", "server.host", "server.prot", "store.synchronous", "store.in_memory",
    "log.level", "log.format", "tls.certificate_file", "auth.users[0]",
    "auth.users[0].roles[0]", "auth.users[0].roles[1].role", "upstream.uri",
    "upstream.batch_size", "bogus",
]


def test_broken_config_names_every_key(tmp_path: pathlib.Path) -> None:
    path = _write(tmp_path, BROKEN)
    config, errors = check_config(path, env={})
    assert config is not None  # the valid rest still loads
    assert sorted(_keys(errors)) == sorted(BROKEN_KEYS)
    result = _run("check-config", path)
    assert result.returncode == 2
    printed = result.stdout.splitlines()
    assert printed[-1] == f"{len(BROKEN_KEYS)} errors"
    assert sorted(_keys([line.removeprefix(f"{path}: ") for line in printed[:-1]])) == sorted(
        BROKEN_KEYS
    )


def test_serve_reports_every_error_before_exiting(tmp_path: pathlib.Path) -> None:
    result = _run("serve", "--config", _write(tmp_path, BROKEN))
    assert result.returncode == 2
    assert f"{len(BROKEN_KEYS)} errors" in result.stderr
    for key in BROKEN_KEYS:
        assert f"  {key}:" in result.stderr or f"  {key} " in result.stderr, key


def test_type_errors_say_what_was_expected(tmp_path: pathlib.Path) -> None:
    _, errors = check_config(_write(tmp_path, '[server]\nport = "x"\n'), env={})
    assert errors == ["server.port: Expected `int`, got `str`"]


def test_unreadable_and_invalid_toml(tmp_path: pathlib.Path) -> None:
    config, errors = check_config(str(tmp_path / "nope.toml"), env={})
    assert config is None and errors[0].startswith("cannot read")
    config, errors = check_config(_write(tmp_path, "[server\nport = 1"), env={})
    assert config is None and errors[0].startswith("invalid TOML")
    with pytest.raises(ConfigError) as info:
        load_config(_write(tmp_path, "[server\n"), env={})
    assert str(info.value).startswith(str(tmp_path / "c.toml"))


USER_256 = (
    'scram_sha_256 = {iteration_count = 15000, salt = "c2FsdA==", '
    'stored_key = "' + "A" * 43 + '=", server_key = "' + "A" * 43 + '="}'
)

BAD_BASE64 = USER_256.replace('stored_key = "', 'stored_key = "!')


@pytest.mark.parametrize(
    ("text", "key", "words"),
    [
        ("[server]\nport = -1", "server.port", "0..65535"),
        ("[server]\nadvertised_host = 'db1'", "server.advertised_host", "host:port"),
        ("[server]\nmax_connections = 0", "server.max_connections", "at least 1"),
        ("[server]\nidle_cursor_timeout_s = 0", "server.idle_cursor_timeout_s", "more than 0"),
        ("[metrics]\nport = 65536", "metrics.port", "0..65535"),
        ("[metrics]\nport = 27017", "metrics.port", "also server's listener"),
        ("[store]\nsynchronous = 'FULL'", "store.synchronous", "off | normal | full"),
        ("[source]\noplog = ['/nonexistent/oplog.bson']", "source.oplog[0]", "no such file"),
        ("[upstream]\nuri = 'localhost:27017'", "upstream.uri", "mongodb://"),
        ("[upstream]\nuri = 'mongodb://db:notaport'", "upstream.uri", "port"),
        ("[upstream]\nuri = 'mongodb+srv://db.example:27017'", "upstream.uri", "without a port"),
        ("[upstream]\nclient_options = {noSuchOption = 1}", "upstream.client_options.noSuchOption",
         "nosuchoption"),
        ("[upstream]\nbackoff_initial_ms = 10.0\nbackoff_max_ms = 5.0", "upstream.backoff_max_ms",
         "backoff_initial_ms"),
        ("[log]\nlevel = 'verbose'", "log.level", "debug | info"),
        ("[tls]\nenabled = true", "tls.certificate_file", "required"),
        ("[tls]\nenabled = true\ncertificate_file = '/nonexistent.pem'", "tls.certificate_file",
         "no such file"),
        ("[tls]\nrequire_client_certificate = true\nenabled = true\ncertificate_file = '{ex}'",
         "tls.require_client_certificate", "ca_file"),
        ("[auth]\nenabled = true", "auth.users", "no user"),
        ("[auth]\nmechanisms = ['MONGODB-X509']", "auth.mechanisms[0]", "SCRAM-SHA-256"),
        ("[[auth.users]]\nuser = 'app'\nroles = [{role = 'read', db = 'shop'}]", "auth.users[0]",
         "no credentials"),
        ("[[auth.users]]\nuser = 'app'\nscram_sha_1 = {iteration_count = 10000, salt = 'c2Fs',"
         f" stored_key = '{'A' * 27}=', server_key = '{'A' * 27}='}}"
         "\n[auth]\nmechanisms = ['SCRAM-SHA-256']", "auth.users[0]", "no credentials"),
        (f"[[auth.users]]\nuser = 'app'\n{USER_256}\nroles = [{{role = 'reader'}}]",
         "auth.users[0].roles[0]", "unknown role 'reader'"),
        (f"[[auth.users]]\nuser = 'app'\n{USER_256}\nroles = [{{role = 'root', db = 'shop'}}]",
         "auth.users[0].roles[0]", "only on admin"),
        (f"[[auth.users]]\nuser = 'app'\n{BAD_BASE64}",
         "auth.users[0].scram_sha_256.stored_key", "base64"),
        (f"[[auth.users]]\nuser = 'app'\n{USER_256.replace('A' * 43, 'AAA', 1)}",
         "auth.users[0].scram_sha_256.stored_key", "32 bytes"),
        (f"[[auth.users]]\nuser = 'app'\n{USER_256.replace('15000', '1000')}",
         "auth.users[0].scram_sha_256.iteration_count", "4096"),
        (f"[[auth.users]]\nuser = 'a'\n{USER_256}\n[[auth.users]]\nuser = 'a'\n{USER_256}",
         "auth.users[1].user", "twice"),
    ],
)
def test_semantic_errors(tmp_path: pathlib.Path, text: str, key: str, words: str) -> None:
    path = _write(tmp_path, text.replace("{ex}", str(EXAMPLE)))
    config, errors = check_config(path, env={})
    assert config is not None
    assert len(errors) == 1, errors
    assert _keys(errors) == [key]
    assert words.lower() in errors[0].lower()


def test_a_valid_user_passes(tmp_path: pathlib.Path) -> None:
    text = (
        f"[auth]\nenabled = true\n[[auth.users]]\nuser = 'app'\ndb = 'shop'\n{USER_256}\n"
        "roles = [{role = 'read', db = 'shop'}, {role = 'readAnyDatabase', db = 'admin'}]\n"
    )
    config, errors = check_config(_write(tmp_path, text), env={})
    assert errors == []
    assert config is not None and config.auth.users[0].roles[1].role == "readAnyDatabase"


# --- CDCSERVER_<SECTION>_<KEY> --------------------------------------------------------------


def test_env_overrides_the_file_and_flags_override_env(tmp_path: pathlib.Path) -> None:
    oplog = tmp_path / "a.bson"
    oplog.write_bytes(b"")
    path = _write(tmp_path, "[server]\nport = 1111\nset_name = 'file'\n[store]\nin_memory = 0\n")
    env = {
        "CDCSERVER_SERVER_PORT": "27018",
        "CDCSERVER_STORE_IN_MEMORY": "true",
        "CDCSERVER_SOURCE_OPLOG": f'["{oplog}"]',
        "CDCSERVER_UPSTREAM_CLIENT_OPTIONS": "{serverSelectionTimeoutMS = 5000}",
        "CDCSERVER_SERVER_IDLE_CURSOR_TIMEOUT_S": "60",  # an int for a float key
        "CDCSERVER_SERVER_SET_NAME": "123",  # a str key keeps digits as text
        "CDCSERVER_SERVER_HOST": '"127.0.0.2"',  # a quoted TOML string works too
        "cdcserver_log_level": "debug",  # names map case-insensitively
        "CDCSERVER_SPARK_MILLION": "1",  # not a section: someone else's variable
        "CDCSERVER_RECORD_OPLOG": "/tmp/x",
    }
    config = load_config(path, env=env)
    assert config.server.port == 27018
    assert config.store.in_memory is True
    assert config.source.oplog == [str(oplog)]
    assert config.upstream.client_options == {"serverSelectionTimeoutMS": 5000}
    assert config.server.idle_cursor_timeout_s == 60.0
    assert config.server.set_name == "123"
    assert config.server.host == "127.0.0.2"
    assert config.log.level == "debug"
    config = load_config(path, env=env, overrides={"server.port": 27019})
    assert config.server.port == 27019
    del env["CDCSERVER_SOURCE_OPLOG"]  # one source: an upstream instead of the file
    env["CDCSERVER_UPSTREAM_URI"] = "mongodb://db1:27017,db2:27017/?replicaSet=rs0"
    assert load_config(path, env=env).upstream.uri.startswith("mongodb://db1")
    # No file at all: env alone.
    assert load_config(None, env={"CDCSERVER_METRICS_ENABLED": "false"}).metrics.enabled is False


def test_env_errors_name_the_variable(tmp_path: pathlib.Path) -> None:
    env = {
        "CDCSERVER_SERVER_PROT": "1",
        "CDCSERVER_SERVER_PORT": "many",
        "CDCSERVER_TLS_ENABLED": "yes",
        "CDCSERVER_AUTH_USERS": "[]",
        "CDCSERVER_METRICS_PORT": "99999",
    }
    _, errors = check_config(None, env=env)
    assert len(errors) == 5, errors
    text = "\n".join(errors)
    assert "CDCSERVER_SERVER_PROT: [server] has no key 'prot'" in text
    assert "server.port (from CDCSERVER_SERVER_PORT): Expected `int`, got `str`" in text
    assert "tls.enabled (from CDCSERVER_TLS_ENABLED): Expected `bool`, got `str`" in text
    assert "CDCSERVER_AUTH_USERS: auth.users can only be set in the config file" in text
    assert "metrics.port (from CDCSERVER_METRICS_PORT): must be 0..65535" in text
    # check-config reads the environment too.
    result = _run("check-config", str(EXAMPLE), env=_env(CDCSERVER_STORE_SYNC="full"))
    assert result.returncode == 2
    assert "CDCSERVER_STORE_SYNC: [store] has no key 'sync'" in result.stdout


def test_every_key_can_be_named_by_a_variable() -> None:
    """Keys contain underscores; the section is matched first, so each key is reachable."""
    for section, key, _ in _leaf_defaults():
        if f"{section}.{key}" == "auth.users":
            continue
        values, origins, errors = env_overrides({f"CDCSERVER_{section}_{key}".upper(): "0"})
        assert errors == [] and key in values[section], (section, key)


def test_serve_flags_env_and_file_precedence(tmp_path: pathlib.Path) -> None:
    """A real server: the file says one port, the environment another, the flag a third;
    the flag wins and the others are not listened on."""
    file_port, env_port, flag_port = _free_port(), _free_port(), _free_port()
    path = _write(tmp_path, f"[server]\nport = {file_port}\n[store]\nin_memory = true\n")
    env = _env(CDCSERVER_SERVER_PORT=str(env_port), CDCSERVER_SERVER_SET_NAME="fromenv")
    with _serving("--config", path, "--port", str(flag_port), env=env):
        with MongoClient(f"mongodb://127.0.0.1:{flag_port}/", directConnection=True) as client:
            assert client.admin.command("hello")["setName"] == "fromenv"
        for port in (file_port, env_port):
            assert _run("ping", "--uri", f"mongodb://127.0.0.1:{port}", "--timeout", "0.5")\
                .returncode == 1


# --- cdcserver ping -------------------------------------------------------------------------


class _Server(typing.NamedTuple):
    process: subprocess.Popen[bytes]
    port: int


def _serving(*args: str, env: dict[str, str]) -> Any:
    import contextlib

    @contextlib.contextmanager
    def run() -> Iterator[subprocess.Popen[bytes]]:
        process = subprocess.Popen(
            [*CLI, "serve", *args], env=env,
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        )
        try:
            assert process.stderr is not None
            for line in process.stderr:  # the listener is up once it says so
                if b"listening on" in line:
                    break
            else:
                pytest.fail(f"server exited with {process.wait()}")
            yield process
        finally:
            process.terminate()
            process.wait(timeout=60)
            if process.stderr is not None:
                process.stderr.close()

    return run()


def test_ping_exits_0_when_the_server_answers_and_1_when_not(tmp_path: pathlib.Path) -> None:
    port = _free_port()
    uri = f"mongodb://127.0.0.1:{port}/?appname=probe"
    path = _write(tmp_path, f"[server]\nport = {port}\n[store]\nin_memory = true\n")
    with _serving("--config", path, env=_env()):
        ok = _run("ping", "--uri", uri, "--timeout", "5")
        assert ok.returncode == 0, ok.stderr
        assert ok.stdout.strip() == f"ok 127.0.0.1:{port}"
        assert _run("ping", "--config", path).returncode == 0
        by_env = _run("ping", env=_env(CDCSERVER_SERVER_PORT=str(port)))
        assert by_env.returncode == 0, by_env.stderr
    down = _run("ping", "--uri", uri, "--timeout", "0.5")
    assert down.returncode == 1
    assert down.stdout == ""
    assert len(down.stderr.strip().splitlines()) == 1
    assert down.stderr.startswith("cdcserver ping: ") and f"127.0.0.1:{port}" in down.stderr


def test_ping_bad_uri_and_bad_config(tmp_path: pathlib.Path) -> None:
    bad = _run("ping", "--uri", "http://127.0.0.1:1", "--timeout", "0.5")
    assert bad.returncode == 1 and bad.stderr.startswith("cdcserver ping: bad URI")
    broken = _run("ping", "--config", _write(tmp_path, BROKEN))
    assert broken.returncode == 1 and len(broken.stderr.strip().splitlines()) == 1
    zero = _run("ping", "--config", _write(tmp_path, "[server]\nport = 0\n", "z.toml"))
    assert zero.returncode == 1 and "give --uri" in zero.stderr


def test_ping_uri_from_config() -> None:
    config = Config()
    assert ping_uri(config) == "mongodb://127.0.0.1:27017/"
    config.server.host = "0.0.0.0"  # a container's wildcard listener answers on loopback
    config.server.port = 27018
    config.tls.enabled = True
    assert ping_uri(config) == "mongodb://127.0.0.1:27018/?tls=true&tlsInsecure=true"
    config.server.host = "::"
    assert ping_uri(config).startswith("mongodb://[::1]:27018/")


def test_ping_through_tls_and_auth(tmp_path: pathlib.Path) -> None:
    """The image's HEALTHCHECK (`ping --config`) on a server with TLS and authentication on:
    ping needs no credentials (as on mongod); a URI with wrong ones fails with a reason."""
    import trustme

    from cdcserver.auth import user_toml

    ca = trustme.CA()
    cert = ca.issue_cert("localhost", "127.0.0.1")
    cert.private_key_and_cert_chain_pem.write_to_path(str(tmp_path / "server.pem"))
    ca.cert_pem.write_to_path(str(tmp_path / "ca.pem"))
    port = _free_port()
    text = (
        f"[server]\nport = {port}\n[store]\nin_memory = true\n"
        f"[tls]\nenabled = true\ncertificate_file = '{tmp_path / 'server.pem'}'\n"
        "[auth]\nenabled = true\n"
        + user_toml("app", "admin", [("read", "shop")], "s3cret", iterations={
            "SCRAM-SHA-256": 4096, "SCRAM-SHA-1": 4096})
    )
    path = _write(tmp_path, text)
    assert check_config(path, env={})[1] == []
    uri = f"mongodb://{{}}127.0.0.1:{port}/?tls=true&tlsCAFile={tmp_path / 'ca.pem'}"
    with _serving("--config", path, env=_env()):
        probe = _run("ping", "--config", path)
        assert probe.returncode == 0, probe.stderr
        good = _run("ping", "--uri", uri.format("app:s3cret@"))
        assert good.returncode == 0, good.stderr
        bad = _run("ping", "--uri", uri.format("app:wrong@"))
        assert bad.returncode == 1
        assert "Authentication failed" in bad.stderr and "wrong" not in bad.stderr
        plain = _run("ping", "--uri", f"mongodb://127.0.0.1:{port}/", "--timeout", "1")
        assert plain.returncode == 1  # a plaintext client on a TLS listener gets nowhere


def test_relative_paths_in_a_file_are_relative_to_its_directory(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    conf = tmp_path / "conf"
    conf.mkdir()
    (conf / "a.jsonl").write_text("")
    (conf / "c.toml").write_text(
        "[store]\ndata_dir = 'data'\n"
        "[source]\noplog = ['a.jsonl', '/abs/b.bson']\n"
        "[tls]\ncertificate_file = 'certs/server.pem'\nca_file = '../ca.pem'\n"
        "[upstream]\nclient_options = {tlsCAFile = 'ca.pem', appname = 'x'}\n"
    )
    monkeypatch.chdir(tmp_path)  # elsewhere: the file's paths do not depend on it
    config, _ = check_config(str(conf / "c.toml"), env={})
    assert config is not None
    assert config.store.data_dir == str(conf / "data")
    assert config.source.oplog == [str(conf / "a.jsonl"), "/abs/b.bson"]
    assert config.tls.certificate_file == str(conf / "certs" / "server.pem")
    assert config.tls.ca_file == str(tmp_path / "ca.pem")
    assert config.upstream.client_options == {"tlsCAFile": str(conf / "ca.pem"), "appname": "x"}
    # A variable (or a flag) is relative to the working directory, as given.
    config, _ = check_config(str(conf / "c.toml"), env={"CDCSERVER_STORE_DATA_DIR": "here"})
    assert config is not None and config.store.data_dir == "here"


def test_one_source(tmp_path: pathlib.Path) -> None:
    oplog = tmp_path / "a.jsonl"
    oplog.write_text("")
    _, errors = check_config(None, env={"CDCSERVER_SOURCE_OPLOG": f'["{oplog}"]',
                                        "CDCSERVER_UPSTREAM_URI": "mongodb://127.0.0.1:1/"})
    assert errors == ["source.oplog (from CDCSERVER_SOURCE_OPLOG): cannot be used with "
                      "upstream.uri (serve a recorded oplog or a live upstream, not both)"]
    _, errors = check_config(None, env={"CDCSERVER_SOURCE_OPLOG": f'["{tmp_path}"]'})
    assert errors == [f"source.oplog[0] (from CDCSERVER_SOURCE_OPLOG): {tmp_path}: is a "
                      "directory, not an oplog file (mongodump BSON or Extended JSON lines)"]


def test_metrics_port_unset_and_set() -> None:
    assert load_config(None, env={}).metrics.port is None  # 9216, or a free port if taken
    assert load_config(None, env={"CDCSERVER_METRICS_PORT": "9216"}).metrics.port == 9216
    _, errors = check_config(None, env={"CDCSERVER_SERVER_PORT": "9216"})
    assert errors == ["metrics.port: its default 9216 is server.port: set another metrics.port"]
