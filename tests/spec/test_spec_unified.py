"""The drivers' specification tests for change streams, run with pymongo against cdcserver.

Files: `specifications/change-streams/tests/unified/*.json` (89 tests) and the optional
change-stream files beside them: retryable-reads `changeStreams-*.json`, collection-management
`*-pre_and_post_images.json`, client-side-operations-timeout `change-streams.json`, and the
unified-test-format `poc-change-streams.json`. They come from the shared corpus
(`../shared/corpus/specifications`, see its PROVENANCE.md).

They run against both compatibility profiles (`[server] compatibility`): as MongoDB 8.0.12 and
as 9.0.4, each a replica set; under 9.0 the tests for 8.1+ (nsType) apply as well, and 8.2.0's
exclusions stay out. Every test whose runOnRequirements the profile satisfies runs and must
pass; a test that cannot apply is skipped with its reason (unmet runOnRequirements, or a
pymongo limitation listed in PYMONGO_LIMITS); a failure that is a known bug outside this
directory is an xfail(strict=True) naming it (KNOWN_BUGS).
"""

from __future__ import annotations

import pathlib

import pytest
from pymongo import MongoClient
from pymongo.errors import PyMongoError
from unified_runner import Deployment, Runner, SkipTest, load_file

SPECS = pathlib.Path(__file__).resolve().parents[3] / "shared" / "corpus" / "specifications"

FILES = [
    *sorted((SPECS / "change-streams" / "tests" / "unified").glob("*.json")),
    *sorted((SPECS / "retryable-reads" / "tests" / "unified").glob("changeStreams-*.json")),
    *sorted((SPECS / "collection-management" / "tests").glob("*pre_and_post_images.json")),
    SPECS / "client-side-operations-timeout" / "tests" / "change-streams.json",
    SPECS / "unified-test-format" / "tests" / "valid-pass" / "poc-change-streams.json",
]

# Tests that cannot apply with pymongo: (file path under SPECS, description) -> reason. A
# file-wide entry uses "*" as the description.
_CSOT = "client-side-operations-timeout/tests/change-streams.json"
_NO_CSOT_VALIDATION = (
    "pymongo 4.20 has no timeoutMS option for watch() (its CSOT is `with pymongo.timeout()`, "
    "which the runner puts around each call on the stream) and does not check maxAwaitTimeMS "
    "against it; pymongo's own unified runner skips all CSOT change-stream tests ('CSOT not "
    "implemented for watch()')"
)
PYMONGO_LIMITS: dict[tuple[str, str], str] = {
    (_CSOT, "error if maxAwaitTimeMS is greater than timeoutMS"):
        _NO_CSOT_VALIDATION,
    (_CSOT, "error if maxAwaitTimeMS is equal to timeoutMS"):
        _NO_CSOT_VALIDATION,
}

# Known failures caused by code outside tests/spec: (file path under SPECS, description) -> the
# bug and the file that has it.
KNOWN_BUGS: dict[tuple[str, str], str] = {}


def _key(path: pathlib.Path) -> str:
    return path.relative_to(SPECS).as_posix()


def _cases() -> list:
    cases = []
    for path in FILES:
        if not path.is_file():
            continue
        spec = load_file(path)
        for index, test in enumerate(spec["tests"]):
            key = (_key(path), test["description"])
            marks = []
            bug = KNOWN_BUGS.get(key)
            if bug:
                marks.append(pytest.mark.xfail(strict=True, reason=bug))
            case_id = f"{path.relative_to(SPECS).parts[0]}/{path.stem}: {test['description']}"
            cases.append(pytest.param(path, index, marks=marks, id=case_id))
    return cases


_SPEC_CACHE: dict[pathlib.Path, dict] = {}


def _spec(path: pathlib.Path) -> dict:
    if path not in _SPEC_CACHE:
        _SPEC_CACHE[path] = load_file(path)
    return _SPEC_CACHE[path]


@pytest.fixture(scope="session", params=["8.0", "9.0"])
def profile(request) -> tuple[Deployment, MongoClient]:
    """(the deployment, a client of it) for one profile: the 8.0 server the other spec files
    share, or the 9.0 one."""
    if request.param == "8.0":
        return request.getfixturevalue("deployment"), request.getfixturevalue(
            "spec_internal_client")
    server = request.getfixturevalue("spec_server_9_0")
    client: MongoClient = MongoClient(server.uri)
    request.addfinalizer(client.close)
    return Deployment.discover(server.uri, client), client


@pytest.mark.skipif(not SPECS.is_dir(), reason=f"{SPECS} (the shared corpus) is not present")
@pytest.mark.parametrize(("path", "index"), _cases())
def test_spec(path, index, profile):
    deployment, spec_internal_client = profile
    spec = _spec(path)
    test = spec["tests"][index]
    limit = PYMONGO_LIMITS.get((_key(path), test["description"])) or PYMONGO_LIMITS.get(
        (_key(path), "*")
    )
    try:
        if limit:
            # Only a test that applies to cdcserver can be excused by a pymongo limitation.
            reason = deployment.unmet_all(spec.get("runOnRequirements")) or deployment.unmet_all(
                test.get("runOnRequirements")
            )
            raise SkipTest(reason or limit)
        run_attempts(path, spec, test, deployment, spec_internal_client)
    except SkipTest as exc:
        pytest.skip(str(exc))


def run_attempts(
    path: pathlib.Path, spec: dict, test: dict, deployment: Deployment, client: MongoClient
) -> None:
    """Runs `test`; CSOT tests measure time against blocked commands with margins of 20-50 ms,
    so like pymongo's own runner, they get three attempts (a loaded machine can miss a margin
    once)."""
    attempts = 3 if _key(path).startswith("client-side-operations-timeout/") else 1
    for attempt in range(attempts):
        try:
            Runner(deployment, client).run(spec, test)
            return
        except (AssertionError, PyMongoError):
            if attempt == attempts - 1:
                raise
