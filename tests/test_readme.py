"""README.md followed word for word, so it cannot drift from the code.

The two set-up commands, the Python example, the pytest example, the `--sample` example and the
sidecar example are read out of README.md and run as written, in a temporary directory, with
127.0.0.1:9216 (the metrics port nobody chose) held by a socket this test holds. The only thing
changed is the servers' own ports: a free one appended as `--port N` to the serve command (or
put in place of the one written), and put in place of the port in the examples' URIs.
docs/ pages: tests/test_docs.py.

What runs where:
- `... && .venv/bin/cdcserver serve` (command 1): its serve part runs as written in the
  temporary directory, whose `.venv` is this interpreter's environment (a symlink): the
  install part (`python3 -m venv .venv && .venv/bin/pip install -e .`, what serving needs)
  takes the network, so it runs only with CDCSERVER_README_INSTALL=1 (`.ci/run` sets it), in a
  fresh clone of this checkout, and there the example runs on that install alone.
- `.venv/bin/pip install -e '.[test]' && pytest -n 2 ...` (command 2): running
  the suite from inside the suite would recurse; both parts are checked to be what `.ci/run`
  runs, and the suite collects here with no error.
- The Python example runs twice in a row against the durable store command 1 started.
"""

from __future__ import annotations

import os
import pathlib
import re
import shutil
import signal
import socket
import subprocess
import sys
import time

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()
README_MAX_BYTES = 12_000  # what a newcomer reads in five minutes; the rest is in docs/
GUARD_S = 60.0  # hang guards only
URI = "mongodb://127.0.0.1:{port}/"


def _blocks() -> list[tuple[str, str]]:
    return re.findall(r"^```(\w*)\n(.*?)^```", README, re.M | re.S)


def _block(lang: str, containing: str) -> str:
    found = [code for kind, code in _blocks() if kind == lang and containing in code]
    assert len(found) == 1, f"not one ```{lang} block with {containing!r} in README.md: {found}"
    return found[0]


# Every block of README.md, by a string only it holds: the test that runs it (or compares
# with it), or why nothing can.
BLOCKS = {
    ("", ".venv/bin/pip install -e ."): "test_command_1_serves_and_the_example_runs_twice, "
    "test_command_2_is_what_ci_runs_and_collects_without_errors, test_command_1_in_a_fresh_clone",
    ("python", 'full_document="updateLookup"'): "test_command_1_serves_and_the_example_runs_twice",
    ("", "insert {'_id': ObjectId('...')"): "test_command_1_serves_and_the_example_runs_twice "
    "(what it prints)",
    ("python", "def test_an_insert_is_seen"): "test_the_pytest_example_passes",
    ("", "cdcserver serve --sample"): "test_the_sample_section_prints_its_events",
    ("python", "start_at_operation_time"): "test_the_sample_section_prints_its_events",
    ("", "--upstream mongodb://127.0.0.1:27019/"): "test_the_sidecar_example_prints_insert",
    ("python", "# the sidecar"): "test_the_sidecar_example_prints_insert",
    ("", "db1,db2,db3"): "not run: a replica set at db1..db3; the block after it runs the same "
    "command against a cdcserver standing in for one",
}


def test_every_block_is_run_or_says_why_not() -> None:
    for lang, code in _blocks():
        owners = [key for key in BLOCKS if key[0] == lang and key[1] in code]
        assert len(owners) == 1, f"a ```{lang} block of README.md run nowhere:\n{code}"
    for (lang, containing), runner in BLOCKS.items():
        _block(lang, containing)  # exactly one block holds it
        for name in re.findall(r"\btest_\w+", runner):
            assert callable(globals().get(name)), f"{name}, said to run {containing!r}, is gone"


def setup_commands() -> tuple[str, str]:
    """The two commands at the top of README.md."""
    lang, code = _blocks()[0]
    lines = code.strip().splitlines()
    assert lang == "" and len(lines) == 2, code
    return lines[0], lines[1]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _with_port(code: str, written: int, port: int) -> str:
    """The example with the server's port in its URI replaced (nothing else)."""
    uri = URI.format(port=written)
    assert code.count(uri) == 1, code
    return code.replace(uri, URI.format(port=port))


class Shell:
    """A README command run by bash in `cwd`, its output in a log file; stopped with SIGINT
    (Ctrl-C, as the README says)."""

    def __init__(self, command: str, cwd: pathlib.Path, env: dict[str, str] | None = None):
        self.log_path = cwd / f"server-{_free_port()}.log"
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen(
                ["bash", "-c", f"exec {command}"], cwd=cwd, stdin=subprocess.DEVNULL,
                stdout=log, stderr=subprocess.STDOUT,
                env={**os.environ, "PYTHONUNBUFFERED": "1", **(env or {})},
            )

    def text(self) -> str:
        return self.log_path.read_text()

    def wait_for(self, pattern: str) -> re.Match[str]:
        deadline = time.monotonic() + GUARD_S * 3
        while (match := re.search(pattern, self.text())) is None:
            assert self.process.poll() is None, self.text()
            assert time.monotonic() < deadline, self.text()
            time.sleep(0.05)
        return match

    def interrupt(self) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
        try:
            return self.process.wait(GUARD_S)
        except subprocess.TimeoutExpired:
            self.process.kill()
            return self.process.wait()


def _python(code: str, cwd: pathlib.Path, python: str = sys.executable) -> str:
    result = subprocess.run([python, "-c", code], cwd=cwd, capture_output=True, text=True,
                            timeout=GUARD_S)
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


@pytest.fixture
def venv_here(tmp_path) -> pathlib.Path:
    """tmp_path/.venv: this interpreter's environment, where cdcserver is installed."""
    if not (pathlib.Path(sys.prefix) / "bin" / "cdcserver").exists():
        pytest.skip(f"{sys.prefix} has no bin/cdcserver: run from the venv command 1 makes")
    (tmp_path / ".venv").symlink_to(sys.prefix, target_is_directory=True)
    return tmp_path


def _check_serve_and_example(cwd: pathlib.Path, serve: str, python: str) -> None:
    """Command 1's serve part with a free port, the example twice, Ctrl-C."""
    port = _free_port()
    server = Shell(f"{serve} --port {port}", cwd)
    try:
        line = server.wait_for(r"INFO (serving .*)").group(1)
        text = server.text()
        # The metrics port nobody chose is taken: a warning and a free port, not an exit.
        assert "WARNING metrics: 127.0.0.1:9216 is in use; serving metrics on port" in text
        assert f"serving the embedded store in {cwd / 'cdcserver-data'};" in line, line
        assert f"on mongodb://127.0.0.1:{port}/;" in line, line
        example = _with_port(_block("python", "full_document=\"updateLookup\""), 27017, port)
        printed = _block("", "insert {'_id': ObjectId('...')").strip().splitlines()
        for _ in range(2):  # the store is durable: the second run must work too
            out = _python(example, cwd, python).splitlines()
            assert len(out) == len(printed) == 2, out
            for got, want in zip(out, printed):
                pattern = re.escape(want).replace(re.escape("ObjectId('...')"),
                                                  r"ObjectId\('[0-9a-f]{24}'\)")
                assert re.fullmatch(pattern, got), (got, want)
    finally:
        status = server.interrupt()
    assert status == 0, server.text()
    assert "SIGINT: shutting down" in server.text() and "shutdown complete" in server.text()


def test_command_1_serves_and_the_example_runs_twice(venv_here, default_metrics_port_held):
    install_and_serve, _ = setup_commands()
    parts = install_and_serve.split(" && ")
    assert parts == ["python3 -m venv .venv", ".venv/bin/pip install -e .",
                     ".venv/bin/cdcserver serve"], parts
    _check_serve_and_example(venv_here, parts[2], sys.executable)


def test_the_sample_section_prints_its_events(venv_here, default_metrics_port_held):
    serve = _block("", "cdcserver serve --sample").strip()
    assert serve == "cdcserver serve --sample --port 27018", serve
    port = _free_port()
    server = Shell(serve.replace("--port 27018", f"--port {port}"), venv_here,
                   env={"PATH": f"{venv_here / '.venv' / 'bin'}{os.pathsep}{os.environ['PATH']}"})
    try:
        server.wait_for(r"INFO serving ")
        example = _with_port(_block("python", "start_at_operation_time"), 27018, port)
        for _ in range(2):
            out = _python(example, venv_here).splitlines()
            assert len(out) == 9, out  # "prints its nine events"
            assert out[0] == "insert {'_id': 1}" and out[-1] == "delete {'_id': 4}", out
    finally:
        assert server.interrupt() == 0, server.text()
    # The section's first Timestamp is the one `serve` logs as the oplog's start.
    assert "Timestamp(1763700001, 1)" in _block("python", "start_at_operation_time")
    assert "oplog 11 entries, Timestamp(1763700001, 1)" in server.text()


def test_the_pytest_example_passes(tmp_path):
    """The README's conftest.py and test file, with the plugin of this checkout: both its
    tests pass ("Both pass")."""
    line = re.search(r"`conftest\.py` names it in one line, `(pytest_plugins =\s+\[[^`]*\])`",
                     README)
    assert line, "the README's conftest.py line"
    (tmp_path / "conftest.py").write_text(re.sub(r"\s+", " ", line.group(1)) + "\n")
    (tmp_path / "test_orders.py").write_text(_block("python", "def test_an_insert_is_seen"))
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_orders.py"],
        cwd=tmp_path, capture_output=True, text=True, timeout=GUARD_S * 2,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "2 passed" in result.stdout, result.stdout
    assert "Both pass" in README


def test_the_sidecar_example_prints_insert(venv_here, default_metrics_port_held):
    """The stand-in upstream and the sidecar tailing it, as written (each with a free port),
    and the example through the sidecar."""
    upstream, sidecar = _block("", "--upstream mongodb://127.0.0.1:27019/").strip().splitlines()
    assert upstream == "cdcserver serve --in-memory --port 27019", upstream
    assert sidecar == "cdcserver serve --upstream mongodb://127.0.0.1:27019/ --port 27018"
    a, b = _free_port(), _free_port()
    env = {"PATH": f"{venv_here / '.venv' / 'bin'}{os.pathsep}{os.environ['PATH']}"}
    servers = [Shell(upstream.replace("27019", str(a)), venv_here, env=env)]
    try:
        servers[0].wait_for(r"INFO serving ")
        servers.append(Shell(sidecar.replace("27019", str(a)).replace("27018", str(b)),
                             venv_here, env=env))
        line = servers[1].wait_for(r"INFO (serving .*)").group(1)
        assert f"serving the replica set at mongodb://127.0.0.1:{a}/;" in line, line
        example = _with_port(_block("python", "# the sidecar"), 27018, b)
        assert _python(example, venv_here).splitlines() == ["insert"]  # "prints `insert`"
        assert "prints `insert`" in README
    finally:
        statuses = [server.interrupt() for server in reversed(servers)]
    assert statuses == [0] * len(servers), [server.text() for server in servers]


def test_command_2_is_what_ci_runs_and_collects_without_errors():
    _, install_and_test = setup_commands()
    install, test_command = install_and_test.split(" && ")
    assert install == ".venv/bin/pip install -e '.[test]'", install
    assert test_command == ".venv/bin/python -m pytest -q -n 2 --dist loadfile"
    ci = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()]
    # CI runs the README's test command verbatim, as its last line.
    assert ci[-1] == install_and_test, "CI must run the README's test command"
    # The suite itself, collected only (running it from inside itself would recurse).
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "--collect-only", "-p", "no:cacheprovider"],
        cwd=ROOT, capture_output=True, text=True, timeout=GUARD_S * 5,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert re.search(r"^\d+ tests collected", result.stdout, re.M), result.stdout[-500:]
    assert " error" not in result.stdout.splitlines()[-1], result.stdout[-500:]


@pytest.mark.skipif(os.environ.get("CDCSERVER_README_INSTALL") != "1",
                    reason="the install part of command 1 (a venv, pip install -e .: the "
                    "network) runs with CDCSERVER_README_INSTALL=1 (.ci/run sets it)")
def test_command_1_in_a_fresh_clone(tmp_path, default_metrics_port_held):
    """Command 1 whole, as written (its serve part with a free port), in a fresh clone."""
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True, timeout=GUARD_S)
    install_and_serve, _ = setup_commands()
    *install, serve = install_and_serve.split(" && ")
    result = subprocess.run(["bash", "-c", " && ".join(install)], cwd=clone,
                            capture_output=True, text=True, timeout=3600)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    python = str(clone / ".venv" / "bin" / "python")
    # What serving needs, not the contributors' toolchain (command 2 adds that).
    absent = _python("import importlib.util as u; print([m for m in ('pyspark', 'pytest', "
                     "'mypy') if u.find_spec(m) is None])", clone, python)
    assert absent.strip() == "['pyspark', 'pytest', 'mypy']", absent
    _check_serve_and_example(clone, serve, python)


def test_the_readme_is_short():
    size = len(README.encode())
    assert size <= README_MAX_BYTES, f"README.md is {size} bytes: move reference to docs/"


def test_tests_without_their_shared_data_are_counted_in_one_line(tmp_path):
    """Command 2 in a checkout with no ../shared next to it (a fresh clone elsewhere): the
    tests reading it are skipped and the run ends with one line counting them. Here: this
    suite's conftest.py in a directory with nothing beside it, and two tests needing it."""
    tests = tmp_path / "checkout" / "tests"
    tests.mkdir(parents=True)
    shutil.copy(ROOT / "tests" / "conftest.py", tests / "conftest.py")
    (tests / "test_uses_shared.py").write_text(
        "def test_a(shared_dir):\n    pass\n\n\ndef test_b(shared_dir):\n    pass\n\n\n"
        "def test_c():\n    pass\n"
    )
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "tests"],
        cwd=tests.parent, capture_output=True, text=True, timeout=GUARD_S * 2,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    shared = tmp_path / "shared"
    lines = [line for line in result.stdout.splitlines() if str(shared) in line]
    assert lines == [f"2 skipped: their data lives in {shared} (../shared, the shared corpus "
                     "and reference), which is not next to this checkout"], result.stdout
    assert "1 passed, 2 skipped" in result.stdout


@pytest.mark.skipif(shutil.which("node") is None, reason="node is not installed")
def test_node_driver_tests_say_why_they_skip_without_npm(tmp_path):
    """Where node is installed but npm is not and the driver is missing, the Node.js driver
    tests are skipped with that reason (where npm is there, the fixture runs `npm ci`: the
    tests in test_server_node.py and test_auth_node.py then run)."""
    tests = tmp_path / "checkout" / "tests"
    (tests / "node").mkdir(parents=True)
    shutil.copy(ROOT / "tests" / "conftest.py", tests / "conftest.py")
    shutil.copy(ROOT / "tests" / "node" / "package-lock.json", tests / "node")
    (tests / "test_node.py").write_text("def test_a(node_driver):\n    pass\n")
    only_node = tmp_path / "bin"
    only_node.mkdir()
    (only_node / "node").symlink_to(shutil.which("node") or "")
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:cacheprovider", "tests"],
        cwd=tests.parent, capture_output=True, text=True, timeout=GUARD_S * 2,
        env={**os.environ, "PATH": str(only_node)},
    )
    assert result.returncode == 0, result.stdout + result.stderr
    assert "1 skipped" in result.stdout
    assert "npm is not installed: cannot install the Node.js driver into tests/node" \
        in result.stdout, result.stdout
