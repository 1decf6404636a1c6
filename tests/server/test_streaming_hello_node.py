"""A Node.js driver client (npm `mongodb`, pinned in tests/node) stays connected for 60 s to
`cdcserver serve --in-memory`, `serve --in-memory --shards 2` and a sidecar (`serve
--upstream` of the first) with no failed heartbeat and no cleared connection pool.

Every Node.js client (mongosh, Compass, Mongoose) monitors with the streaming hello (hello
{topologyVersion, maxAwaitTimeMS: 10000} with exhaustAllowed, replies expected with moreToCome,
one per topology change or per maxAwaitTimeMS). A server that answers once without moreToCome
gets "Server ended moreToCome unexpectedly": a serverHeartbeatFailed, the server marked Unknown
and its pool cleared, every ~10 s (issue 27). The three clients run side by side, so the 60 s
the issue asks for cost CI 60 s, not 180 (CDCSERVER_STREAMING_HELLO_S sets another length).
The driver's own clock decides nothing here but the run's length: what is asserted is which
events came (none of the failures, and at least one awaited heartbeat that succeeded: the
streaming protocol was really used).
"""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import subprocess
from collections.abc import Iterator

import pytest

from cdcserver.testing import SubprocessServer

NODE = shutil.which("node")
SECONDS = float(os.environ.get("CDCSERVER_STREAMING_HELLO_S", "60"))
HANG_GUARD_S = SECONDS + 90  # the node processes' own timeout, a hang guard only
MODES = ("in-memory", "shards-2", "sidecar")

pytestmark = pytest.mark.skipif(
    NODE is None, reason="node is not installed: the Node.js driver test needs Node.js >= 20.19"
)


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, SubprocessServer]]:
    servers: dict[str, SubprocessServer] = {}
    try:
        servers["in-memory"] = SubprocessServer()
        servers["shards-2"] = SubprocessServer(extra_args=["--shards", "2"])
        retained = tmp_path_factory.mktemp("sidecar_retained")
        config = pathlib.Path(retained) / "sidecar.toml"
        config.write_text(f'[upstream]\nretain_dir = "{retained}"\n')
        servers["sidecar"] = SubprocessServer(
            upstream=servers["in-memory"].direct_uri, extra_args=["--config", str(config)]
        )
        yield servers
    finally:
        for server in reversed(list(servers.values())):
            server.stop()


def test_node_clients_monitor_never_fail(served: dict[str, SubprocessServer], node_driver) -> None:
    assert NODE is not None
    runs = {
        mode: subprocess.Popen(
            [NODE, "monitor.mjs", json.dumps({"uri": served[mode].uri, "seconds": SECONDS})],
            cwd=node_driver, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        for mode in MODES
    }
    reports = {}
    try:
        for mode, run in runs.items():
            out, err = run.communicate(timeout=HANG_GUARD_S)
            assert run.returncode == 0, (mode, err)
            reports[mode] = json.loads(out.strip().splitlines()[-1])
    finally:
        for run in runs.values():
            if run.poll() is None:
                run.kill()
                run.wait()
    for mode, report in reports.items():
        assert report["heartbeatsFailed"] == [], (mode, report)
        assert report["poolsCleared"] == [], (mode, report)
        assert report["errors"] == [], (mode, report)
        assert report["awaitedSucceeded"] >= 1, (mode, report)  # the streaming protocol in use
        assert report["pings"] >= 1, (mode, report)
