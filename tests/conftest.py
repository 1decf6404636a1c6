import json
import os
import pathlib
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator

import pytest

# Real cdcserver instances on free ports for the driver tests (tests/server/test_server*.py).
pytest_plugins = ["cdcserver.testing"]

SHARED = pathlib.Path(__file__).resolve().parents[1].parent / "shared"
NODE_DIR = pathlib.Path(__file__).resolve().parent / "node"
NPM_TIMEOUT_S = 600  # a hang guard for `npm ci` only


def _node_driver_installed() -> bool:
    """tests/node/node_modules holds exactly what package-lock.json pins (npm's own record
    of what it installed, node_modules/.package-lock.json, lists the same packages)."""
    try:
        pinned = json.loads((NODE_DIR / "package-lock.json").read_text())["packages"]
        installed = json.loads((NODE_DIR / "node_modules" / ".package-lock.json").read_text())
    except (OSError, ValueError, KeyError):
        return False
    return {k: v for k, v in pinned.items() if k} == installed.get("packages")


@pytest.fixture(scope="session")
def node_driver() -> pathlib.Path:
    """The Node.js driver in tests/node (pinned by its package-lock.json): installed with
    `npm ci` on first use when it is missing or stale (then kept: the next runs reuse it);
    the test is skipped, with the reason, where node or npm is not installed."""
    if shutil.which("node") is None:
        pytest.skip("node is not installed: the Node.js driver tests need Node.js >= 20.19")
    if _node_driver_installed():
        return NODE_DIR
    npm = shutil.which("npm")
    if npm is None:
        pytest.skip("npm is not installed: cannot install the Node.js driver into tests/node")
    run = subprocess.run(
        [npm, "ci", "--no-audit", "--no-fund"], cwd=NODE_DIR, capture_output=True, text=True,
        timeout=NPM_TIMEOUT_S,
    )
    if run.returncode != 0 or not _node_driver_installed():
        lines = (run.stderr or run.stdout).strip().splitlines()
        pytest.skip(f"`npm ci` in tests/node failed (offline?): {lines[-1] if lines else ''}")
    return NODE_DIR


@pytest.fixture
def default_metrics_port_held() -> Iterator[int]:
    """127.0.0.1:9216, the metrics port cdcserver uses when none is set, held by a listening
    socket for the test (the one fixed port a test touches: the situation under test is
    "something else holds it"). Already held by another process is the same situation.

    Tests in other workers take turns (a lock file): one that found the port held by another
    worker's fixture would see it freed part-way through, and its server then bind it."""
    import fcntl
    import tempfile

    from cdcserver.config import METRICS_PORT

    lock_path = pathlib.Path(tempfile.gettempdir()) / f"cdcserver-tests-port-{METRICS_PORT}.lock"
    with open(lock_path, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        held: socket.socket | None = socket.socket()
        try:
            held.bind(("127.0.0.1", METRICS_PORT))
            held.listen()
        except OSError:
            held.close()
            held = None
        try:
            yield METRICS_PORT
        finally:
            if held is not None:
                held.close()
            fcntl.flock(lock, fcntl.LOCK_UN)


@pytest.fixture(scope="session", autouse=True)
def _stale_unix_sockets() -> Iterator[None]:
    """A server stopped cleanly removes its Unix domain socket, /tmp/mongodb-<port>.sock; one
    a test kills (SIGKILL, a crash) cannot, and the next server on that port would replace it
    only then. After the run, those this run left (nobody listening on them) are removed."""
    started = time.time()
    yield
    for path in pathlib.Path("/tmp").glob("mongodb-*.sock"):
        try:
            if path.stat().st_mtime < started - 1:
                continue  # older than this run: not ours
            with socket.socket(socket.AF_UNIX) as probe:
                probe.connect(str(path))
        except ConnectionRefusedError:
            path.unlink(missing_ok=True)  # stale: its server is gone
        except OSError:
            pass  # live, or gone meanwhile


# The slow suites (each test over about 15 s on a quiet 2-core machine: SIGKILL loops under
# migrations, the Node.js monitor's 60 s, the jstests that enumerate every predicate shape):
# skipped in the default run, which stays near 10 minutes; CI runs them (CDCSERVER_SLOW=1 in
# .ci/run). Node ids or their prefixes (a file, a test with all its parameters).
SLOW_TESTS = (
    "tests/jstests/test_change_stream_null_existence_eq_rewrite",
    "tests/sharding/test_sharded_crash.py::test_killed_during_data_moves_loses_and_doubles_nothing",
    "tests/sharding/test_sharded_crash_more.py::test_killed_",
    "tests/sharding/test_sharded_commit_crash.py::test_with_transaction_across_router_crashes",
    "tests/sharding/test_sharded_admin_commands.py::test_killed_during_move_collection",
    "tests/spark/test_spark_source.py::test_query_killed_and_restarted_writes_every_event_once",
    "tests/spark/test_spark_replay.py::test_archive_eight_times_the_heap",
    "tests/server/test_streaming_hello_node.py::test_node_clients_monitor_never_fail",
)
RUN_SLOW = os.environ.get("CDCSERVER_SLOW") == "1"


def pytest_collection_modifyitems(config, items) -> None:
    slow = pytest.mark.slow
    skip = pytest.mark.skip(reason="a slow suite: runs with CDCSERVER_SLOW=1 (.ci/run sets it)")
    for item in items:
        if item.nodeid.startswith(SLOW_TESTS):
            item.add_marker(slow)
            if not RUN_SLOW:
                item.add_marker(skip)


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:
    """One line for the tests skipped because their data lives outside this repository
    (../shared: the shared corpus and reference), instead of leaving them among the skips."""
    skipped = terminalreporter.stats.get("skipped", [])
    shared = [r for r in skipped if str(SHARED) in str(getattr(r, "longrepr", ""))]
    if shared:
        terminalreporter.write_line(
            f"{len(shared)} skipped: their data lives in {SHARED} (../shared, the shared "
            "corpus and reference), which is not next to this checkout"
        )


@pytest.fixture(scope="session")
def shared_dir() -> pathlib.Path:
    # Both parts, not just a directory of that name (another checkout's scratch space).
    if not ((SHARED / "corpus").is_dir() and (SHARED / "reference").is_dir()):
        pytest.skip(f"{SHARED} (the shared corpus and reference) is not present")
    return SHARED


# The embedded store most tests/embedded/test_embedded_*.py share: one in-memory server per test
# module and a pymongo client per test. A module that needs other settings defines its own
# `server` (the client below then connects to that one).
@pytest.fixture(scope="module")
def server():
    # Imported here: importing cdcserver.testing at module level would precede its
    # registration as a plugin (pytest_plugins above), and lose assertion rewriting.
    from tests.support.embedded_support import EmbeddedServer

    s = EmbeddedServer()
    yield s
    s.stop()


@pytest.fixture
def client(server):
    c = server.client()
    yield c
    c.close()
