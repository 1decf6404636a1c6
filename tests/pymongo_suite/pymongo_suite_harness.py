"""PyMongo's own test suite, run unchanged against cdcserver.

The test tree comes from the sdist of the PyMongo release installed here (the package index's
file, its sha256 checked), unpacked once into a cache outside the repository:
``$CDCSERVER_PYMONGO_TESTS_CACHE``, else ``$XDG_CACHE_HOME/cdcserver-pymongo-tests``, else
``~/.cache/cdcserver-pymongo-tests``. A run starts ``cdcserver serve --in-memory`` on a free
port, points PyMongo's suite at it the way the suite expects (``DB_IP`` / ``DB_PORT``, read
by its ``test/helpers_shared.py``), runs the chosen files with pytest in a subprocess under
PyMongo's own pytest configuration (its ``pyproject.toml``), and reads the JUnit XML report.
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.metadata
import json
import os
import pathlib
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import urllib.error
import urllib.request
import xml.etree.ElementTree as ET
from collections.abc import Iterable

DESELECT_ENV = "CDCSERVER_PYMONGO_DESELECT"  # read by pymongo_exact_deselect.py
INDEX_URL = os.environ.get("CDCSERVER_PYMONGO_INDEX", "https://pypi.org/simple/pymongo/")
DOWNLOAD_TIMEOUT_S = 60.0


class Unavailable(Exception):
    """The test tree cannot be had (offline, no such release): the suite is skipped."""


def cache_root() -> pathlib.Path:
    explicit = os.environ.get("CDCSERVER_PYMONGO_TESTS_CACHE")
    if explicit:
        return pathlib.Path(explicit)
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = pathlib.Path(xdg) if xdg else pathlib.Path.home() / ".cache"
    return base / "cdcserver-pymongo-tests"


def installed_version() -> str:
    return importlib.metadata.version("pymongo")


def _sdist_entry(version: str) -> dict:
    """The index's record of pymongo-VERSION.tar.gz (PEP 691 JSON: url and sha256)."""
    request = urllib.request.Request(
        INDEX_URL, headers={"Accept": "application/vnd.pypi.simple.v1+json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=DOWNLOAD_TIMEOUT_S) as response:
            index = json.load(response)
    except (OSError, urllib.error.URLError, ValueError) as exc:
        raise Unavailable(f"cannot read the package index {INDEX_URL}: {exc}") from None
    name = f"pymongo-{version}.tar.gz"
    for entry in index.get("files", []):
        if entry.get("filename") == name:
            return entry
    raise Unavailable(f"{INDEX_URL} has no {name} (the installed pymongo's sdist)")


def _download(url: str, sha256: str | None, dest: pathlib.Path) -> None:
    digest = hashlib.sha256()
    partial = dest.with_suffix(".partial")
    try:
        with urllib.request.urlopen(url, timeout=DOWNLOAD_TIMEOUT_S) as response, \
                open(partial, "wb") as out:
            while chunk := response.read(1 << 16):
                digest.update(chunk)
                out.write(chunk)
    except (OSError, urllib.error.URLError) as exc:
        partial.unlink(missing_ok=True)
        raise Unavailable(f"cannot download {url}: {exc}") from None
    if sha256 and digest.hexdigest() != sha256:
        partial.unlink(missing_ok=True)
        raise Unavailable(f"{url}: sha256 {digest.hexdigest()} is not the index's {sha256}")
    partial.replace(dest)


def _unpack(sdist: pathlib.Path, root: pathlib.Path) -> None:
    """Only `test/` and `pyproject.toml` (PyMongo's pytest settings), without the sdist's
    `pymongo/` package, so the installed PyMongo is the one under test."""
    staging = pathlib.Path(tempfile.mkdtemp(prefix="unpack-", dir=root.parent))
    try:
        with tarfile.open(sdist) as tar:
            members = []
            for member in tar.getmembers():
                parts = pathlib.PurePosixPath(member.name).parts
                if len(parts) >= 2 and (parts[1] == "test" or parts[1:] == ("pyproject.toml",)):
                    members.append(member)
            tar.extractall(staging, members=members, filter="data")
        top = next(staging.iterdir())
        if root.exists():
            shutil.rmtree(root)
        top.replace(root)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def suite_tree(version: str | None = None) -> pathlib.Path:
    """The unpacked tree (with `test/` and `pyproject.toml`) of this PyMongo release."""
    version = version or installed_version()
    base = cache_root()
    root = base / f"pymongo-{version}"
    if (root / "test" / "__init__.py").is_file() and (root / "pyproject.toml").is_file():
        return root
    base.mkdir(parents=True, exist_ok=True)
    sdist = base / f"pymongo-{version}.tar.gz"
    local = os.environ.get("CDCSERVER_PYMONGO_SDIST")  # a tarball at hand (offline machines)
    if local:
        shutil.copyfile(local, sdist)
    elif not sdist.is_file():
        entry = _sdist_entry(version)
        _download(entry["url"], entry.get("hashes", {}).get("sha256"), sdist)
    try:
        _unpack(sdist, root)
    except (tarfile.TarError, OSError, StopIteration) as exc:
        sdist.unlink(missing_ok=True)
        raise Unavailable(f"cannot unpack {sdist}: {exc}") from None
    return root


# -- running and reading the results ------------------------------------------------------------


@dataclasses.dataclass
class Case:
    file: str  # as given to pytest, e.g. test/test_change_stream.py
    nodeid: str  # file::Class::test
    outcome: str  # passed | failed | error | skipped
    message: str = ""


@dataclasses.dataclass
class Run:
    cases: list[Case]
    returncode: int
    output: str

    def of(self, file: str) -> list[Case]:
        return [c for c in self.cases if c.file == file]

    def counts(self, file: str) -> dict[str, int]:
        out = dict.fromkeys(("passed", "failed", "error", "skipped"), 0)
        for case in self.of(file):
            out[case.outcome] += 1
        return out


def _nodeid(classname: str, name: str, files: Iterable[str]) -> tuple[str, str]:
    """JUnit's `test.asynchronous.test_x.TestY` + `test_z` -> (file, file::TestY::test_z)."""
    dotted = classname.split(".")
    for file in files:
        module = file[:-3].replace("/", ".")
        if classname == module or classname.startswith(module + "."):
            rest = classname[len(module) + 1:]
            parts = [p for p in rest.split(".") if p] + [name]
            return file, "::".join([file, *parts])
    return "", "::".join([*dotted, name])


def parse_junit(path: pathlib.Path, files: list[str]) -> list[Case]:
    cases = []
    for tc in ET.parse(path).getroot().iter("testcase"):
        file, nodeid = _nodeid(tc.get("classname", ""), tc.get("name", ""), files)
        outcome, message = "passed", ""
        for child in tc:
            if child.tag in ("failure", "error", "skipped"):
                outcome = {"failure": "failed"}.get(child.tag, child.tag)
                message = child.get("message") or (child.text or "")[:500]
                if child.tag == "skipped" and child.get("type") == "pytest.xfail":
                    outcome = "skipped"
                break
        cases.append(Case(file, nodeid, outcome, message))
    return cases


def run_files(
    tree: pathlib.Path, files: list[str], host: str, port: int, timeout_s: float,
    extra_args: Iterable[str] = (), deselect: Iterable[str] = (),
) -> Run:
    """Run PyMongo's test `files` (paths under `tree`) against host:port, without the tests
    whose node ids are in `deselect` (exactly those: pymongo_exact_deselect.py)."""
    report = tree / f"cdcserver-report-{os.getpid()}-{port}.xml"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST_", "DB_"))}
    env.update({"DB_IP": host, "DB_PORT": str(port), DESELECT_ENV: "\n".join(deselect)})
    here = str(pathlib.Path(__file__).parent)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [here, env.get("PYTHONPATH")]))
    args = [
        sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-p", "pymongo_exact_deselect",
        "-v", "-rN", f"--junitxml={report}", *extra_args, *files,
    ]
    try:
        try:
            done = subprocess.run(
                args, cwd=tree, env=env, stdin=subprocess.DEVNULL, capture_output=True,
                text=True, timeout=timeout_s,
            )
        except subprocess.TimeoutExpired as exc:  # a hang: say which test it was in
            out = exc.stdout.decode(errors="replace") if isinstance(exc.stdout, bytes) else (
                exc.stdout or "")
            tail = "\n".join(out.splitlines()[-5:])
            raise RuntimeError(
                f"PyMongo's tests did not finish within {timeout_s:.0f} s; the last lines "
                f"(the test under way last):\n{tail}"
            ) from None
        if not report.is_file():
            raise RuntimeError(
                f"PyMongo's tests wrote no report (exit {done.returncode}):\n"
                f"{done.stdout[-4000:]}\n{done.stderr[-4000:]}"
            )
        return Run(parse_junit(report, files), done.returncode, done.stdout + done.stderr)
    finally:
        report.unlink(missing_ok=True)


# Skips that say "this test is not for this server": a version, a topology, an API the test
# does not cover (PyMongo's sync-only tests in the async file), or a property of the test
# itself that holds for mongod alike.
TOPOLOGY_OR_VERSION_SKIPS = re.compile(
    r"runOnRequirements not satisfied"
    r"|Server version must be"
    r"|This test only works with the synchronous API"
    r"|cluster-level change streams cannot be invalidated"
    r"|Must be connected to a mongos|Must not be connected to a mongos"
    r"|Must be connected to a replica set|Not connected to a replica set"
    r"|Must have secondaries|Not connected to a load balancer|Must be connected to a load"
    r"|[Ss]harded"
)


# -- the wider files and why their failures fail ----------------------------------------------

WIDER_FILES = [
    "test/test_collection.py", "test/test_database.py", "test/test_cursor.py",
    "test/test_bulk.py", "test/test_session.py", "test/test_raw_bson.py",
    "test/test_custom_types.py", "test/test_crud_unified.py", "test/test_sessions_unified.py",
    "test/test_retryable_reads_unified.py", "test/test_retryable_writes_unified.py",
    "test/test_read_write_concern_spec.py", "test/test_command_monitoring.py",
    "test/test_command_logging.py", "test/test_versioned_api_integration.py",
    "test/test_client_bulk_write.py", "test/test_transactions.py",
    "test/test_transactions_unified.py",
    "test/asynchronous/test_collection.py", "test/asynchronous/test_database.py",
    "test/asynchronous/test_cursor.py", "test/asynchronous/test_bulk.py",
    "test/asynchronous/test_session.py", "test/asynchronous/test_transactions.py",
    "test/asynchronous/test_transactions_unified.py",
    "test/test_client.py", "test/asynchronous/test_client.py",
]

# The causes of the failures: key -> (pattern on "node id | message", why). The first
# pattern that matches names the cause; known_failures.py refers to the keys.
CAUSES: dict[str, tuple[str, str]] = {
    'setField': (
        '\\$setField|DotsAndDollars',
        '$setField / $getField (dotted and $-prefixed field names) are not supported',
    ),
    'exhaust': (
        '[Ee]xhaust',
        'exhaust cursors (moreToCome) are not supported',
    ),
    'capped-tailable': (
        'tailable|test_max_await_time_ms|test_concurrent_close',
        'capped collections are not capped: tailable cursors are refused',
    ),
    'user-management': (
        'createUser|updateUser',
        'user management commands are not offered (users come from [auth] in the config)',
    ),
    'stable-api': (
        'VersionedApi',
        'Stable API parameters are not checked (no APIStrictError / APIVersionError)',
    ),
    'profiler': (
        '::test_comment \\|',
        'the profiler writes no system.profile documents',
    ),
    'collation': (
        '[Cc]ollation',
        'collation is accepted but ignored',
    ),
    'update-result': (
        'test_update_result',
        "update's result: upserted / updatedExisting as mongod's",
    ),
    'no-secondary': (
        'read preference in a transaction must be primary',
        'a one-member replica set: the test needs a secondary for the driver to select before '
        'it raises its own "read preference in a transaction must be primary" (each waits out '
        "the 30 s server selection timeout)",
    ),
}


# Tests not run at all (deselected; test_pymongo_suite.py reports each as a skip naming why).
# Most check the machine the suite runs on, not the server: the driver computes them without
# a server's answer, so they fail against a mongod on the same machine and may pass on another,
# and a strict xfail would break on the other machine. key -> why.
NOT_RUN_CAUSES: dict[str, str] = {
    "container-metadata": (
        "the driver's handshake metadata (computed by the driver, not the server's answer) "
        "sees this machine's container (/.dockerenv, KUBERNETES_SERVICE_HOST) where the test "
        "expects none: it fails so against mongod on a container too, and passes elsewhere"
    ),
    "dns-srv": (
        "resolves the mongodb+srv:// SRV and TXT records of test.build.10gen.cc (the driver "
        "alone, no server): it needs a resolver that reaches the public DNS"
    ),
}

_HANDSHAKE_ENV_TESTS = [
    "test_handshake_01_aws",
    "test_handshake_02_azure",
    "test_handshake_03_gcp",
    "test_handshake_04_vercel",
    "test_handshake_05_multiple",
    "test_handshake_07_memory_invalid_int",
    "test_handshake_08_invalid_aws_ec2",
    "test_handshake_09_container_with_provider",
    "test_handshake_10_agent_known",
    "test_handshake_11_agent_known_fixed_name",
    "test_handshake_12_agent_known_opencode",
    "test_handshake_13_agent_known_opencode_client",
    "test_handshake_14_agent_known_precedence",
    "test_handshake_15_agent_known_beats_generic",
    "test_handshake_16_agent_generic_descriptive",
    "test_handshake_17_agent_generic_boolean",
    "test_handshake_18_agent_generic_boolean_whitespace",
    "test_handshake_19_agent_generic_normalized",
    "test_handshake_20_agent_generic_truncated",
    "test_handshake_21_agent_generic_truncated_on_boundary",
    "test_handshake_22_agent_generic_malformed",
    "test_handshake_23_agent_unset_empty",
    "test_handshake_24_agent_unset_whitespace",
    "test_handshake_25_agent_unset_known_whitespace",
    "test_handshake_26_agent_with_provider",
]

# file -> test -> key in NOT_RUN_CAUSES
NOT_RUN: dict[str, dict[str, str]] = {
    "test/test_client.py": {
        "ClientUnitTest::test_container_metadata": "container-metadata",
        "ClientUnitTest::test_metadata": "container-metadata",
        "ClientUnitTest::test_metadata_appends_driver_info": "container-metadata",
        **{f"TestClient::{t}": "container-metadata" for t in _HANDSHAKE_ENV_TESTS},
        "ClientUnitTest::test_connection_timeout_ms_propagates_to_DNS_resolver": "dns-srv",
        "TestClient::test_repr_srv_host": "dns-srv",
        "TestClient::test_service_name_from_kwargs": "dns-srv",
        "TestClient::test_srv_max_hosts_kwarg": "dns-srv",
    },
    "test/asynchronous/test_client.py": {
        "AsyncClientUnitTest::test_container_metadata": "container-metadata",
        "AsyncClientUnitTest::test_metadata": "container-metadata",
        "AsyncClientUnitTest::test_metadata_appends_driver_info": "container-metadata",
        **{f"TestClient::{t}": "container-metadata" for t in _HANDSHAKE_ENV_TESTS},
        "TestClient::test_repr_srv_host": "dns-srv",
        "TestClient::test_service_name_from_kwargs": "dns-srv",
        "TestClient::test_srv_max_hosts_kwarg": "dns-srv",
    },
}


def not_run_ids() -> list[str]:
    """The node ids of NOT_RUN."""
    return [f"{file}::{test}" for file, tests in NOT_RUN.items() for test in tests]


def cause_of(case: Case) -> str:
    """The key of the failure's cause in CAUSES, or "unclassified: <message>"."""
    text = f"{case.nodeid} | {case.message}"
    for key, (pattern, _) in CAUSES.items():
        if re.search(pattern, text):
            return key
    return "unclassified: " + " ".join(case.message.split())[:150]


def known_failures_source(run: Run) -> str:
    """known_failures.py for a run of WIDER_FILES: each failure of each file, with its cause."""
    lines = [
        '"""PyMongo\'s wider test files: the tests that fail against cdcserver, and why.',
        "",
        "Written by `python tests/pymongo_suite/pymongo_suite_harness.py update` from a run",
        "(then read: an \"unclassified\" cause needs a pattern in CAUSES). Each is a strict",
        "xfail in test_pymongo_suite.py, its reason the text of the cause in CAUSES.",
        '"""',
        "# ruff: noqa: E501  (PyMongo's test names are long)",
        "",
        "KNOWN_FAILURES: dict[str, dict[str, str]] = {",
    ]
    for file in WIDER_FILES:
        lines.append(f"    {file!r}: {{")
        for case in run.of(file):
            if case.outcome in ("failed", "error"):
                test = case.nodeid[len(file) + 2:]
                lines.append(f"        {test!r}: {cause_of(case)!r},")
        lines.append("    },")
    lines.append("}")
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    """`update`: run the wider files against a fresh `serve --in-memory` and rewrite
    known_failures.py next to this file; prints docs/conformance.md's table counts."""
    if argv[1:] != ["update"]:
        print("usage: pymongo_suite_harness.py update", file=sys.stderr)
        return 2
    from cdcserver.testing import HOST, SubprocessServer

    tree = suite_tree()
    with SubprocessServer() as server:
        run = run_files(tree, WIDER_FILES, HOST, server.port, 3600.0,
                        deselect=not_run_ids())
    out = pathlib.Path(__file__).with_name("known_failures.py")
    out.write_text(known_failures_source(run))
    for file in WIDER_FILES:
        print(file, run.counts(file))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
