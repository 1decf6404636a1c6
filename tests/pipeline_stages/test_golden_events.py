"""Golden tests: every item of the corpus' `expected_events.json` against a real cdcserver.

For each item a cdcserver with the embedded store (in memory) is started on a free 127.0.0.1
port; the item's preconditions are written with pymongo, its change stream is opened with
pymongo as the item says (the jstest items as `ChangeStreamTest` does: an `aggregate` command
with `cursor: {batchSize: 1}`, then `getMore`s; the unified-format items with the driver's
`watch()` helper), its operation runs (hand translations in `fixtures/golden_operations.py`),
and the events received are compared with the item's expected events under the item's own
`match` rule:

* `jstest ChangeStreamTest.assertNextChangesEqual` — mongod's `canonicalizeEventForTesting`
  (top-level `_id`, `clusterTime`, `txnNumber`, `lsid`, `collectionUUID`, `wallTime`,
  `operationDescription`, `updateDescription` are dropped unless the expected event has them),
  then the shell's `friendlyEqual(sortDoc(actual), sortDoc(expected))`: field order ignored at
  every level, array order kept, and numbers compared by value the way `friendlyEqual` does it
  (it strips `NumberInt(...)` from `tojson` and doubles print as plain numbers, so int32 and
  double compare by value; a `NumberLong` stays distinct).
* `unified test format expectResult` — the unified test format's `match` (extra fields only at
  the root, `$$exists`, `$$unsetOrMatches`, `$$type`, flexible numerics, key order ignored),
  one `iterateUntilDocumentOrError` per expected event; `expectError` entries expect the
  iteration to fail with that code, code name and error labels.
"""

from __future__ import annotations

import functools
import json
import re
import time
from collections.abc import Mapping
from typing import Any

import bson
import pytest
from bson import json_util
from bson.int64 import Int64
from bson.objectid import ObjectId
from bson.timestamp import Timestamp
from pymongo import MongoClient
from pymongo.errors import OperationFailure

from tests.fixtures.golden_operations import SPEC_INITIAL_DATA, STEPS, TRANSLATIONS
from tests.support.embedded_support import EmbeddedServer

CORPUS = "corpus/expected_events.json"
WAIT_S = 3.0  # a hang guard per expected event: the writes are all done before reading
AWAIT_MS = 50

JSTEST_RULE = "jstest ChangeStreamTest.assertNextChangesEqual"
UNIFIED_RULE = "unified test format expectResult"

# id -> reason: items that cannot apply to cdcserver (none so far).
SKIPS: dict[str, str] = {}

# id -> the bug that makes the item fail (strict: the item must fail until the bug is fixed).
XFAILS: dict[str, str] = {}


def _param(item_id: str) -> Any:
    marks = []
    if item_id in SKIPS:
        marks.append(pytest.mark.skip(reason=SKIPS[item_id]))
    if item_id in XFAILS:
        marks.append(pytest.mark.xfail(strict=True, reason=XFAILS[item_id]))
    return pytest.param(item_id, marks=marks, id=item_id)


@functools.cache
def _load(path: str) -> dict[str, dict[str, Any]]:
    with open(path) as f:
        data = json.load(f)
    return {item["id"]: item for item in data["items"]}


@pytest.fixture
def items(shared_dir) -> dict[str, dict[str, Any]]:
    return _load(str(shared_dir / CORPUS))


@pytest.fixture
def client():
    server = EmbeddedServer()
    c = server.client()
    yield c
    c.close()
    server.stop()


# ---------------------------------------------------------------------------------------------
# Values


def _shell_values(value: Any) -> Any:
    """A jstest's literal as the shell sends it: unadorned numbers are doubles, `NumberInt`
    (written `{$numberInt}`) an int32, `NumberLong` (`{$numberLong}`) an int64."""
    if isinstance(value, dict):
        if list(value) == ["$numberInt"]:
            return int(value["$numberInt"])
        if list(value) == ["$numberLong"]:
            return Int64(int(value["$numberLong"]))
        return {k: _shell_values(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_shell_values(v) for v in value]
    if isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    return value


def _expected(item: Mapping[str, Any]) -> list[dict[str, Any]]:
    return json_util.loads(json.dumps(item["expected_events"]))


# ---------------------------------------------------------------------------------------------
# Match rules


def _is_number(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _shell_equal(actual: Any, expected: Any) -> bool:
    """`friendlyEqual(sortDoc(actual), sortDoc(expected))` of the mongo shell."""
    if isinstance(expected, Mapping):
        return (
            isinstance(actual, Mapping)
            and set(actual) == set(expected)
            and all(_shell_equal(actual[k], expected[k]) for k in expected)
        )
    if isinstance(expected, list):
        return (
            isinstance(actual, list)
            and len(actual) == len(expected)
            and all(_shell_equal(a, e) for a, e in zip(actual, expected))
        )
    if _is_number(expected) and _is_number(actual):
        # tojson: NumberLong(n) for an int64, a plain number for int32 (once NumberInt() is
        # stripped) and double.
        return isinstance(actual, Int64) == isinstance(expected, Int64) and actual == expected
    return type(actual) is type(expected) and actual == expected


CANONICALIZED = ("_id", "clusterTime", "txnNumber", "lsid", "collectionUUID", "wallTime",
                 "operationDescription", "updateDescription")


def _canonicalize(event: Mapping[str, Any], expected: Mapping[str, Any]) -> dict[str, Any]:
    """jstests/libs/change_stream_util.js canonicalizeEventForTesting."""
    return {k: v for k, v in event.items() if k in expected or k not in CANONICALIZED}


def _jstest_check(actual: list[dict], expected: list[dict], unordered: bool) -> None:
    assert len(actual) == len(expected), f"got {len(actual)} events: {_show(actual)}"
    for i, event in enumerate(actual):
        if unordered:
            ok = any(_shell_equal(_canonicalize(event, e), e) for e in expected)
            assert ok, f"event {i} matches no expected event:\n{_show(event)}\n{_show(expected)}"
        else:
            got = _canonicalize(event, expected[i])
            assert _shell_equal(got, expected[i]), (
                f"event {i} differs\nactual:   {_show(got)}\nexpected: {_show(expected[i])}"
            )


_TYPES: dict[str, Any] = {
    "double": lambda v: isinstance(v, float),
    "string": lambda v: isinstance(v, str),
    "object": lambda v: isinstance(v, Mapping),
    "array": lambda v: isinstance(v, list),
    "binData": lambda v: isinstance(v, bytes),
    "objectId": lambda v: isinstance(v, ObjectId),
    "bool": lambda v: isinstance(v, bool),
    "null": lambda v: v is None,
    "int": lambda v: _is_number(v) and isinstance(v, int) and not isinstance(v, Int64),
    "long": lambda v: isinstance(v, Int64),
    "timestamp": lambda v: isinstance(v, Timestamp),
    "number": _is_number,
}


def _operator(value: Any) -> str | None:
    if isinstance(value, Mapping) and len(value) == 1:
        key = next(iter(value))
        if key.startswith("$$"):
            return key
    return None


def _unified_match(expected: Any, actual: Any, path: str = "", root: bool = True) -> None:
    """unified-test-format.md, "Evaluating Matches"."""
    op = _operator(expected)
    if op == "$$type":
        names = expected[op] if isinstance(expected[op], list) else [expected[op]]
        assert any(_TYPES[n](actual) for n in names), f"{path}: {actual!r} is not {names}"
        return
    if op is not None and op != "$$unsetOrMatches":
        raise AssertionError(f"{path}: operator {op} not supported here")
    if op == "$$unsetOrMatches":
        _unified_match(expected[op], actual, path, root=False)
        return
    if isinstance(expected, Mapping):
        assert isinstance(actual, Mapping), f"{path}: {actual!r} is not a document"
        for key, value in expected.items():
            where = f"{path}.{key}" if path else key
            vop = _operator(value)
            if vop == "$$exists":
                assert (key in actual) == value[vop], f"{where}: $$exists {value[vop]}"
                continue
            if vop == "$$unsetOrMatches":
                if key not in actual:
                    continue
                value = value[vop]
                if _operator(value) == "$$exists":
                    assert value["$$exists"], f"{where}: $$unsetOrMatches $$exists false"
                    continue
            assert key in actual, f"{where} is missing from {actual!r}"
            _unified_match(value, actual[key], where, root=False)
        if not root:
            extra = set(actual) - set(expected)
            assert not extra, f"{path}: extra fields {sorted(extra)} in {actual!r}"
        return
    if isinstance(expected, list):
        assert isinstance(actual, list), f"{path}: {actual!r} is not an array"
        assert len(actual) == len(expected), f"{path}: {actual!r} != {expected!r}"
        for i, (a, e) in enumerate(zip(actual, expected)):
            _unified_match(e, a, f"{path}.{i}", root=False)
        return
    if _is_number(expected):
        assert _is_number(actual) and actual == expected, f"{path}: {actual!r} != {expected!r}"
        return
    assert type(actual) is type(expected) and actual == expected, (
        f"{path}: {actual!r} != {expected!r}"
    )


def _show(value: Any) -> str:
    text = json_util.dumps(value)
    return re.sub(r"\*{20,}", lambda m: f"<'*' x {len(m.group(0))}>", text)


# ---------------------------------------------------------------------------------------------
# Preconditions


def _split_ns(ns: str) -> tuple[str, str]:
    db, _, coll = ns.partition(".")
    return db, coll


def _reach_state_after(client: MongoClient, step_id: str, items: Mapping[str, Any]) -> None:
    """The state once `step_id` (an item, or a step the corpus refers to) has run."""
    if step_id in STEPS:
        step = STEPS[step_id]
        _reach_state_after(client, step.after, items)
        step.run(client)
        return
    _prepare(client, items[step_id], items)
    TRANSLATIONS[step_id].before_watch(client)
    TRANSLATIONS[step_id].run(client)


def _prepare(client: MongoClient, item: Mapping[str, Any], items: Mapping[str, Any]) -> None:
    pre = item.get("preconditions")
    if pre is None:  # a unified-format test: its initialData
        assert item["kind"] == "spec_test_assertion", item["id"]
        for data in SPEC_INITIAL_DATA:
            db = client[data["databaseName"]]
            db.drop_collection(data["collectionName"])
            db.create_collection(data["collectionName"])
            if data["documents"]:
                db[data["collectionName"]].insert_many(data["documents"])
        return
    documents = pre["documents"]
    if isinstance(documents, str):
        m = re.match(r"state after ([\w-]+)", documents)
        assert m, f"{item['id']}: unreadable precondition {documents!r}"
        _reach_state_after(client, m.group(1), items)
        return
    db, coll = _split_ns(pre["collection"])
    # assertDropAndRecreateCollection, then the jstest's insert
    client[db].drop_collection(coll)
    client[db].create_collection(coll)
    client[db][coll].insert_many(_shell_values(documents))


# ---------------------------------------------------------------------------------------------
# Change streams


class ShellStream:
    """`ChangeStreamTest.startWatchingChanges` + `getNextChanges`: an `aggregate` command with
    `cursor: {batchSize: 1}`, then `getMore`s with `batchSize: 1`."""

    def __init__(self, client: MongoClient, ns: str, pipeline: list[dict[str, Any]]) -> None:
        db, self.coll = _split_ns(ns)
        self.db = client[db]
        reply = self.db.command(
            {"aggregate": self.coll, "pipeline": pipeline, "cursor": {"batchSize": 1}}
        )
        self.cursor_id = reply["cursor"]["id"]
        assert self.cursor_id != 0
        self.batch = list(reply["cursor"]["firstBatch"])

    def next_change(self) -> dict[str, Any]:
        deadline = time.monotonic() + WAIT_S
        while not self.batch:
            assert self.cursor_id != 0, "the cursor was closed"
            assert time.monotonic() < deadline, "timed out waiting for a change"
            reply = self.db.command({
                "getMore": self.cursor_id, "collection": self.coll, "batchSize": 1,
                "maxTimeMS": AWAIT_MS,
            })
            self.cursor_id = reply["cursor"]["id"]
            self.batch = list(reply["cursor"]["nextBatch"])
        return self.batch.pop(0)

    def changes(self, n: int) -> list[dict[str, Any]]:
        return [self.next_change() for _ in range(n)]


def _watch(client: MongoClient, spec: Mapping[str, Any]) -> Any:
    """A driver `watch()` as a unified-format `createChangeStream` on the item's target."""
    kind, _, target = spec["watch"].partition(" ")
    options: dict[str, Any] = {"max_await_time_ms": AWAIT_MS}
    if "showExpandedEvents" in spec:
        options["show_expanded_events"] = spec["showExpandedEvents"]
    unknown = set(spec) - {"watch", "pipeline", "showExpandedEvents"}
    assert not unknown, f"change stream options not translated: {unknown}"
    if kind == "collection":
        db, coll = _split_ns(target)
        return client[db][coll].watch(spec["pipeline"], **options)
    if kind == "database":
        return client[target].watch(spec["pipeline"], **options)
    assert kind == "cluster", spec["watch"]
    return client.watch(spec["pipeline"], **options)


def _iterate_until_document_or_error(stream: Any) -> dict[str, Any]:
    deadline = time.monotonic() + WAIT_S
    while True:
        event = stream.try_next()
        if event is not None:
            return event
        assert time.monotonic() < deadline, "timed out waiting for a change"


# ---------------------------------------------------------------------------------------------
# The items


def _check_translation(item: Mapping[str, Any]) -> None:
    translation = TRANSLATIONS[item["id"]]
    op = item["operation"]
    if "shell" in op:
        assert translation.source == op["shell"], "the corpus' shell string changed"
    else:
        keys = tuple(k for o in op["unified_ops"] for k in o)
        assert translation.source == keys, "the corpus' unified operations changed"
        before = [k for k in keys if "(before watch)" in k]
        assert keys[: len(before)] == tuple(before), "before-watch operations come first"


def _run_jstest_item(client: MongoClient, item: Mapping[str, Any]) -> None:
    spec = item["change_stream"]
    pipeline = spec["pipeline"]
    options = pipeline[0]["$changeStream"]
    streams = [(ShellStream(client, spec["collection"], pipeline), _expected(item))]
    if "fullDocument" in options and "without fullDocument" in spec.get("note", ""):
        # "a second stream without fullDocument expects the same event minus fullDocument"
        plain = [{"$changeStream": {k: v for k, v in options.items() if k != "fullDocument"}},
                 *pipeline[1:]]
        minus = [{k: v for k, v in e.items() if k != "fullDocument"} for e in _expected(item)]
        streams.append((ShellStream(client, spec["collection"], plain), minus))
    TRANSLATIONS[item["id"]].run(client)
    unordered = "assertNextChangesEqualUnordered" in item.get("notes", "")
    for stream, expected in streams:
        _jstest_check(stream.changes(len(expected)), expected, unordered)


def _run_unified_item(client: MongoClient, item: Mapping[str, Any]) -> None:
    stream = _watch(client, item["change_stream"])
    with stream:
        TRANSLATIONS[item["id"]].run(client)
        for i, expected in enumerate(_expected(item)):
            if "expectError" in expected:
                want = expected["expectError"]
                with pytest.raises(OperationFailure) as info:
                    _iterate_until_document_or_error(stream)
                err = info.value
                assert err.code == want["errorCode"], err.details
                assert err.details.get("codeName") == want["errorCodeName"], err.details
                for label in want.get("errorLabelsContain", []):
                    assert err.has_error_label(label), err.details
                continue
            event = _iterate_until_document_or_error(stream)
            try:
                _unified_match(expected, event)
            except AssertionError as exc:
                raise AssertionError(
                    f"event {i}: {exc}\nactual:   {_show(event)}\nexpected: {_show(expected)}"
                ) from None


def test_every_item_has_a_translation(shared_dir):
    ids = list(_load(str(shared_dir / CORPUS)))
    assert ids == list(TRANSLATIONS)


@pytest.mark.parametrize("item_id", [_param(i) for i in TRANSLATIONS])
def test_golden(item_id, items, client):
    item = items[item_id]
    _check_translation(item)
    _prepare(client, item, items)
    TRANSLATIONS[item_id].before_watch(client)
    if item["match"].startswith(JSTEST_RULE):
        _run_jstest_item(client, item)
    elif item["match"].startswith(UNIFIED_RULE):
        _run_unified_item(client, item)
    else:
        pytest.fail(f"no implementation of the match rule {item['match']!r}")


def test_shell_equal_is_friendly_equal():
    """The comparator itself: order-free documents, ordered arrays, NumberInt == double."""
    assert _shell_equal({"a": 1, "b": [1, {"c": 2.0}]}, {"b": [1.0, {"c": 2}], "a": 1.0})
    assert not _shell_equal({"a": [1, 2]}, {"a": [2, 1]})
    assert not _shell_equal({"a": Int64(2)}, {"a": 2})
    assert not _shell_equal({"a": True}, {"a": 1})
    assert not _shell_equal({"a": 1, "b": 1}, {"a": 1})
    assert _canonicalize({"_id": 1, "wallTime": 2, "x": 3}, {"x": 3}) == {"x": 3}


def test_unified_match_rules():
    _unified_match({"a": 1, "b": {"$$exists": False}}, {"a": 1.0, "c": 2})
    _unified_match({"a": {"$$unsetOrMatches": {"$$exists": True}}}, {})
    _unified_match({"a": {"x": {"$$type": ["int", "long"]}}}, {"a": {"x": Int64(1)}})
    with pytest.raises(AssertionError):
        _unified_match({"a": {"x": 1}}, {"a": {"x": 1, "y": 2}})  # nested: no extra fields
    with pytest.raises(AssertionError):
        _unified_match({"a": [1]}, {"a": [1, 2]})
    with pytest.raises(AssertionError):
        _unified_match({"a": "1"}, {"a": 1})
    assert bson.decode(bson.encode(_shell_values({"n": 1, "i": {"$numberInt": "2"}}))) == {
        "n": 1.0, "i": 2
    }
