"""PyMongo's own tests, unchanged, against `cdcserver serve --in-memory`: a second conformance
suite next to the drivers' specification tests (tests/spec/).

The change-stream files run in the normal test run and must pass outright: no failure, no
error, and every skip one that says the test is for another server version or topology.
The wider files (marker `pymongo_suite_slow`; they run when CDCSERVER_PYMONGO_SUITE_SLOW=1,
as CI sets it) must have no failure beyond the list below, where each known failure is a
strict xfail naming what cdcserver lacks (known_failures.py: test -> cause, the causes'
texts in pymongo_suite_harness.CAUSES); one that starts passing fails the run until it is taken
off the list (`python tests/pymongo_suite/pymongo_suite_harness.py update` rewrites it).
Tests of the machine rather than the server (handshake metadata that sees a container, DNS
SRV lookups) may pass on one machine and fail on another: they are not run, and are reported
as skips naming why (pymongo_suite_harness.NOT_RUN), as is one that would break the run.
"""

from __future__ import annotations

import concurrent.futures
import os
import pathlib

import pytest
from known_failures import KNOWN_FAILURES
from pymongo_suite_harness import (
    CAUSES,
    NOT_RUN,
    NOT_RUN_CAUSES,
    TOPOLOGY_OR_VERSION_SKIPS,
    WIDER_FILES,
    Case,
    Run,
    Unavailable,
    not_run_ids,
    run_files,
    suite_tree,
)

from cdcserver.testing import HOST, SubprocessServer

CHANGE_STREAM_FILES = ["test/test_change_stream.py", "test/asynchronous/test_change_stream.py"]
CHANGE_STREAM_TIMEOUT_S = 600.0  # a hang guard (the two files take about a minute)

SLOW = os.environ.get("CDCSERVER_PYMONGO_SUITE_SLOW") == "1"
WIDER_TIMEOUT_S = 2400.0



@pytest.fixture(scope="module")
def tree() -> pathlib.Path:
    try:
        return suite_tree()
    except Unavailable as exc:
        pytest.skip(f"PyMongo's test suite could not be fetched (offline?): {exc}")


def _run(
    tree: pathlib.Path, files: list[str], timeout_s: float, deselect: list[str] | None = None
) -> Run:
    with SubprocessServer() as server:  # `serve --in-memory` on a free port
        return run_files(tree, files, HOST, server.port, timeout_s, deselect=deselect or ())


def _describe(cases: list[Case]) -> str:
    return "\n".join(f"{c.outcome}: {c.nodeid}: {c.message[:300]}" for c in cases)


@pytest.fixture(scope="module")
def change_stream_run(tree: pathlib.Path) -> Run:
    return _run(tree, CHANGE_STREAM_FILES, CHANGE_STREAM_TIMEOUT_S)


@pytest.mark.parametrize("file", CHANGE_STREAM_FILES)
def test_change_stream_file(change_stream_run: Run, file: str) -> None:
    cases = change_stream_run.of(file)
    assert cases, f"no results for {file}:\n{change_stream_run.output[-3000:]}"
    failed = [c for c in cases if c.outcome in ("failed", "error")]
    assert not failed, _describe(failed)
    odd_skips = [
        c for c in cases
        if c.outcome == "skipped" and not TOPOLOGY_OR_VERSION_SKIPS.search(c.message)
    ]
    assert not odd_skips, _describe(odd_skips)
    counts = change_stream_run.counts(file)
    assert counts["passed"] > counts["skipped"], counts


# -- the wider files ---------------------------------------------------------------------------

slow = [
    pytest.mark.pymongo_suite_slow,
    pytest.mark.skipif(not SLOW, reason="PyMongo's wider files: set "
                       "CDCSERVER_PYMONGO_SUITE_SLOW=1 to run them (CI does)"),
]


# Known failures of a topology cdcserver is not (a one-member replica set has no secondary):
# not run at all, since each would only wait out the driver's 30 s server selection; reported
# as skips naming why.
NOT_THIS_TOPOLOGY = frozenset({"no-secondary"})


def _not_this_topology() -> list[str]:
    return [
        f"{file}::{test}"
        for file, known in KNOWN_FAILURES.items()
        for test, cause in known.items()
        if cause in NOT_THIS_TOPOLOGY
    ]


def _halves(files: list[str]) -> tuple[list[str], list[str]]:
    """Two groups of about equal run time: a sync file's async twin goes to the other group,
    the files without a twin alternate."""
    twins = {f for f in files if f.replace("test/", "test/asynchronous/", 1) in files}
    first = sorted(twins)
    second = [f.replace("test/", "test/asynchronous/", 1) for f in first]
    alone = [f for f in files if f not in twins and f not in second]
    return first + alone[0::2], second + alone[1::2]


@pytest.fixture(scope="module")
def wider_run(tree: pathlib.Path) -> Run:
    # Each half against its own server, side by side: a run waits on the server more than it
    # computes, so two use the machine's cores where one left them half idle (430 s -> about
    # half).
    deselect = _not_this_topology() + not_run_ids()
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        runs = list(pool.map(
            lambda files: _run(tree, files, WIDER_TIMEOUT_S, deselect), _halves(WIDER_FILES)))
    return Run(
        [case for run in runs for case in run.cases],
        max(run.returncode for run in runs),
        "\n".join(run.output for run in runs),
    )


@pytest.mark.parametrize("file", [pytest.param(f, marks=slow) for f in WIDER_FILES])
def test_wider_file(wider_run: Run, file: str) -> None:
    cases = wider_run.of(file)
    assert cases, f"no results for {file}:\n{wider_run.output[-3000:]}"
    known = KNOWN_FAILURES.get(file, {})
    unexpected = [
        c for c in cases
        if c.outcome in ("failed", "error") and c.nodeid[len(file) + 2:] not in known
    ]
    assert not unexpected, _describe(unexpected)


def _known_params() -> list:
    params = []
    for file, known in KNOWN_FAILURES.items():
        for test, cause in known.items():
            reason = CAUSES[cause][1]
            if cause in NOT_THIS_TOPOLOGY:
                marks = [*slow, pytest.mark.skip(reason=f"not run: {reason}")]
            else:
                marks = [*slow,
                         pytest.mark.xfail(strict=True, raises=AssertionError, reason=reason)]
            params.append(pytest.param(file, test, marks=marks, id=f"{file}::{test}"))
    return params


# The tests of the machine rather than the server, and the one that would break the run
# (harness NOT_RUN): not run, each reported as a skip naming why.
@pytest.mark.parametrize("test", [
    pytest.param(f"{file}::{test}", marks=[
        *slow, pytest.mark.skip(reason=f"not run: {NOT_RUN_CAUSES[cause]}")],
        id=f"{file}::{test}")
    for file, tests in NOT_RUN.items() for test, cause in tests.items()
])
def test_wider_not_run(test: str) -> None:
    raise AssertionError(f"{test} is never run (NOT_RUN)")


@pytest.mark.parametrize(("file", "test"), _known_params())
def test_wider_known_failure(wider_run: Run, file: str, test: str) -> None:
    matches = [c for c in wider_run.of(file) if c.nodeid == f"{file}::{test}"]
    if not matches:
        raise LookupError(f"{file}::{test} did not run (renamed upstream?)")
    case = matches[0]
    assert case.outcome not in ("failed", "error"), case.message[:500]
