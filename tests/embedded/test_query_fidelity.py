"""Small query and update behaviours as mongod 8.0 has them, through pymongo: `$sum` in
`$group` typed as AccumulatorSum (longs stay longs), find's `returnKey`, an empty collation
`{}` read as none, and an update pipeline's unknown stage failing the whole command (40324)."""

from __future__ import annotations

import pytest
from bson.codec_options import CodecOptions
from bson.decimal128 import Decimal128
from bson.int64 import Int64
from pymongo import MongoClient, UpdateOne, errors
from pymongo.collection import Collection

from cdcserver.testing import EmbeddedServer


@pytest.fixture
def coll(cdcserver_embedded: EmbeddedServer):
    client: MongoClient = MongoClient(cdcserver_embedded.uri)
    collection = client.query_fidelity.c
    collection.insert_many([{"_id": i, "x": 10 * i} for i in range(1, 4)])
    yield collection
    client.close()


def _sum(coll: Collection, values: list) -> object:
    coll.delete_many({})
    coll.insert_many([{"v": v} for v in values])
    raw = coll.with_options(codec_options=CodecOptions(type_registry=None))
    (out,) = raw.aggregate([{"$group": {"_id": None, "s": {"$sum": "$v"}}}])
    return out["s"]


def test_group_sum_types(coll: Collection) -> None:
    longs = _sum(coll, [Int64(1), Int64(10)])
    assert longs == 11 and isinstance(longs, Int64)
    ints = _sum(coll, [1, 2, True, "x"])  # booleans and strings are not numbers to $sum
    assert ints == 3 and type(ints) is int
    overflow = _sum(coll, [2**31 - 1, 1])
    assert overflow == 2**31 and isinstance(overflow, Int64)
    assert _sum(coll, [Int64(1), 0.5]) == 1.5
    assert _sum(coll, [1, Decimal128("0.5")]) == Decimal128("1.5")
    assert isinstance(_sum(coll, [Int64(2**63 - 1), Int64(1)]), float)


def test_return_key(coll: Collection) -> None:
    assert list(coll.find({}, sort=[("_id", 1)], return_key=True)) == [
        {"_id": 1}, {"_id": 2}, {"_id": 3}]
    assert list(coll.find({"x": {"$gt": 0}}, return_key=True)) == [{}, {}, {}]  # no index
    coll.create_index("x")
    assert list(coll.find({"x": {"$gt": 10}}, return_key=True)) == [{"x": 20}, {"x": 30}]


def test_empty_collation_is_none(coll: Collection) -> None:
    assert coll.delete_one({"_id": 1}, {}).deleted_count == 1
    assert coll.count_documents({}, collation={}) == 2
    assert [d["_id"] for d in coll.find({}, collation={})] == [2, 3]


def test_update_pipeline_unknown_stage_fails_the_command(coll: Collection) -> None:
    with pytest.raises(errors.OperationFailure) as info:
        coll.update_one({"x": 999}, [{"$invalidOperator": True}])  # even when nothing matches
    assert info.value.code == 40324
    assert info.value.details["errmsg"] == "Unrecognized pipeline stage name: '$invalidOperator'"
    with pytest.raises(errors.OperationFailure):
        coll.bulk_write([UpdateOne({"x": 1}, [{"$invalidOperator": True}])])
    with pytest.raises(errors.WriteError) as write_error:  # a known stage not allowed: per write
        coll.update_one({"_id": 2}, [{"$match": {}}])
    assert write_error.value.code == 72
