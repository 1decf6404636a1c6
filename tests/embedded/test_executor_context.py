"""The context mongod 8.0 adds to an error raised while a read runs, through pymongo against
the embedded store (cdcserver/commands/executor_context.py): "PlanExecutor error during
aggregation", "Executor error during find command: <ns>", "Executor error during distinct
command"; "Failed to optimize pipeline" for an expression of constants (folded before the
pipeline runs, bare in a find); none for a parse error. The codes stay the same."""

from __future__ import annotations

import pytest
from pymongo.errors import OperationFailure

from cdcserver.testing import EmbeddedServer

AGG = "PlanExecutor error during aggregation :: caused by :: "
OPT = "Failed to optimize pipeline :: caused by :: "
BAD_INT = ("Failed to parse number 'abc' in $convert with no onError value: Did not consume "
           "whole string.")


@pytest.fixture(scope="module")
def db():
    with EmbeddedServer() as s:
        client = s.client()
        d = client.ctx
        d.a.insert_many([{"_id": 1, "x": "abc", "z": 0}])
        d.command("create", "va", viewOn="a", pipeline=[])
        yield d
        client.close()


def _error(run) -> tuple[int, str]:
    with pytest.raises(OperationFailure) as info:
        run()
    return info.value.code, info.value.details["errmsg"]


def test_aggregate_conversion_of_a_field(db):
    assert _error(lambda: db.a.aggregate([{"$project": {"y": {"$toInt": "$x"}}}])) == (
        241, AGG + BAD_INT)


def test_aggregate_divide_by_a_zero_field(db):
    code, message = _error(lambda: db.a.aggregate([{"$set": {"y": {"$divide": [1, "$z"]}}}]))
    assert code == 2 and message.startswith(AGG)


def test_aggregate_constant_expression_fails_while_optimized(db):
    # even on a collection with no documents: the optimizer folds it before any is read
    for coll in (db.a, db.nothing):
        assert _error(lambda c=coll: c.aggregate([{"$project": {"y": {"$toInt": "abc"}}}])) \
            == (241, OPT + BAD_INT)
    folded = {"$add": ["$z", {"$toInt": "abc"}]}  # the constant part folds
    assert _error(lambda: db.a.aggregate([{"$match": {"$expr": folded}}])) == (
        241, OPT + BAD_INT)


def test_parse_errors_have_no_context_and_come_first(db):
    assert _error(lambda: db.a.aggregate([{"$project": {"y": {"$foo": 1}}}])) == (
        168, "Unrecognized expression '$foo'")
    # the leading $match would fail on the document, but the pipeline is parsed first
    pipeline = [{"$match": {"$expr": {"$toInt": "$x"}}},
                {"$group": {"_id": 1, "y": {"$foo": 1}}}]
    assert _error(lambda: db.a.aggregate(pipeline)) == (15952, "unknown group operator '$foo'")


def test_error_in_a_lookup_sub_pipeline_has_the_context_once(db):
    pipeline = [{"$lookup": {"from": "a", "pipeline": [{"$project": {"y": {"$toInt": "$x"}}}],
                             "as": "j"}}]
    assert _error(lambda: db.a.aggregate(pipeline)) == (241, AGG + BAD_INT)


def test_find(db):
    find = "Executor error during find command: ctx.a :: caused by :: "
    assert _error(lambda: db.a.find({"$expr": {"$toInt": "$x"}}).to_list()) == (
        241, find + BAD_INT)
    assert _error(lambda: db.a.find({}, {"y": {"$toInt": "$x"}}).to_list()) == (
        241, find + BAD_INT)
    code, message = _error(lambda: db.a.find({"$where": "throw 'boom'"}).to_list())
    assert code == 139 and message.startswith(find)
    # folded while the query is planned: bare
    assert _error(lambda: db.a.find({}, {"y": {"$toInt": "abc"}}).to_list()) == (241, BAD_INT)


def test_find_on_a_view_runs_as_an_aggregation(db):
    assert _error(lambda: db.va.find({"$expr": {"$toInt": "$x"}}).to_list()) == (
        241, AGG + BAD_INT)
    assert _error(lambda: db.va.find({}, {"y": {"$toInt": "abc"}}).to_list()) == (
        241, OPT + BAD_INT)


def test_distinct(db):
    assert _error(lambda: db.a.distinct("x", {"$expr": {"$toInt": "$x"}})) == (
        241, "Executor error during distinct command :: caused by :: " + BAD_INT)
    assert _error(lambda: db.va.distinct("x", {"$expr": {"$toInt": "$x"}})) == (
        241, AGG + BAD_INT)
