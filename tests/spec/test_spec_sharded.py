"""The drivers' change-stream specification tests against an embedded sharded cluster.

The same files as test_spec_unified.py, run with pymongo against `serve --in-memory
--shards 2` (the cluster in this process: a mongos front on a free loopback port, two shards
on their own). The runner reads the topology from hello (`msg: "isdbgrid"`: sharded), so each
test's runOnRequirements decide which apply to a sharded 8.0 cluster; the others are skipped
with their reason. A test that applies and cannot pass yet is an xfail(strict=True) naming why
(SHARDED_GAPS).
"""

from __future__ import annotations

from collections.abc import Iterator

import pymongo
import pytest
from test_spec_unified import FILES, PYMONGO_LIMITS, SPECS, _key, _spec, run_attempts
from unified_runner import Deployment, SkipTest, load_file

from cdcserver.sharding.testing import ShardedServer

# (file path under SPECS, description) -> why it fails against the sharded front today.
SHARDED_GAPS: dict[tuple[str, str], str] = {}


def _cases() -> list:
    cases = []
    for path in FILES:
        if not path.is_file():
            continue
        spec = load_file(path)
        for index, test in enumerate(spec["tests"]):
            gap = SHARDED_GAPS.get((_key(path), test["description"]))
            marks = [pytest.mark.xfail(strict=True, reason=gap)] if gap else []
            case_id = f"{path.relative_to(SPECS).parts[0]}/{path.stem}: {test['description']}"
            cases.append(pytest.param(path, index, marks=marks, id=case_id))
    return cases


@pytest.fixture(scope="module")
def sharded_server() -> Iterator[ShardedServer]:
    with ShardedServer(2) as server:
        yield server


@pytest.fixture(scope="module")
def sharded_client(sharded_server: ShardedServer) -> Iterator[pymongo.MongoClient]:
    with pymongo.MongoClient(sharded_server.uri) as client:
        yield client


@pytest.fixture(scope="module")
def sharded_deployment(sharded_server, sharded_client) -> Deployment:
    deployment = Deployment.discover(sharded_server.uri, sharded_client)
    assert deployment.topology == "sharded"
    return deployment


@pytest.mark.skipif(not SPECS.is_dir(), reason=f"{SPECS} (the shared corpus) is not present")
@pytest.mark.parametrize(("path", "index"), _cases())
def test_spec_sharded(path, index, sharded_deployment, sharded_client):
    spec = _spec(path)
    test = spec["tests"][index]
    reason = sharded_deployment.unmet_all(spec.get("runOnRequirements")) or \
        sharded_deployment.unmet_all(test.get("runOnRequirements"))
    if reason:
        pytest.skip(reason)
    limit = PYMONGO_LIMITS.get((_key(path), test["description"]))
    if limit:
        pytest.skip(limit)
    try:
        run_attempts(path, spec, test, sharded_deployment, sharded_client)
    except SkipTest as exc:
        pytest.skip(str(exc))
