"""A Node.js driver client (npm `mongodb`, pinned in tests/node) stays connected to `cdcserver
serve --in-memory` and `serve --in-memory --shards 2` with no failed heartbeat and no cleared
connection pool.

Every Node.js client (mongosh, Compass, Mongoose) monitors with the streaming hello (hello
{topologyVersion, maxAwaitTimeMS: 10000} with exhaustAllowed, replies expected with moreToCome,
one per topology change or per maxAwaitTimeMS). A server that answers once without moreToCome
gets "Server ended moreToCome unexpectedly": a serverHeartbeatFailed, the server marked Unknown
and its pool cleared, every ~10 s (issue 27). Issue 27 asks for 60 s; 25 s (two full
maxAwaitTimeMS cycles and more) keeps CI time down: set CDCSERVER_STREAMING_HELLO_S to run
longer. The driver's own clock decides nothing here but the run's length: what is asserted is
which events came (none of the failures, and at least one awaited heartbeat that succeeded:
the streaming protocol was really used).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Iterator

import pytest

from cdcserver.testing import SubprocessServer

NODE = shutil.which("node")
SECONDS = float(os.environ.get("CDCSERVER_STREAMING_HELLO_S", "25"))
HANG_GUARD_S = SECONDS + 60  # the node process's own timeout, a hang guard only

pytestmark = pytest.mark.skipif(
    NODE is None, reason="node is not installed: the Node.js driver test needs Node.js >= 20.19"
)


@pytest.fixture(scope="module", params=["in-memory", "shards-2"])
def served(request: pytest.FixtureRequest, node_driver) -> Iterator[SubprocessServer]:
    extra = ["--shards", "2"] if request.param == "shards-2" else []
    server = SubprocessServer(extra_args=extra)
    try:
        yield server
    finally:
        server.stop()


def test_node_client_monitor_never_fails(served: SubprocessServer, node_driver) -> None:
    assert NODE is not None
    run = subprocess.run(
        [NODE, "monitor.mjs", json.dumps({"uri": served.uri, "seconds": SECONDS})],
        cwd=node_driver, capture_output=True, text=True, timeout=HANG_GUARD_S,
    )
    assert run.returncode == 0, run.stderr
    report = json.loads(run.stdout.strip().splitlines()[-1])
    assert report["heartbeatsFailed"] == [], report
    assert report["poolsCleared"] == [], report
    assert report["errors"] == [], report
    assert report["awaitedSucceeded"] >= 1, report  # the streaming protocol was in use
    assert report["pings"] >= 1, report
