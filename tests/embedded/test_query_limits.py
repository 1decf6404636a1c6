"""Long queries do not hold the server, `maxTimeMS` ends them, and `$regex` runs in linear
time with MongoDB's (PCRE) meaning (issue 13 item 4).

A scan pauses between documents (cdcserver/embedded/query.py); these tests hold a scan at
such a pause through `query.pause_hook` and check what happens meanwhile, so they depend on
the order of events, never on how long anything takes. The timeouts below only turn a hang
into a failure.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from bson.regex import Regex
from pymongo.errors import ExecutionTimeout, OperationFailure

from cdcserver.embedded import query
from tests.support.embedded_support import Outside

GUARD_S = 60.0
N = 1000  # documents: many more than query.CHECK_EVERY, so a scan pauses many times


@pytest.fixture
def coll(client) -> Iterator[Any]:
    c = client.qlimits.docs
    c.drop()
    c.insert_many([{"_id": i, "s": f"item {i}", "n": i % 7} for i in range(N)])
    yield c
    c.drop()


@pytest.fixture
def every_document(monkeypatch: pytest.MonkeyPatch) -> None:
    """Scans pause at every checkpoint (not only after YIELD_AFTER_S of work)."""
    monkeypatch.setattr(query, "YIELD_AFTER_S", 0.0)


class Gate:
    """Holds the first scan that pauses, at its pauses, until released (other commands'
    scans go on)."""

    def __init__(self) -> None:
        self.reached = threading.Event()
        self.released = threading.Event()
        self.holding: asyncio.Task[Any] | None = None

    async def __call__(self) -> None:
        task = asyncio.current_task()
        if self.holding is None:
            self.holding = task
        if task is not self.holding:
            return
        self.reached.set()
        while not self.released.is_set():
            await asyncio.sleep(0.001)


# The long operations: each reads the whole collection (N documents).
OPERATIONS: dict[str, Callable[[Any], Any]] = {
    "find": lambda c: len(list(c.find({"s": {"$regex": "^item"}}))),
    "count": lambda c: c.count_documents({"s": {"$regex": "^item"}}),
    "count_command": lambda c: c.database.command("count", c.name, query={"n": {"$gte": 0}})["n"],
    "distinct": lambda c: len(c.distinct("n", {"s": {"$regex": "item"}})),
    "aggregate": lambda c: len(list(c.aggregate([{"$match": {"s": {"$regex": "^item"}}}]))),
    "aggregate_stages": lambda c: len(list(c.aggregate([
        {"$project": {"s": 1}}, {"$match": {"s": {"$regex": "^item"}}}, {"$set": {"k": 1}},
    ]))),
    "update_many": lambda c: c.update_many({"s": {"$regex": "^item"}},
                                           {"$set": {"seen": True}}).modified_count,
    "delete_many": lambda c: c.delete_many({"s": {"$regex": "^item"}}).deleted_count,
}
EXPECTED = {"find": N, "count": N, "count_command": N, "distinct": 7, "aggregate": N,
            "aggregate_stages": N, "update_many": N, "delete_many": N}


@pytest.mark.parametrize("name", sorted(OPERATIONS))
def test_other_connections_are_served_while_a_scan_runs(
    server, client, coll, every_document, monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    gate = Gate()
    monkeypatch.setattr(query, "pause_hook", gate)
    slow = Outside(lambda: OPERATIONS[name](coll))
    slow.start()
    other = server.client()
    try:
        assert gate.reached.wait(GUARD_S), "the scan never paused"
        # The scan is part-way (held at a pause): another connection is answered now.
        assert other.admin.command("ping")["ok"] == 1.0
        assert other.qlimits.other.insert_one({"x": 1}).acknowledged
        assert slow.is_alive()  # the ping came first
    finally:
        gate.released.set()
        slow.join(GUARD_S)
        other.close()
    assert not slow.is_alive()
    assert slow.error is None, slow.error
    assert slow.result == EXPECTED[name]


class Stall:
    """Makes the first pause of a scan last past any small maxTimeMS."""

    def __init__(self) -> None:
        self.done = False

    async def __call__(self) -> None:
        if not self.done:
            self.done = True
            await asyncio.sleep(0.2)


MAX_TIME_MS = 50  # less than Stall's pause


@pytest.mark.parametrize("name", sorted(OPERATIONS))
def test_max_time_ms_ends_a_scan_with_50(
    coll, every_document, monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    monkeypatch.setattr(query, "pause_hook", Stall())
    db = coll.database
    commands: dict[str, dict[str, Any]] = {
        "find": {"find": coll.name, "filter": {"s": {"$regex": "^item"}}},
        "count": {"count": coll.name, "query": {"s": {"$regex": "^item"}}},
        "count_command": {"count": coll.name, "query": {"n": {"$gte": 0}}},
        "distinct": {"distinct": coll.name, "key": "n", "query": {"s": {"$regex": "item"}}},
        "aggregate": {"aggregate": coll.name, "pipeline": [{"$match": {"s": {"$regex": "^i"}}}],
                      "cursor": {}},
        "aggregate_stages": {"aggregate": coll.name, "cursor": {},
                             "pipeline": [{"$project": {"s": 1}}, {"$set": {"k": 1}}]},
        "update_many": {"update": coll.name, "updates": [
            {"q": {"s": {"$regex": "^item"}}, "u": {"$set": {"seen": True}}, "multi": True}]},
        "delete_many": {"delete": coll.name, "deletes": [
            {"q": {"s": {"$regex": "^item"}}, "limit": 0}]},
    }
    with pytest.raises(ExecutionTimeout) as err:
        db.command({**commands[name], "maxTimeMS": MAX_TIME_MS})
    assert err.value.code == 50
    assert err.value.details["codeName"] == "MaxTimeMSExpired"
    # a deadline that passes while documents are produced: mongod 8.0's find, distinct and
    # aggregate give it their executor's context (count and the writes: as the store has them)
    context = {"find": f"Executor error during find command: {coll.full_name} :: caused by :: ",
               "distinct": "Executor error during distinct command :: caused by :: ",
               "aggregate": "PlanExecutor error during aggregation :: caused by :: ",
               "aggregate_stages": "PlanExecutor error during aggregation :: caused by :: "}
    assert err.value.details["errmsg"] == context.get(name, "") + "operation exceeded time limit"
    # Nothing was written by a write that ran out of time while matching.
    assert coll.count_documents({}) == N
    assert coll.count_documents({"seen": True}) == 0


def test_max_time_ms_leaves_a_scan_that_finishes_alone(coll, every_document) -> None:
    assert coll.count_documents({"s": {"$regex": "^item"}}, maxTimeMS=60_000) == N
    assert len(list(coll.find({"n": 3}).max_time_ms(60_000))) == len(range(3, N, 7))


# ---------------------------------------------------------------------------------------------
# $regex


def test_catastrophic_regex_matches_in_linear_time(client) -> None:
    """`^(a+)+$` backtracks exponentially in PCRE and Python's re: 2^63 steps for 64
    characters. The answer comes back (and is right) with and without maxTimeMS."""
    c = client.qlimits.rx
    c.drop()
    c.insert_many([{"_id": 1, "s": "a" * 63 + "b"}, {"_id": 2, "s": "a" * 64},
                   {"_id": 3, "s": "a" * 27 + "b"}, {"_id": 4, "s": "a" * 28}])
    result: list[Any] = []
    later_match = [{"$project": {"s": 1}}, {"$match": {"s": {"$regex": "^(a+)+$"}}}]
    runner = Outside(lambda: result.extend(
        [d["_id"] for d in c.find({"s": {"$regex": "^(a+)+$"}}).max_time_ms(500)]
        + [d["_id"] for d in c.find({"s": {"$regex": "^(a+)+$"}})]
        + [d["_id"] for d in c.aggregate(later_match)]))
    runner.start()
    runner.join(GUARD_S)
    assert not runner.is_alive(), "the regex did not finish"
    assert runner.error is None, runner.error
    assert result == [2, 4, 2, 4, 2, 4]


@pytest.fixture
def texts(client) -> Iterator[Any]:
    c = client.qlimits.texts
    c.drop()
    c.insert_many([
        {"_id": 1, "s": "abc"},
        {"_id": 2, "s": "ABC"},
        {"_id": 3, "s": "abc\n"},
        {"_id": 4, "s": "x\nabc\ny"},
        {"_id": 5, "s": "a\nc"},
        {"_id": 6, "s": "aa"},
        {"_id": 7, "s": "a{,2}"},
        {"_id": 8, "s": ["zzz", "abc"]},
        {"_id": 9, "s": 12},
        {"_id": 10, "s": "١٢"},  # Arabic-Indic digits: not \d in PCRE without UCP
    ])
    yield c
    c.drop()


def _ids(c: Any, flt: dict[str, Any]) -> list[int]:
    return sorted(d["_id"] for d in c.find(flt, {"_id": 1}))


@pytest.mark.parametrize(("flt", "expected"), [
    ({"s": {"$regex": "^abc$"}}, [1, 3, 8]),  # PCRE's $ also matches before a final newline
    ({"s": {"$regex": "^abc$", "$options": "i"}}, [1, 2, 3, 8]),
    ({"s": {"$regex": "^abc$", "$options": "m"}}, [1, 3, 4, 8]),
    ({"s": {"$regex": "^a.c$"}}, [1, 3, 8]),
    ({"s": {"$regex": "^a.c$", "$options": "s"}}, [1, 3, 5, 8]),
    ({"s": {"$regex": "^a b c  # the letters\n$", "$options": "x"}}, [1, 3, 8]),
    ({"s": {"$regex": "^abc$", "$options": "u"}}, [1, 3, 8]),
    ({"s": {"$regex": r"^(a)\1$"}}, [6]),  # a backreference: not RE2, still PCRE's meaning
    ({"s": {"$regex": "^a(?=a)"}}, [6]),  # lookahead
    ({"s": {"$regex": "^a{,2}$"}}, [7]),  # PCRE2 reads {,2} literally
    ({"s": {"$regex": r"^\d+$"}}, []),
    ({"s": Regex("^ABC$", "i")}, [1, 2, 3, 8]),
    ({"s": {"$in": [Regex("^zz"), "aa"]}}, [6, 8]),
    ({"s": {"$not": Regex("^a")}}, [2, 4, 9, 10]),
    ({"s": {"$elemMatch": {"$regex": "^z"}}}, [8]),
    ({"$or": [{"s": {"$regex": "^x"}}, {"s": {"$regex": "C$"}}]}, [2, 4]),
])
def test_regex_semantics_are_pcre(texts, flt: dict[str, Any], expected: list[int]) -> None:
    assert _ids(texts, flt) == expected


@pytest.mark.parametrize(("flt", "code", "message"), [
    ({"s": {"$regex": "a", "$options": "g"}}, 51108, " invalid flag in regex options: g"),
    ({"s": {"$regex": "a("}}, 51091, "Regular expression is invalid"),
    ({"s": {"$regex": Regex("a", "i"), "$options": "m"}}, 51075,
     "options set in both $regex and $options"),
    ({"s": {"$options": "m", "$regex": Regex("a", "i")}}, 51074,
     "options set in both $regex and $options"),
    ({"s": {"$regex": "a", "$options": 1}}, 2, "$options has to be a string"),
])
def test_regex_parse_errors(texts, flt: dict[str, Any], code: int, message: str) -> None:
    with pytest.raises(OperationFailure) as err:
        list(texts.find(flt))
    assert err.value.code == code
    assert message in err.value.details["errmsg"]


# A lookahead: RE2 cannot run it, and a backtracking engine tries all 2^40 ways to split the
# a's before failing. It runs in a worker process, off the event loop, until maxTimeMS.
BACKTRACKING = {"s": {"$regex": "^(a+)+(?=b)"}}


def test_backtracking_regex_runs_off_the_loop_until_max_time_ms(server, client) -> None:
    from cdcserver.embedded import regex

    c = client.qlimits.backtracking
    c.drop()
    c.insert_many([{"_id": 1, "s": "aab"}, {"_id": 2, "s": "a" * 40 + "c"}])
    events: list[str] = []

    def slow() -> None:
        try:
            list(c.find(BACKTRACKING).max_time_ms(3000))
        except ExecutionTimeout as exc:
            assert exc.code == 50
            events.append("find: 50")

    started = regex.stats["offloaded"]
    runner = Outside(slow)
    runner.start()
    other = server.client()
    try:
        guard = threading.Event()
        for _ in range(int(GUARD_S / 0.005)):  # until the server is matching (order, not time)
            if regex.stats["offloaded"] > started + 1:
                break
            guard.wait(0.005)
        assert other.admin.command("ping")["ok"] == 1.0
        events.append("ping")
    finally:
        runner.join(GUARD_S)
        other.close()
    assert runner.error is None, runner.error
    assert events == ["ping", "find: 50"]
    # The same filter without the pathological document answers (in the worker, no deadline).
    c.delete_one({"_id": 2})
    assert [d["_id"] for d in c.find(BACKTRACKING)] == [1]
    assert c.update_many(BACKTRACKING, {"$set": {"hit": 1}}).modified_count == 1


def test_change_stream_match_regex_is_linear_and_pcre(client) -> None:
    """A change stream's $match uses the same regex matcher (pipeline_stages/user_stages.py)."""
    c = client.qlimits.watched
    c.drop()
    c.insert_one({"_id": 0})
    pipeline = [{"$match": {"$or": [{"fullDocument.s": {"$regex": "^(a+)+$"}},
                                    {"fullDocument.s": {"$regex": "^abc$", "$options": "i"}}]}}]
    got: list[Any] = []

    def watch() -> None:
        with c.watch(pipeline) as stream:
            c.insert_many([{"_id": 1, "s": "a" * 63 + "b"}, {"_id": 2, "s": "a" * 64},
                           {"_id": 3, "s": "ABC\n"}, {"_id": 4, "s": "abcd"}, {"_id": 5}])
            while len(got) < 2:
                got.append(stream.next()["documentKey"]["_id"])

    runner = Outside(watch)
    runner.start()
    runner.join(GUARD_S)
    assert not runner.is_alive(), "the change stream's $match did not finish"
    assert runner.error is None, runner.error
    assert got == [2, 3]
    with pytest.raises(OperationFailure) as err:
        with c.watch([{"$match": {"fullDocument.s": {"$regex": "("}}}]) as stream:
            stream.try_next()
    assert err.value.code == 51091


class WriteGate(Gate):
    """Holds a multi-document write at its first pause after it has written `after`
    documents (the store's oplog grows by one entry per document)."""

    def __init__(self, server: Any, after: int) -> None:
        super().__init__()
        self.store = server.store
        self.threshold = self.store.oplog_count() + after

    async def __call__(self) -> None:
        if self.store.oplog_count() >= self.threshold:
            await super().__call__()


@pytest.mark.parametrize("name", ["update_many", "delete_many"])
def test_a_multi_document_write_pauses_between_documents(
    server, coll, every_document, monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    gate = WriteGate(server, after=10)
    monkeypatch.setattr(query, "pause_hook", gate)
    slow = Outside(lambda: OPERATIONS[name](coll))
    slow.start()
    other = server.client()
    try:
        assert gate.reached.wait(GUARD_S), "the write never paused"
        assert other.admin.command("ping")["ok"] == 1.0
        # part-way: what it has written is visible (each document's write commits on its own)
        view = other.qlimits.docs
        done = (view.count_documents({"seen": True}) if name == "update_many"
                else N - view.count_documents({}))
        assert 10 <= done < N
        assert slow.is_alive()
    finally:
        gate.released.set()
        slow.join(GUARD_S)
        other.close()
    assert slow.error is None, slow.error
    assert slow.result == N
    if name == "update_many":
        assert coll.count_documents({"seen": True}) == N
    else:
        assert coll.count_documents({}) == 0


WRITE_MAX_TIME_MS = 3000  # ample for matching and 10 writes on a busy machine


class StallAfterWrites:
    """Makes the first pause after `after` written documents outlast WRITE_MAX_TIME_MS."""

    def __init__(self, server: Any, after: int) -> None:
        self.store = server.store
        self.threshold = self.store.oplog_count() + after
        self.done = False

    async def __call__(self) -> None:
        if not self.done and self.store.oplog_count() >= self.threshold:
            self.done = True
            await asyncio.sleep(WRITE_MAX_TIME_MS / 1000 + 0.2)


def test_max_time_ms_ends_a_multi_document_write_part_way(
    server, coll, every_document, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(query, "pause_hook", StallAfterWrites(server, after=10))
    with pytest.raises(ExecutionTimeout) as err:
        coll.database.command({
            "update": coll.name, "maxTimeMS": WRITE_MAX_TIME_MS,
            "updates": [{"q": {"n": {"$gte": 0}}, "u": {"$set": {"seen": True}}, "multi": True}],
        })
    assert err.value.code == 50
    # as mongod: the documents written before the deadline stay written
    assert 10 <= coll.count_documents({"seen": True}) < N


@pytest.mark.parametrize(("name", "value", "code", "message"), [
    ("find", "x", 14, "BSON field 'find.maxTimeMS' is the wrong type 'string', expected types "
                      "'[long, int, decimal, double']"),
    ("find", -1, 51024, "BSON field 'maxTimeMS' value must be >= 0, actual value '-1'"),
    ("aggregate", [1], 14, "BSON field 'aggregate.maxTimeMS' is the wrong type 'array', "
                           "expected types '[long, int, decimal, double']"),
    ("aggregate", 1000.5, 2, "maxTimeMS has non-integral value"),
    ("aggregate", 2**31, 2, "2147483648 value for maxTimeMS is out of range"),
    ("aggregate", None, 2, "maxTimeMS must be a number"),
    ("count", -1, 2, "-1 value for maxTimeMS is out of range"),
    ("distinct", "x", 2, "maxTimeMS must be a number"),
])
def test_max_time_ms_argument_errors(client, name: str, value: Any, code: int,
                                     message: str) -> None:
    commands = {"find": {"find": "c"}, "aggregate": {"aggregate": "c", "pipeline": [],
                                                     "cursor": {}},
                "count": {"count": "c"}, "distinct": {"distinct": "c", "key": "a"}}
    with pytest.raises(OperationFailure) as err:
        client.qlimits.command({**commands[name], "maxTimeMS": value})
    assert (err.value.code, err.value.details["errmsg"]) == (code, message)


def test_a_find_on_a_view_pauses_too(
    server, client, coll, every_document, monkeypatch: pytest.MonkeyPatch
) -> None:
    db = client.qlimits
    db.drop_collection("docs_view")
    db.command("create", "docs_view", viewOn="docs",
               pipeline=[{"$project": {"s": 1, "n": 1}}, {"$match": {"n": {"$gte": 0}}}])
    gate = Gate()
    monkeypatch.setattr(query, "pause_hook", gate)
    slow = Outside(lambda: len(list(db.docs_view.find({"s": {"$regex": "^item"}}))))
    slow.start()
    other = server.client()
    try:
        assert gate.reached.wait(GUARD_S), "the view's scan never paused"
        assert other.admin.command("ping")["ok"] == 1.0
        assert slow.is_alive()
    finally:
        gate.released.set()
        slow.join(GUARD_S)
        other.close()
        db.drop_collection("docs_view")
    assert slow.error is None, slow.error
    assert slow.result == N


@pytest.mark.parametrize(("pattern", "options", "text", "matches"), [
    (r"abc\Z", "", "abc\n", True),  # \Z: the end or before a final newline, as $
    (r"abc\Z", "", "abc\nd", False),
    ("a[ ]b", "x", "a b", True),  # extended mode keeps whitespace inside a class
    (r"a\ b", "x", "a b", True),  # and an escaped space
    ("a[#]b # a comment", "x", "a#b", True),
    ("^a$", "", "a\n\n", False),
    ("(^a$)", "", "a\n", True),
    ("a$|b", "", "xb", True),
    ("(a$)b", "", "ab", False),  # $ followed by more pattern: backtracking fallback, same answer
    ("é", "i", "É", True),
])
def test_regex_translation_keeps_pcre_meaning(client, pattern: str, options: str, text: str,
                                              matches: bool) -> None:
    c = client.qlimits.one_text
    c.drop()
    c.insert_one({"s": text})
    found = c.count_documents({"s": {"$regex": pattern, "$options": options}})
    assert found == (1 if matches else 0)
    c.drop()
