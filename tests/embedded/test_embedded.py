"""The embedded store driven with pymongo: CRUD and DDL as MongoDB answers them."""

from __future__ import annotations

import pytest
from bson.objectid import ObjectId
from pymongo import (
    ASCENDING,
    DeleteOne,
    InsertOne,
    ReplaceOne,
    ReturnDocument,
    UpdateMany,
    UpdateOne,
    errors,
)


@pytest.fixture
def coll(client, request):
    name = request.node.name.replace("[", "_").replace("]", "_")
    c = client.crud[name]
    c.drop()
    return c


# ---------------------------------------------------------------------------------------------
# insert


def test_insert_one_generates_object_id_first(coll):
    r = coll.insert_one({"a": 1})
    assert isinstance(r.inserted_id, ObjectId)
    doc = coll.find_one()
    assert list(doc) == ["_id", "a"]


def test_insert_moves_id_first(coll):
    coll.insert_one({"a": 1, "_id": 7})
    assert list(coll.find_one()) == ["_id", "a"]


def test_insert_many_ordered_stops_at_duplicate(coll):
    coll.insert_one({"_id": 2})
    with pytest.raises(errors.BulkWriteError) as info:
        coll.insert_many([{"_id": 1}, {"_id": 2}, {"_id": 3}])
    details = info.value.details
    assert details["nInserted"] == 1
    [err] = details["writeErrors"]
    assert err["index"] == 1
    assert err["code"] == 11000
    assert err["errmsg"] == (
        f"E11000 duplicate key error collection: {coll.full_name} index: _id_ dup key: "
        "{ _id: 2 }"
    )
    assert err["keyPattern"] == {"_id": 1} and err["keyValue"] == {"_id": 2}
    assert sorted(d["_id"] for d in coll.find()) == [1, 2]


def test_insert_many_unordered_continues(coll):
    coll.insert_one({"_id": 2})
    with pytest.raises(errors.BulkWriteError) as info:
        coll.insert_many([{"_id": 1}, {"_id": 2}, {"_id": 3}], ordered=False)
    assert info.value.details["nInserted"] == 2
    assert sorted(d["_id"] for d in coll.find()) == [1, 2, 3]


def test_insert_array_id_rejected(coll):
    with pytest.raises(errors.WriteError) as info:
        coll.insert_one({"_id": [1, 2]})
    assert info.value.code == 53


# ---------------------------------------------------------------------------------------------
# update


def test_update_operators(coll):
    coll.insert_one({"_id": 1, "a": 1, "arr": [1, 2], "sub": {"x": 1}, "gone": True})
    r = coll.update_one(
        {"_id": 1},
        {
            "$inc": {"a": 2},
            "$push": {"arr": 3},
            "$set": {"sub.y": 2, "z": 1, "b": 0},
            "$unset": {"gone": ""},
        },
    )
    assert (r.matched_count, r.modified_count) == (1, 1)
    doc = coll.find_one({"_id": 1})
    # New fields are appended in lexicographic order (mongod 5.0+).
    assert doc == {"_id": 1, "a": 3, "arr": [1, 2, 3], "sub": {"x": 1, "y": 2}, "b": 0, "z": 1}
    assert list(doc) == ["_id", "a", "arr", "sub", "b", "z"]


def test_update_noop_is_not_modified(coll):
    coll.insert_one({"_id": 1, "a": 1})
    r = coll.update_one({"_id": 1}, {"$set": {"a": 1}})
    assert (r.matched_count, r.modified_count) == (1, 0)


def test_update_many_and_no_match(coll):
    coll.insert_many([{"_id": i, "a": i} for i in range(5)])
    r = coll.update_many({"a": {"$lt": 3}}, {"$set": {"flag": True}})
    assert (r.matched_count, r.modified_count) == (3, 3)
    r = coll.update_many({"a": 99}, {"$set": {"flag": True}})
    assert (r.matched_count, r.modified_count, r.upserted_id) == (0, 0, None)


def test_upsert_with_operators_and_replacement(coll):
    r = coll.update_one({"_id": 5, "k": "v"}, {"$set": {"a": 1}, "$setOnInsert": {"new": 1}},
                        upsert=True)
    assert r.upserted_id == 5
    assert coll.find_one({"_id": 5}) == {"_id": 5, "k": "v", "a": 1, "new": 1}
    r = coll.update_one({"_id": 5}, {"$set": {"a": 2}, "$setOnInsert": {"new": 2}}, upsert=True)
    assert r.upserted_id is None and coll.find_one({"_id": 5})["new"] == 1
    r = coll.replace_one({"name": "x"}, {"name": "x", "v": 1}, upsert=True)
    assert isinstance(r.upserted_id, ObjectId)
    assert list(coll.find_one({"name": "x"})) == ["_id", "name", "v"]


def test_replace_keeps_id_and_refuses_changing_it(coll):
    coll.insert_one({"_id": 1, "a": 1})
    coll.replace_one({"_id": 1}, {"c": 3})
    assert coll.find_one() == {"_id": 1, "c": 3}
    with pytest.raises(errors.WriteError) as info:
        coll.replace_one({"_id": 1}, {"_id": 2, "c": 3})
    assert info.value.code == 66


def test_update_id_is_immutable(coll):
    coll.insert_one({"_id": 1})
    with pytest.raises(errors.WriteError) as info:
        coll.update_one({"_id": 1}, {"$set": {"_id": 2}})
    assert info.value.code == 66


def test_update_unknown_and_conflicting_operators(coll):
    coll.insert_one({"_id": 1, "a": 1})
    with pytest.raises(errors.WriteError) as info:
        coll.update_one({"_id": 1}, {"$foo": {"a": 1}})
    assert info.value.code == 9
    with pytest.raises(errors.WriteError) as info:
        coll.update_one({"_id": 1}, {"$set": {"a": 1}, "$inc": {"a": 1}})
    assert info.value.code == 40
    assert "would create a conflict at 'a'" in info.value.details["errmsg"]


def test_pipeline_update(coll):
    coll.insert_one({"_id": 1, "a": 2, "drop": 1})
    coll.update_one({"_id": 1}, [{"$set": {"b": {"$add": ["$a", 10]}}}, {"$unset": "drop"}])
    assert coll.find_one() == {"_id": 1, "a": 2, "b": 12}


def test_array_filters_and_positional(coll):
    coll.insert_one({"_id": 1, "grades": [80, 90, 95], "items": [{"k": 1, "v": 0}, {"k": 2,
                                                                                    "v": 0}]})
    coll.update_one({"_id": 1}, {"$set": {"grades.$[g]": 100}},
                    array_filters=[{"g": {"$gte": 90}}])
    coll.update_one({"_id": 1, "items.k": 2}, {"$set": {"items.$.v": 7}})
    coll.update_one({"_id": 1}, {"$inc": {"items.$[].v": 1}})
    assert coll.find_one() == {
        "_id": 1, "grades": [80, 100, 100], "items": [{"k": 1, "v": 1}, {"k": 2, "v": 8}]
    }


def test_bulk_write_mixed(coll):
    r = coll.bulk_write([
        InsertOne({"_id": 1, "a": 1}),
        InsertOne({"_id": 2, "a": 2}),
        UpdateOne({"_id": 1}, {"$set": {"a": 10}}),
        UpdateMany({}, {"$inc": {"n": 1}}),
        ReplaceOne({"_id": 2}, {"r": 1}),
        DeleteOne({"_id": 1}),
    ])
    assert (r.inserted_count, r.matched_count, r.modified_count, r.deleted_count) == (2, 4, 4, 1)
    assert list(coll.find()) == [{"_id": 2, "r": 1}]


# ---------------------------------------------------------------------------------------------
# delete / findAndModify


def test_delete_one_and_many(coll):
    coll.insert_many([{"_id": i, "even": i % 2 == 0} for i in range(6)])
    assert coll.delete_one({"even": True}).deleted_count == 1
    assert coll.delete_many({"even": True}).deleted_count == 2
    assert coll.delete_many({"nothing": 1}).deleted_count == 0
    assert sorted(d["_id"] for d in coll.find()) == [1, 3, 5]


def test_find_and_modify_forms(coll):
    coll.insert_many([{"_id": i, "a": i} for i in range(3)])
    before = coll.find_one_and_update({"a": {"$gte": 1}}, {"$set": {"x": 1}}, sort=[("a", -1)])
    assert before == {"_id": 2, "a": 2}
    after = coll.find_one_and_update({"_id": 0}, {"$inc": {"a": 5}},
                                     return_document=ReturnDocument.AFTER, projection={"a": 1})
    assert after == {"_id": 0, "a": 5}
    assert coll.find_one_and_replace({"_id": 1}, {"r": 1}) == {"_id": 1, "a": 1}
    assert coll.find_one_and_delete({"_id": 1}) == {"_id": 1, "r": 1}
    assert coll.find_one_and_delete({"_id": 1}) is None
    up = coll.find_one_and_update({"_id": 9}, {"$set": {"u": 1}}, upsert=True,
                                  return_document=ReturnDocument.AFTER)
    assert up == {"_id": 9, "u": 1}


# ---------------------------------------------------------------------------------------------
# reads


def test_find_options_and_get_more(coll):
    coll.insert_many([{"_id": i, "a": i % 7, "b": "x" * (i % 3)} for i in range(300)])
    docs = list(coll.find({"a": {"$gte": 3}}, {"b": 0}).sort([("a", -1), ("_id", 1)])
                .skip(5).limit(50))
    expected = sorted(
        [{"_id": i, "a": i % 7} for i in range(300) if i % 7 >= 3],
        key=lambda d: (-d["a"], d["_id"]),
    )[5:55]
    assert docs == expected
    assert len(list(coll.find().batch_size(7))) == 300
    assert len(list(coll.find())) == 300  # 101 in the first batch, the rest by getMore
    cursor = coll.find().batch_size(2)
    next(cursor)
    cursor.close()


def test_count_distinct_aggregate(coll):
    coll.insert_many([{"_id": i, "g": i % 3, "v": i} for i in range(10)])
    assert coll.count_documents({}) == 10
    assert coll.count_documents({"g": 1}) == 3
    assert coll.estimated_document_count() == 10
    assert sorted(coll.distinct("g")) == [0, 1, 2]
    out = list(coll.aggregate([
        {"$match": {"v": {"$gte": 1}}},
        {"$group": {"_id": "$g", "total": {"$sum": "$v"}, "n": {"$sum": 1}}},
        {"$sort": {"_id": 1}},
    ]))
    assert out == [{"_id": 0, "total": 18, "n": 3}, {"_id": 1, "total": 12, "n": 3},
                   {"_id": 2, "total": 15, "n": 3}]
    assert list(coll.aggregate([{"$sortByCount": "$g"}, {"$limit": 1}]))[0]["count"] == 4
    assert list(coll.aggregate([{"$match": {"_id": 1}}, {"$unset": "v"}])) == [{"_id": 1, "g": 1}]


def test_aggregate_out(client, coll):
    coll.insert_many([{"_id": i} for i in range(3)])
    list(coll.aggregate([{"$match": {"_id": {"$gte": 1}}}, {"$out": "agg_out_target"}]))
    assert sorted(d["_id"] for d in client.crud.agg_out_target.find()) == [1, 2]


def test_find_on_missing_collection(client):
    assert list(client.crud.does_not_exist.find()) == []
    assert client.crud.does_not_exist.count_documents({}) == 0


# ---------------------------------------------------------------------------------------------
# DDL


def test_create_and_list_collections(client):
    db = client.ddl_create
    db.create_collection("plain")
    db.create_collection("images", changeStreamPreAndPostImages={"enabled": True})
    with pytest.raises(errors.CollectionInvalid):
        db.create_collection("plain", capped=True, size=4096)
    infos = {c["name"]: c for c in db.list_collections()}
    assert infos["images"]["options"] == {"changeStreamPreAndPostImages": {"enabled": True}}
    assert infos["plain"]["type"] == "collection"
    assert infos["plain"]["idIndex"] == {"v": 2, "key": {"_id": 1}, "name": "_id_"}
    assert infos["plain"]["info"]["uuid"].subtype == 4
    assert db.list_collection_names(filter={"name": "plain"}) == ["plain"]
    assert "ddl_create" in client.list_database_names()
    client.drop_database("ddl_create")
    assert "ddl_create" not in client.list_database_names()


def test_create_existing_raises_namespace_exists(client):
    db = client.ddl_exists
    db.create_collection("c")
    with pytest.raises(errors.OperationFailure) as info:
        db.command("create", "c", capped=True, size=1024)
    assert info.value.code == 48
    assert info.value.details["errmsg"] == "Collection ddl_exists.c already exists."
    db.command("create", "c")  # same options: no error (7.0+)
    client.drop_database("ddl_exists")


def test_drop(client):
    db = client.ddl_drop
    db.c.insert_one({})
    assert db.command("drop", "c") == {"nIndexesWas": 1, "ns": "ddl_drop.c", "ok": 1.0,
                                       **_cluster_fields(db.command("drop", "c"))}
    db.c.drop()  # no error on a missing collection


def _cluster_fields(reply):
    return {k: reply[k] for k in ("$clusterTime", "operationTime") if k in reply}


def test_rename_collection(client):
    db = client.ddl_rename
    db.a.insert_many([{"_id": 1}, {"_id": 2}])
    db.b.insert_one({"_id": 3})
    with pytest.raises(errors.OperationFailure) as info:
        db.a.rename("b")
    assert info.value.code == 48
    db.a.rename("b", dropTarget=True)
    assert sorted(d["_id"] for d in db.b.find()) == [1, 2]
    assert db.list_collection_names() == ["b"]
    client.admin.command("renameCollection", "ddl_rename.b", to="ddl_rename2.c")
    assert sorted(d["_id"] for d in client.ddl_rename2.c.find()) == [1, 2]
    assert db.list_collection_names() == []
    with pytest.raises(errors.OperationFailure) as info:
        client.admin.command("renameCollection", "ddl_rename.nope", to="ddl_rename.x")
    assert info.value.code == 26
    client.drop_database("ddl_rename2")


def test_unique_index_enforced(client):
    coll = client.ddl_idx.u
    coll.drop()
    coll.insert_many([{"_id": 1, "a": 1}, {"_id": 2, "a": 2}])
    assert coll.create_index([("a", ASCENDING)], unique=True) == "a_1"
    with pytest.raises(errors.DuplicateKeyError) as info:
        coll.insert_one({"a": 1})
    assert info.value.details["errmsg"] == (
        "E11000 duplicate key error collection: ddl_idx.u index: a_1 dup key: { a: 1 }"
    )
    with pytest.raises(errors.DuplicateKeyError):
        coll.update_one({"_id": 2}, {"$set": {"a": 1}})
    with pytest.raises(errors.DuplicateKeyError) as info:
        coll.find_one_and_update({"_id": 2}, {"$set": {"a": 1}})
    assert info.value.details["keyValue"] == {"a": 1}
    coll.update_one({"_id": 2}, {"$set": {"a": 3}})
    coll.insert_one({"a": 2})  # 2 was freed
    names = [i["name"] for i in coll.list_indexes()]
    assert names == ["_id_", "a_1"]
    coll.insert_one({"b": 1})  # a missing: null key
    with pytest.raises(errors.DuplicateKeyError):
        coll.insert_one({"b": 2})
    coll.drop_index("a_1")
    coll.insert_one({"a": 1})
    with pytest.raises(errors.OperationFailure) as info:
        coll.create_index("a", unique=True)
    assert info.value.code == 11000


def test_index_errors(client):
    coll = client.ddl_idx2.c
    coll.drop()
    coll.create_index("a")
    coll.create_index("a")  # exists already: fine
    with pytest.raises(errors.OperationFailure) as info:
        coll.create_index("b", name="a_1")
    assert info.value.code == 86
    with pytest.raises(errors.OperationFailure) as info:
        coll.drop_index("nope")
    assert info.value.code == 27
    with pytest.raises(errors.OperationFailure) as info:
        coll.drop_index("_id_")
    assert info.value.code == 72
    coll.drop_indexes()
    assert [i["name"] for i in coll.list_indexes()] == ["_id_"]
    with pytest.raises(errors.OperationFailure) as info:
        client.ddl_idx2.command("listIndexes", "missing")
    assert info.value.code == 26


def test_coll_mod(client):
    db = client.ddl_collmod
    db.c.drop()
    db.create_collection("c")
    db.c.create_index("t", expireAfterSeconds=100)
    db.command("collMod", "c", changeStreamPreAndPostImages={"enabled": True})
    assert db.c.options() == {"changeStreamPreAndPostImages": {"enabled": True}}
    reply = db.command("collMod", "c", index={"name": "t_1", "expireAfterSeconds": 50})
    assert reply["expireAfterSeconds_old"] == 100 and reply["expireAfterSeconds_new"] == 50
    assert next(i for i in db.c.list_indexes() if i["name"] == "t_1")["expireAfterSeconds"] == 50
    with pytest.raises(errors.OperationFailure) as info:
        db.command("collMod", "missing", validator={})
    assert info.value.code == 26


def test_transaction_commit_and_abort(client):
    coll = client.crud.txn
    coll.drop()
    coll.insert_one({"_id": 0, "n": 0})

    def work(session):
        coll.insert_one({"_id": 1}, session=session)
        coll.update_one({"_id": 0}, {"$inc": {"n": 1}}, session=session)

    with client.start_session() as s:
        s.with_transaction(work)
    assert list(coll.find()) == [{"_id": 0, "n": 1}, {"_id": 1}]
    with client.start_session() as s:
        s.start_transaction()
        coll.insert_one({"_id": 2}, session=s)
        coll.delete_one({"_id": 0}, session=s)
        s.abort_transaction()
    assert list(coll.find()) == [{"_id": 0, "n": 1}, {"_id": 1}]


def test_validator_enforced(client):
    db = client.ddl_validate
    db.drop_collection("v")
    db.create_collection("v", validator={"qty": {"$gte": 0}})
    db.v.insert_one({"_id": 1, "qty": 1})
    with pytest.raises(errors.WriteError) as info:
        db.v.insert_one({"_id": 2, "qty": -1})
    assert info.value.code == 121
    assert info.value.details["errInfo"]["failingDocumentId"] == 2
    with pytest.raises(errors.WriteError):
        db.v.update_one({"_id": 1}, {"$set": {"qty": -5}})
    db.v.insert_one({"_id": 3, "qty": -1}, bypass_document_validation=True)
    db.command("collMod", "v", validationAction="warn")
    db.v.insert_one({"_id": 4, "qty": -1})
    assert db.v.count_documents({}) == 3


def test_pop_of_a_missing_field_is_a_no_op(coll):
    coll.insert_one({"_id": 1, "s": {}})
    r = coll.update_one({"_id": 1}, {"$pop": {"a": 1, "s.b": -1}})
    assert (r.matched_count, r.modified_count) == (1, 0)
    assert coll.find_one() == {"_id": 1, "s": {}}


def test_writes_by_id_find_numerically_equal_ids(coll):
    from bson.int64 import Int64

    coll.insert_many([{"_id": 1.0, "k": "double"}, {"_id": "1", "k": "string"}])
    assert coll.update_one({"_id": Int64(1)}, {"$set": {"x": 1}}).modified_count == 1
    assert coll.update_one({"_id": {"$eq": 1}}, {"$inc": {"x": 1}}).modified_count == 1
    assert coll.find_one({"_id": 1}) == {"_id": 1.0, "k": "double", "x": 2}
    assert coll.delete_one({"_id": "1"}).deleted_count == 1
    assert coll.delete_one({"_id": 2}).deleted_count == 0
    assert [d["_id"] for d in coll.find()] == [1.0]
