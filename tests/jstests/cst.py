"""What mongod's jstests/libs/change_stream_util.js gives its change-stream jstests, in Python.

Translated from `jstests/libs/change_stream_util.js` in mongodb/mongo @
00587bf02e46e8251e876b26d93b9c0df1bf216d (facts learned, code our own):

- `ChangeStreamTest` opens change streams with raw `aggregate` commands (first batch of 1 unless
  told otherwise) and reads them with raw `getMore`s of `batchSize: 1`, exactly as the shell
  helper does; it kills every cursor it opened in `clean_up`.
- `canonicalize_event_for_testing` drops the fields a test cannot know (`_id`, `clusterTime`,
  `txnNumber`, `lsid`, `collectionUUID`, `wallTime`, `operationDescription`, `nsType`, and
  `updateDescription`) unless the expected event names them.
- `event_eq` compares like `friendlyEqual(sortDoc(a), sortDoc(b))` in the legacy shell: field
  order is ignored at every depth, array order is not; a BSON int32 and a double are the same
  JavaScript number, an int64 is a `NumberLong` and differs from both.
"""

from __future__ import annotations

import datetime
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from bson.int64 import Int64
from pymongo.database import Database
from pymongo.errors import OperationFailure

# A hang guard for `assert.soon` (the shell's default is 10 minutes): a getMore waits at most
# its awaitData time, so this counts round trips, not seconds.
SOON_TRIES = 30
CANONICAL_IGNORED = (
    "_id", "clusterTime", "txnNumber", "lsid", "collectionUUID", "wallTime",
    "operationDescription", "nsType",
)


def canonicalize_event_for_testing(event: dict[str, Any], expected: Mapping[str, Any]) -> dict:
    for name in CANONICAL_IGNORED:
        if name not in expected:
            event.pop(name, None)
    if "updateDescription" not in expected:
        event.pop("updateDescription", None)
    return event


def _shell_value(value: Any) -> Any:
    """The value as the legacy shell's tojson(sortDoc(...)) sees it."""
    if isinstance(value, Mapping):
        return ("{}", tuple(sorted((k, _shell_value(v)) for k, v in value.items())))
    if isinstance(value, (list, tuple)):
        return ("[]", tuple(_shell_value(v) for v in value))
    if isinstance(value, bool):
        return ("bool", value)
    if isinstance(value, Int64):
        return ("NumberLong", int(value))
    if isinstance(value, (int, float)):
        return ("number", float(value))
    if isinstance(value, datetime.datetime):
        return ("Date", value.replace(tzinfo=None))
    return (type(value).__name__, value)


def event_eq(
    actual: Mapping[str, Any],
    expected: Mapping[str, Any],
    modifier: Callable[[dict, Mapping[str, Any]], dict] = canonicalize_event_for_testing,
) -> bool:
    return _shell_value(modifier(dict(actual), expected)) == _shell_value(expected)


def assert_change_stream_event_eq(
    actual: Mapping[str, Any], expected: Mapping[str, Any],
    modifier: Callable[[dict, Mapping[str, Any]], dict] = canonicalize_event_for_testing,
) -> None:
    assert event_eq(actual, expected, modifier), (
        f"Change events did not match. Expected: {expected!r}, Actual: {actual!r}"
    )


def _batch(cursor: Mapping[str, Any]) -> list[Any]:
    return cursor["nextBatch"] if "nextBatch" in cursor else cursor["firstBatch"]


def _coll_name(ns: str) -> str:
    return ns.split(".", 1)[1]


class ChangeStreamTest:
    """The shell's `ChangeStreamTest(db)`: cursors are the `cursor` sub-documents of replies."""

    def __init__(self, db: Database) -> None:
        self.db = db
        # The shell's one implicit session: a cursor's getMores come in the session it was
        # opened in (mongod refuses another's, 50737).
        self.session = db.client.start_session()
        self._all: list[tuple[str, Any, int]] = []
        self.last_reply: dict[str, Any] = {}

    def start_watching_changes(
        self, pipeline: list[Any], collection: Any, aggregate_options: dict | None = None
    ) -> dict[str, Any]:
        options = dict(aggregate_options or {})
        options.setdefault("cursor", {"batchSize": 1})
        command = {"aggregate": collection, "pipeline": pipeline, **options}
        reply = self.db.command(command, session=self.session)
        cursor = reply["cursor"]
        assert cursor["id"] != 0
        self._all.append((self.db.name, collection, cursor["id"]))
        self.last_reply = reply
        return cursor

    def start_watching_all_changes_for_cluster(
        self, aggregate_options: dict | None = None
    ) -> dict[str, Any]:
        assert self.db.name == "admin"
        return self.start_watching_changes(
            [{"$changeStream": {"allChangesForCluster": True}}], 1, aggregate_options
        )

    def get_next_batch(self, cursor: Mapping[str, Any]) -> dict[str, Any]:
        reply = self.db.command(
            {"getMore": cursor["id"], "collection": _coll_name(cursor["ns"]), "batchSize": 1},
            session=self.session,
        )
        self.last_reply = reply
        return reply["cursor"]

    def _next_doc(self, cursor: Mapping[str, Any]) -> Any:
        batch = _batch(cursor)
        if not batch:
            return None
        assert len(batch) == 1, f"Batch length wasn't 0 or 1: {cursor!r}"
        return batch[0]

    def get_next_changes(
        self, cursor: Mapping[str, Any], num_changes: int, skip_first: bool = False
    ) -> list[Any]:
        changes: list[Any] = []
        for i in range(num_changes):
            if i == 0 and not skip_first:
                first = self._next_doc(cursor)
                if first is not None:
                    changes.append(first)
                    continue
            for _ in range(SOON_TRIES):
                assert cursor["id"] != 0, (
                    f"Cursor has been closed unexpectedly. Observed change stream events: "
                    f"{changes!r}"
                )
                cursor = self.get_next_batch(cursor)
                change = self._next_doc(cursor)
                if change is not None:
                    changes.append(change)
                    break
            else:
                raise AssertionError(
                    f"timed out waiting for another result from the change stream, observed "
                    f"changes: {changes!r}, expected changes: {num_changes}"
                )
        return changes

    def assert_next_changes_equal(
        self,
        cursor: Mapping[str, Any],
        expected_changes: Iterable[Mapping[str, Any]] | None = None,
        expected_num_changes: int | None = None,
        expect_invalidate: bool = False,
        skip_first_batch: bool = False,
        ignore_order: bool = False,
    ) -> list[Any]:
        expected = list(expected_changes) if expected_changes is not None else None
        if expected is not None and expected_num_changes is not None:
            assert len(expected) == expected_num_changes
        if expected_num_changes is None:
            assert expected is not None
            expected_num_changes = len(expected)
        changes = self.get_next_changes(cursor, expected_num_changes, skip_first_batch)
        if ignore_order:
            assert expected is not None
            assert len(changes) == expected_num_changes, f"{changes!r} != {expected!r}"
            for change in changes:
                assert any(event_eq(change, e) for e in expected), f"{changes!r} != {expected!r}"
        else:
            for i, change in enumerate(changes):
                if expected is not None:
                    assert_change_stream_event_eq(change, expected[i])
                elif not expect_invalidate:
                    assert change["operationType"] != "invalidate", changes
        if expect_invalidate:
            assert changes[-1]["operationType"] == "invalidate", changes
            final = self.get_next_batch(cursor)
            assert final["id"] == 0, f"Final cursor was not killed: {final!r}"
        return changes

    def assert_next_changes_equal_unordered(
        self, cursor: Mapping[str, Any], expected_changes: list[Mapping[str, Any]], **kw: Any
    ) -> list[Any]:
        return self.assert_next_changes_equal(
            cursor, expected_changes, ignore_order=True, **kw
        )

    def assert_no_change(self, cursor: Mapping[str, Any]) -> dict[str, Any]:
        cursor = self.get_next_batch(cursor)
        assert len(cursor["nextBatch"]) == 0, f"Cursor had changes: {cursor!r}"
        return cursor

    def get_one_change(self, cursor: Mapping[str, Any], expect_invalidate: bool = False) -> Any:
        changes = self.get_next_changes(cursor, 1, True)
        if expect_invalidate:
            assert changes[-1]["operationType"] == "invalidate", changes
            final = self.get_next_batch(cursor)
            assert final["id"] == 0, f"Final cursor was not killed: {final!r}"
        return changes[0]

    def consume_drop_up_to(
        self, cursor: Mapping[str, Any], drop_type: str, expected_next: Mapping[str, Any],
        expect_invalidate: bool = False,
    ) -> list[Any]:
        """`consumeDropUpTo`: any number of `drop_type` events, then `expected_next`."""
        results = []
        change = self.get_one_change(cursor, expect_invalidate)
        while change["operationType"] == drop_type:
            results.append(change)
            change = self.get_one_change(cursor, expect_invalidate)
        results.append(change)
        assert_change_stream_event_eq(change, expected_next)
        return results

    def assert_database_drop(self, cursor: Mapping[str, Any], db_name: str) -> list[Any]:
        """`assertDatabaseDrop`: drop events, then the dropDatabase event."""
        return self.consume_drop_up_to(
            cursor, "drop", {"operationType": "dropDatabase", "ns": {"db": db_name}}
        )

    def get_resume_token(self, cursor: Mapping[str, Any]) -> Any:
        """The postBatchResumeToken of the cursor's latest reply (after an invalidate: the
        invalidate's token, which `startAfter` accepts)."""
        return self.last_reply["cursor"]["postBatchResumeToken"]

    def clean_up(self) -> None:
        for db_name, coll, cursor_id in self._all:
            name = coll if isinstance(coll, str) else "$cmd.aggregate"
            self.db.client[db_name].command({"killCursors": name, "cursors": [cursor_id]})
        self._all.clear()


def assert_change_stream_throws_code(
    db: Database, coll_name: Any, pipeline: list[Any], expected_code: int
) -> None:
    """`ChangeStreamTest.assertChangeStreamThrowsCode`: the aggregate or a later getMore fails
    with `expected_code`, and no event comes before it."""
    session = db.client.start_session()  # the cursor's, for its getMores too
    try:
        reply = db.command({"aggregate": coll_name, "pipeline": pipeline,
                            "cursor": {"batchSize": 1}}, session=session)
        cursor = reply["cursor"]
        assert not cursor["firstBatch"], f"Unexpected result from cursor: {cursor!r}"
        for _ in range(SOON_TRIES):
            cursor = db.command({"getMore": cursor["id"], "collection": _coll_name(cursor["ns"])},
                                session=session)["cursor"]
            assert not cursor["nextBatch"], f"Unexpected result from cursor: {cursor!r}"
    except OperationFailure as error:
        assert error.code == expected_code, f"Caught unexpected error: {error.details!r}"
        return
    raise AssertionError("expected this to be unreachable")


def assert_invalid_change_stream_nss(
    client: Any, db_name: str, coll_name: Any = "test", options: dict | None = None
) -> None:
    """`assertInvalidChangeStreamNss`: fails with InvalidNamespace (73) or InvalidOptions (72)."""
    try:
        client[db_name].command(
            {"aggregate": coll_name, "pipeline": [{"$changeStream": options or {}}], "cursor": {}}
        )
    except OperationFailure as error:
        assert error.code in (73, 72), error.details
        return
    raise AssertionError(f"a change stream on {db_name}.{coll_name} was opened")


def assert_valid_change_stream_nss(
    client: Any, db_name: str, coll_name: Any = "test", options: dict | None = None
) -> None:
    reply = client[db_name].command(
        {"aggregate": coll_name, "pipeline": [{"$changeStream": options or {}}], "cursor": {}}
    )
    client[db_name].command({"killCursors": coll_name if coll_name != 1 else "$cmd.aggregate",
                             "cursors": [reply["cursor"]["id"]]})


def wo_compare(a: dict, b: dict) -> int:
    """bsonWoCompare of two resume tokens: their `_data` strings."""
    return (a["_data"] > b["_data"]) - (a["_data"] < b["_data"])


class ShellCursor:
    """The shell's DBCommandCursor over a change stream: `has_next` sends a getMore when the
    batch is empty; `get_resume_token` is the last event's `_id` while the batch has more, else
    the batch's postBatchResumeToken. Built by watching `coll` with `options`, or from a reply."""

    def __init__(self, coll: Any, pipeline: list[Any] | None = None,
                 batch_size: int | None = None, reply: dict[str, Any] | None = None,
                 session: Any = None, **options: Any) -> None:
        self.db = coll.database
        self.coll_name = coll.name
        # The shell's cursor sends its getMores in the session it was opened in (mongod
        # refuses a getMore from another session: 50737); `reply` came in `session`.
        self.session = session if session is not None else self.db.client.start_session()
        if reply is None:
            cursor: dict[str, Any] = {} if batch_size is None else {"batchSize": batch_size}
            reply = self.db.command({"aggregate": coll.name,
                                     "pipeline": [{"$changeStream": options}, *(pipeline or [])],
                                     "cursor": cursor}, session=self.session)
        self.batch_size = batch_size
        self._take(reply["cursor"], "firstBatch")

    def _take(self, cursor: dict[str, Any], field: str) -> None:
        self.id = cursor["id"]
        self.batch = list(cursor[field])
        self.pbrt = cursor["postBatchResumeToken"]
        if not self.batch:
            self.token = self.pbrt

    def objs_left_in_batch(self) -> int:
        return len(self.batch)

    def has_next(self) -> bool:
        if self.batch:
            return True
        if self.id == 0:
            return False  # exhausted: the shell sends no getMore
        command: dict[str, Any] = {"getMore": self.id, "collection": self.coll_name}
        if self.batch_size:
            command["batchSize"] = self.batch_size
        self._take(self.db.command(command, session=self.session)["cursor"], "nextBatch")
        return bool(self.batch)

    def soon_has_next(self) -> None:
        for _ in range(SOON_TRIES):
            if self.has_next():
                return
        raise AssertionError("no event")

    def next(self) -> dict[str, Any]:
        assert self.has_next()
        event = self.batch.pop(0)
        self.token = self.pbrt if not self.batch else event["_id"]
        return event

    def get_resume_token(self) -> dict[str, Any]:
        return self.token

    def is_exhausted(self) -> bool:
        return self.id == 0 and not self.batch

    def close(self) -> None:
        if self.id:
            self.db.command({"killCursors": self.coll_name, "cursors": [self.id]})
            self.id = 0
