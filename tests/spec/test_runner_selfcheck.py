"""The runner must be able to fail: its matching rules, and spec tests altered to be wrong."""

from __future__ import annotations

import copy

import pytest
from bson.int64 import Int64
from test_spec_unified import SPECS, _spec
from unified_runner import EntityMap, Matcher, Runner

CHANGE_STREAMS = SPECS / "change-streams" / "tests" / "unified"
pytestmark = pytest.mark.skipif(not SPECS.is_dir(), reason=f"{SPECS} is not present")


@pytest.fixture
def matcher() -> Matcher:
    return Matcher(EntityMap(None))  # type: ignore[arg-type]


def test_matching_rules(matcher):
    ok = [
        ({"x": 1}, {"x": 1, "y": 2}, True),  # extra fields at the root
        ({"x": 1}, {"x": 1.0}, True),  # flexible numbers
        ({"x": 1}, {"x": Int64(1)}, True),
        ({"x": {"$$exists": False}}, {}, True),
        ({"x": {"$$exists": True}}, {"x": None}, True),
        ({"x": {"$$unsetOrMatches": 1}}, {}, True),
        ({"x": {"$$type": ["int", "long"]}}, {"x": Int64(5)}, True),
        ({"x": {"$$type": "object"}}, {"x": {"a": 1}}, True),
        ([{"a": 1}], [{"a": 1}], True),
    ]
    for expected, actual, _ in ok:
        matcher.match(expected, actual)
    bad = [
        ({"x": {"y": 1}}, {"x": {"y": 1, "z": 2}}),  # no extra fields below the root
        ({"x": 1}, {"x": 1.5}),
        ({"x": 1}, {"x": True}),
        ({"x": 1}, {}),
        ({"x": {"$$exists": False}}, {"x": 1}),
        ({"x": {"$$exists": True}}, {}),
        ({"x": {"$$unsetOrMatches": 1}}, {"x": 2}),
        ({"x": {"$$type": "int"}}, {"x": Int64(5)}),
        ({"x": {"$$type": "string"}}, {}),
        ({"x": [1, 2]}, {"x": [1, 2, 3]}),
        ({"x": "a"}, {"x": b"a"}),
    ]
    for expected, actual in bad:
        with pytest.raises(AssertionError):
            matcher.match(expected, actual)


def _altered(name: str, description: str, change) -> tuple[dict, dict]:
    spec = copy.deepcopy(_spec(CHANGE_STREAMS / name))
    test = next(t for t in spec["tests"] if t["description"] == description)
    change(test)
    return spec, test


def _run(deployment, client, spec, test) -> None:
    Runner(deployment, client).run(spec, test)


def test_altered_event_fails(deployment, spec_internal_client):
    name = "change-streams.json"
    description = "Test insert, update, replace, and delete event types"
    spec, test = _altered(name, description, lambda t: None)
    _run(deployment, spec_internal_client, spec, test)  # as written: passes

    def wrong_type(t):
        next(o for o in t["operations"] if "expectResult" in o)["expectResult"][
            "operationType"] = "update"

    with pytest.raises(AssertionError, match="operationType"):
        _run(deployment, spec_internal_client, *_altered(name, description, wrong_type))

    def no_extra_events(t):  # the getMores are then unexpected
        t["expectEvents"][0]["ignoreExtraEvents"] = False

    with pytest.raises(AssertionError, match="expected 1 events"):
        _run(deployment, spec_internal_client, *_altered(name, description, no_extra_events))


def test_altered_error_fails(deployment, spec_internal_client):
    name = "change-streams-errors.json"
    description = "change stream errors on ElectionInProgress"

    def wrong_code(t):
        next(o for o in t["operations"] if "expectError" in o)["expectError"]["errorCode"] = 6

    with pytest.raises(AssertionError, match="code 216"):
        _run(deployment, spec_internal_client, *_altered(name, description, wrong_code))

    def no_fail_point(t):
        t["operations"] = [o for o in t["operations"] if o["name"] != "failPoint"]
        t.pop("expectEvents", None)

    with pytest.raises(AssertionError):  # no error comes: the iteration gives up, or a document
        _run(deployment, spec_internal_client, *_altered(name, description, no_fail_point))
