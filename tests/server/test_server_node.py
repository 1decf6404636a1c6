"""The Node.js driver (npm `mongodb`, pinned in tests/node/package-lock.json) sees the same
events as pymongo.

tests/node/watch.mjs prints each event as canonical Extended JSON; pymongo's events are
dumped the same way, and both are compared as ordered key/value pairs, so types (int32,
int64, double, timestamps, binary subtypes) and field order must agree, not just values.
The `node_driver` fixture (tests/conftest.py) installs the driver with `npm ci` when it is
missing; the test is skipped, with the reason, only where node or npm is absent.
"""

from __future__ import annotations

import json
import pathlib
import shutil
import subprocess

import pytest
from bson import json_util
from pymongo import MongoClient

from cdcserver.testing import ThreadServer
from tests.support.server_support import (
    DOOMED_EVENTS,
    ITEMS,
    ORDERS_EVENTS,
    SHOP_EVENTS,
    World,
    describe,
    drain,
    token_order,
)

NODE_DIR = pathlib.Path(__file__).parent.parent / "node"
CANONICAL = json_util.JSONOptions(json_mode=json_util.JSONMode.CANONICAL)
NODE = shutil.which("node")
TIMEOUT_S = 60  # a hang guard only

pytestmark = pytest.mark.skipif(
    NODE is None, reason="node is not installed: the Node.js driver test needs Node.js >= 20.19"
)


@pytest.fixture(scope="module")
def world(tmp_path_factory, node_driver):
    world = World.record(tmp_path_factory.mktemp("node") / "oplog.bson")
    with ThreadServer([world.path]) as server:
        world.server = server
        yield world


@pytest.fixture(scope="module")
def client(world):
    with MongoClient(world.server.uri, serverSelectionTimeoutMS=10_000) as client:
        yield client


def _pairs(text: str):
    """JSON with objects as lists of (key, value) pairs: equality then includes key order."""
    return json.loads(text, object_pairs_hook=lambda pairs: [list(p) for p in pairs])


def _canonical(doc) -> list:
    return _pairs(json_util.dumps(doc, json_options=CANONICAL))


def token_doc(pairs: list) -> dict:
    return {k: v for k, v in pairs}


def _node_config(world, **config) -> str:
    return json_util.dumps({"uri": world.server.uri, **config}, json_options=CANONICAL)


def _finish(proc: subprocess.Popen, out: list[str]) -> tuple[list, list]:
    rest, err = proc.communicate(timeout=TIMEOUT_S)
    lines = out + rest.splitlines()
    assert proc.returncode == 0, f"node exited {proc.returncode}:\n{err}\n{lines}"
    docs = [_pairs(line) for line in lines if line.strip()]
    assert docs and docs[-1][0][0] == "resumeToken", docs[-1:]
    return [d for d in docs if d[0][0] != "ready"][:-1], docs[-1][0][1]


def run_node(world, **config) -> tuple[list, list]:
    """(events, final resume token) as the Node.js driver printed them."""
    proc = subprocess.Popen(
        [NODE, "watch.mjs", _node_config(world, **config)],
        cwd=NODE_DIR,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    return _finish(proc, [])


def _pymongo_events(target, world, n, pipeline=None, **options):
    """The first `n` events, and the stream's resume token after them."""
    with target.watch(
        pipeline, start_at_operation_time=world.first_ts, max_await_time_ms=100, **options
    ) as stream:
        return drain(stream, n), stream.resume_token


@pytest.mark.parametrize(
    ("coll", "expected", "pipeline"),
    [
        ("orders", ORDERS_EVENTS, None),
        ("doomed", DOOMED_EVENTS, None),
        (None, SHOP_EVENTS, None),
        (
            None,
            [e for e in SHOP_EVENTS if e[3] is not None and e[3] <= 2],
            [{"$match": {"documentKey._id": {"$lte": 2}}}],
        ),
    ],
    ids=["collection", "collection-invalidated", "database", "database-match"],
)
def test_recorded_events_match_pymongo(world, client, coll, expected, pipeline):
    target = client.shop if coll is None else client.shop[coll]
    ours, our_token = _pymongo_events(target, world, len(expected), pipeline)
    assert [describe(e) for e in ours] == expected
    config = {
        "db": "shop", "count": len(expected), "options": {"startAtOperationTime": world.first_ts},
    }
    if coll is not None:
        config["coll"] = coll
    if pipeline is not None:
        config["pipeline"] = pipeline
    events, token = run_node(world, **config)
    assert events == [_canonical(e) for e in ours]
    # After a whole batch, both drivers hold its postBatchResumeToken.
    assert token == _canonical(our_token)


def test_resume_after_matches_pymongo(world, client):
    ours, _ = _pymongo_events(client.shop.orders, world, 8)
    events, _ = run_node(
        world, db="shop", coll="orders", count=5, options={"resumeAfter": ours[2]["_id"]}
    )
    assert events == [_canonical(e) for e in ours[3:]]


def test_live_events_match_pymongo(world, client):
    with client.shop.items.watch(max_await_time_ms=100) as stream:
        assert stream.try_next() is None
        proc = subprocess.Popen(
            [NODE, "watch.mjs", _node_config(world, db="shop", coll="items", count=3, ready=True)],
            cwd=NODE_DIR,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            first = proc.stdout.readline()  # node's stream is open
            assert _pairs(first) == [["ready", True]], first
            world.oplog.insert(ITEMS, {"_id": "node-1", "n": 1.25, "tags": ["a", "b"]})
            world.oplog.update(ITEMS, "node-1", {"u": {"n": 2.5}})
            world.oplog.delete(ITEMS, "node-1")
            world.flush()
            ours = drain(stream, 3)
            our_token = stream.resume_token
            events, token = _finish(proc, [])
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
    assert [e["operationType"] for e in ours] == ["insert", "update", "delete"]
    assert events == [_canonical(e) for e in ours]
    assert token_order(token_doc(token)) >= token_order(our_token)


MONGOSH_DIR = NODE_DIR / "mongosh"
NPM_TIMEOUT_S = 600  # a hang guard for the first install (about 150 MB)


def _mongosh_installed() -> bool:
    try:
        pinned = json.loads((MONGOSH_DIR / "package-lock.json").read_text())["packages"]
        installed = json.loads((MONGOSH_DIR / "node_modules" / ".package-lock.json").read_text())
    except (OSError, ValueError, KeyError):
        return False
    got = installed.get("packages", {})
    # Everything pinned is installed as pinned, except optional packages for other platforms.
    wanted = {k: v for k, v in pinned.items() if k and (k in got or not v.get("optional"))}
    return all(got.get(k) == v for k, v in wanted.items()) and set(got) <= set(pinned)


@pytest.fixture(scope="module")
def mongosh() -> pathlib.Path:
    """mongosh 2.x, pinned by tests/node/mongosh/package-lock.json (its own directory, so the
    driver tests do not install it): `npm ci` on first use (no install scripts: mongosh's
    native extras are optional), skipped with the reason where npm cannot install it."""
    if not _mongosh_installed():
        npm = shutil.which("npm")
        if npm is None:
            pytest.skip("npm is not installed: cannot install mongosh into tests/node/mongosh")
        run = subprocess.run(
            [npm, "ci", "--ignore-scripts", "--no-audit", "--no-fund"], cwd=MONGOSH_DIR,
            capture_output=True, text=True, timeout=NPM_TIMEOUT_S,
        )
        if run.returncode != 0 or not _mongosh_installed():
            lines = (run.stderr or run.stdout).strip().splitlines()
            pytest.skip(f"`npm ci` in tests/node/mongosh failed (offline?): "
                        f"{lines[-1] if lines else ''}")
    return MONGOSH_DIR / "node_modules" / ".bin" / "mongosh"


def test_mongosh_shell_helpers(world, client, mongosh):
    """mongosh 2.x: `rs.status()`, `db.serverStatus()` and `db.adminCommand({getCmdLineOpts:
    1})` work and say what pymongo is told (tests/node/mongosh/mongosh_admin.js)."""
    run = subprocess.run(
        [str(mongosh), world.server.direct_uri, "--quiet", "--norc", "--file", "mongosh_admin.js"],
        cwd=MONGOSH_DIR, capture_output=True, text=True, timeout=TIMEOUT_S,
    )
    assert run.returncode == 0, f"mongosh exited {run.returncode}:\n{run.stderr}\n{run.stdout}"
    shell = {}
    for line in run.stdout.splitlines():
        if line.startswith("{"):
            shell.update(json_util.loads(line))
    hello = client.admin.command("hello")
    status = shell["rsStatus"]
    assert status["ok"] == 1 and status["set"] == hello["setName"]
    assert [(m["name"], m["stateStr"], m["self"]) for m in status["members"]] == [
        (hello["me"], "PRIMARY", True)]
    server_status = shell["serverStatus"]
    assert server_status["ok"] == 1
    assert server_status["version"] == client.server_info()["version"]
    assert server_status["repl"]["setName"] == hello["setName"]
    assert set(server_status["opcounters"]) == {
        "insert", "query", "update", "delete", "getmore", "command"}
    opts = shell["cmdLineOpts"]
    assert opts["ok"] == 1
    assert opts["parsed"] == client.admin.command("getCmdLineOpts")["parsed"]
    assert opts["parsed"]["net"]["port"] == world.server.port
    assert shell["hello"]["setName"] == hello["setName"]
