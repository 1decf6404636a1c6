"""Time-series collections in the embedded store, through pymongo, as mongod 8.0 has them:
create (its options, defaults and errors), the buckets collection and view it makes and what
listCollections / listIndexes show of them, inserts (into buckets, duplicate _ids allowed),
reads of the measurements (find, aggregate, count, distinct), drop, the oplog entries of each,
and change streams (refused on the collection, bucket writes not shown to database streams)."""

from __future__ import annotations

import datetime

import pytest
from bson.int64 import Int64
from bson.objectid import ObjectId
from pymongo import errors

T0 = datetime.datetime(2024, 3, 1, 12, 0, 30)


def _at(seconds: float) -> datetime.datetime:
    return T0 + datetime.timedelta(seconds=seconds)


@pytest.fixture
def db(server, request):
    client = server.client()
    name = "ts_" + request.node.name.replace("[", "_").replace("]", "_")[:50]
    client.drop_database(name)
    yield client[name]
    client.drop_database(name)
    client.close()


def _failure(call) -> tuple[int, str]:
    with pytest.raises(errors.OperationFailure) as info:
        call()
    return info.value.code, info.value.details["errmsg"]


def _entries(server, db_name: str) -> list[dict]:
    return [e for e in server.entries() if e["ns"].startswith(db_name + ".")]


def _listing(db) -> dict[str, dict]:
    return {c["name"]: c for c in db.list_collections()}


# -- create ---------------------------------------------------------------------------------------


def test_create_makes_a_timeseries_collection_with_mongods_defaults(db):
    db.command("create", "weather", timeseries={"timeField": "t", "metaField": "m"})
    listing = _listing(db)
    assert listing["weather"] == {
        "name": "weather", "type": "timeseries",
        "options": {"timeseries": {"timeField": "t", "metaField": "m", "granularity": "seconds",
                                   "bucketMaxSpanSeconds": 3600}},
        "info": {"readOnly": False},
    }
    assert list(listing["weather"]["options"]["timeseries"]) == [
        "timeField", "metaField", "granularity", "bucketMaxSpanSeconds"]
    buckets = listing["system.buckets.weather"]
    assert buckets["type"] == "collection"
    assert "idIndex" not in buckets  # clustered on _id
    options = buckets["options"]
    assert list(options) == ["clusteredIndex", "validator", "timeseries"]
    assert options["clusteredIndex"] is True
    schema = options["validator"]["$jsonSchema"]
    assert schema["required"] == ["_id", "control", "data"]
    assert schema["properties"]["control"]["properties"]["min"] == {
        "bsonType": "object", "required": ["t"], "properties": {"t": {"bsonType": "date"}}}
    # filtered by type, as mongod's listCollections filter sees the entries
    assert [c["name"] for c in db.list_collections(filter={"type": "timeseries"})] == ["weather"]
    assert db.list_collection_names(filter={"type": "view"}) == []


@pytest.mark.parametrize("given, shown", [
    ({"timeField": "t", "granularity": "minutes"},
     {"timeField": "t", "granularity": "minutes", "bucketMaxSpanSeconds": 86400}),
    ({"timeField": "t", "granularity": "hours", "bucketMaxSpanSeconds": 2592000},
     {"timeField": "t", "granularity": "hours", "bucketMaxSpanSeconds": 2592000}),
    ({"timeField": "t", "bucketMaxSpanSeconds": 600, "bucketRoundingSeconds": 600},
     {"timeField": "t", "bucketRoundingSeconds": 600, "bucketMaxSpanSeconds": 600}),
])
def test_create_bucketing_options_as_listcollections_shows_them(db, given, shown):
    db.command("create", "c", timeseries=given)
    assert _listing(db)["c"]["options"]["timeseries"] == shown
    assert list(_listing(db)["c"]["options"]["timeseries"]) == list(shown)


def test_create_other_options_a_timeseries_collection_takes(db):
    db.command("create", "c", timeseries={"timeField": "t"}, expireAfterSeconds=100,
               collation={"locale": "fr"}, storageEngine={"wiredTiger": {}})
    options = _listing(db)["c"]["options"]
    assert list(options) == ["storageEngine", "collation", "timeseries", "expireAfterSeconds"]
    assert options["expireAfterSeconds"] == 100
    assert isinstance(options["expireAfterSeconds"], Int64)
    assert options["collation"]["locale"] == "fr"
    assert options["collation"]["strength"] == 3  # filled in as ICU's defaults
    # the same create again answers ok; other options are refused
    db.command("create", "c", timeseries={"timeField": "t"}, expireAfterSeconds=100,
               collation={"locale": "fr"}, storageEngine={"wiredTiger": {}})
    assert _failure(lambda: db.command("create", "c", timeseries={"timeField": "x"})) == (
        48, f"A timeseries collection already exists. NS: {db.name}.c")


@pytest.mark.parametrize("cmd, code, message", [
    ({"timeseries": {"metaField": "m"}}, 40414,
     "BSON field 'create.timeseries.timeField' is missing but a required field"),
    ({"timeseries": {"timeField": 1}}, 14,
     "BSON field 'create.timeseries.timeField' is the wrong type 'int', expected type "
     "'string'"),
    ({"timeseries": {"timeField": "t", "other": 1}}, 40415,
     "BSON field 'create.timeseries.other' is an unknown field."),
    ({"timeseries": "t"}, 14,
     "BSON field 'create.timeseries' is the wrong type 'string', expected type 'object'"),
    ({"timeseries": {"timeField": "t", "metaField": "t"}}, 72,
     "'metaField' cannot be the same as 'timeField'"),
    ({"timeseries": {"timeField": "t", "metaField": "_id"}}, 72,
     "'metaField' cannot be \"_id\""),
    ({"timeseries": {"timeField": "a.b"}}, 72,
     "{ns}: 'timeField' must be a top-level field and not contain a '.'"),
    ({"timeseries": {"timeField": "t", "metaField": "m.x"}}, 72,
     "{ns}: 'metaField' must be a top-level field and not contain a '.'"),
    ({"timeseries": {"timeField": "t", "granularity": "days"}}, 2,
     "Enumeration value 'days' for field 'create.timeseries.granularity' is not a valid "
     "value."),
    ({"timeseries": {"timeField": "t", "granularity": "minutes", "bucketMaxSpanSeconds": 60}},
     72, "Timeseries 'bucketMaxSpanSeconds' is not configurable to a value other than the "
     "default of 86400 for the provided granularity"),
    ({"timeseries": {"timeField": "t", "granularity": "minutes",
                     "bucketRoundingSeconds": 60}},
     72, "Timeseries 'bucketRoundingSeconds' is not configurable alongside the granularity "
     "parameter"),
    ({"timeseries": {"timeField": "t", "bucketMaxSpanSeconds": 60}}, 72,
     "Timeseries 'bucketRoundingSeconds' needs to be equal to 'bucketMaxSpanSeconds'"),
    ({"timeseries": {"timeField": "t", "bucketMaxSpanSeconds": 60,
                     "bucketRoundingSeconds": 30}}, 72,
     "Timeseries 'bucketRoundingSeconds' needs to be equal to 'bucketMaxSpanSeconds'"),
    ({"timeseries": {"timeField": "t"}, "capped": True, "size": 4096}, 72,
     "{ns}: 'timeseries' is not allowed with 'capped'"),
    ({"timeseries": {"timeField": "t"}, "clusteredIndex": {"key": {"_id": 1}, "unique": True}},
     72, "{ns}: 'timeseries' is not allowed with 'clusteredIndex'"),
    ({"timeseries": {"timeField": "t"}, "validator": {"a": 1}}, 72,
     "{ns}: 'timeseries' is not allowed with 'validator'"),
    ({"timeseries": {"timeField": "t"}, "viewOn": "x"}, 72,
     "{ns}: 'timeseries' is not allowed with 'viewOn'"),
    ({"timeseries": {"timeField": "t"}, "expireAfterSeconds": -1}, 72,
     "TTL index 'expireAfterSeconds' option cannot be less than 0"),
])
def test_create_is_refused_as_mongod_refuses_it(db, cmd, code, message):
    failure = _failure(lambda: db.command({"create": "c", **cmd}))
    assert failure == (code, message.format(ns=f"{db.name}.c"))
    assert "c" not in db.list_collection_names()
    assert "system.buckets.c" not in db.list_collection_names()


def test_a_view_on_a_buckets_collection_is_refused(db):
    db.command("create", "c", timeseries={"timeField": "t"})
    assert _failure(lambda: db.command("create", "v", viewOn="system.buckets.c",
                                       pipeline=[])) == (
        73, "Cannot create view on a system.buckets namespace except by creating a time-series "
        "collection")


def test_create_and_insert_are_refused_in_a_transaction(db):
    client = db.client
    db.command("create", "c", timeseries={"timeField": "t"})
    db.other.insert_one({})
    with client.start_session() as session:
        session.start_transaction()
        assert _failure(lambda: db.command("create", "d", timeseries={"timeField": "t"},
                                           session=session)) == (
            263, "Cannot create a time-series collection in a multi-document transaction.")
        session.abort_transaction()
    with client.start_session() as session:
        with pytest.raises(errors.OperationFailure) as info:
            with session.start_transaction():
                db.c.insert_one({"t": T0}, session=session)
        assert info.value.code == 263
        assert info.value.details["errmsg"] == (
            "Cannot insert into a time-series collection in a multi-document transaction: "
            f"{db.name}.c")
    assert db.c.count_documents({}) == 0


# -- inserts and reads ----------------------------------------------------------------------------


def test_measurements_come_back_as_mongod_unpacks_them(db):
    db.command("create", "c", timeseries={"timeField": "t", "metaField": "m"})
    db.c.insert_one({"_id": 1, "v": 10, "m": {"z": 1, "a": 2}, "t": _at(0)})
    db.c.insert_one({"_id": 1, "t": _at(1), "v": 11, "m": {"a": 2, "z": 1}, "w": "x"})
    db.c.insert_one({"_id": 2, "t": _at(2)})  # no meta
    docs = list(db.c.find())
    # the time field, then the meta field (its object's fields in order of name: mongod
    # normalizes the meta value), then the other fields
    assert [list(d.items()) for d in docs] == [
        [("t", _at(0)), ("m", {"a": 2, "z": 1}), ("_id", 1), ("v", 10)],
        [("t", _at(1)), ("m", {"a": 2, "z": 1}), ("_id", 1), ("v", 11), ("w", "x")],
        [("t", _at(2)), ("_id", 2)],
    ]
    assert [list(d["m"]) for d in docs[:2]] == [["a", "z"], ["a", "z"]]


def test_find_aggregate_count_distinct_see_the_measurements(db):
    db.command("create", "c", timeseries={"timeField": "t", "metaField": "sensor"})
    db.c.insert_many([{"t": _at(i * 60), "sensor": {"id": i % 3}, "v": i} for i in range(12)])
    assert db.c.count_documents({}) == 12
    assert db.c.estimated_document_count() == 12
    assert [d["v"] for d in db.c.find({"sensor.id": 1}).sort("t", 1)] == [1, 4, 7, 10]
    assert [d["v"] for d in db.c.find({"t": {"$gte": _at(600)}}).sort("v", -1)] == [11, 10]
    assert [d["v"] for d in db.c.find({"v": {"$lt": 3}}, {"_id": 0, "v": 1}).sort("v", 1)] == [
        0, 1, 2]
    assert db.c.count_documents({"sensor.id": 0, "v": {"$gt": 3}}) == 2
    assert sorted(db.c.distinct("sensor.id")) == [0, 1, 2]
    grouped = list(db.c.aggregate([
        {"$group": {"_id": "$sensor.id", "total": {"$sum": "$v"}}}, {"$sort": {"_id": 1}}]))
    assert grouped == [{"_id": 0, "total": 18}, {"_id": 1, "total": 22}, {"_id": 2, "total": 26}]
    assert list(db.c.aggregate([{"$match": {"v": 5}}, {"$project": {"_id": 0, "v": 1}}])) == [
        {"v": 5}]


def test_duplicate_ids_are_allowed(db):
    db.command("create", "c", timeseries={"timeField": "t"})
    db.c.insert_many([{"_id": "same", "t": _at(i)} for i in range(3)])
    assert db.c.count_documents({"_id": "same"}) == 3


def test_a_measurement_without_a_date_time_is_refused(db):
    db.command("create", "c", timeseries={"timeField": "t"})
    with pytest.raises(errors.BulkWriteError) as info:
        db.c.insert_many([{"x": 1}, {"t": _at(0)}, {"t": "noon"}], ordered=False)
    assert [(e["index"], e["code"], e["errmsg"]) for e in info.value.details["writeErrors"]] == [
        (0, 2, "'t' must be present and contain a valid BSON UTC datetime value"),
        (2, 2, "'t' must be present and contain a valid BSON UTC datetime value"),
    ]
    assert info.value.details["nInserted"] == 1
    assert db.c.count_documents({}) == 1


# -- the oplog ------------------------------------------------------------------------------------


def test_the_oplog_of_create_inserts_and_drop_is_mongods(server, db):
    db.command("create", "c", timeseries={"timeField": "t", "metaField": "m"})
    db.c.insert_one({"_id": 1, "t": _at(0), "m": "a", "v": 5})
    db.c.insert_one({"_id": 2, "t": _at(1), "m": "a", "v": 3, "w": True})
    db.c.insert_one({"_id": 3, "t": _at(2), "m": "b"})
    reply = db.command("drop", "c")
    assert (reply["nIndexesWas"], reply["ns"]) == (1, f"{db.name}.c")
    entries = _entries(server, db.name)
    cmd = f"{db.name}.$cmd"
    buckets_ns = f"{db.name}.system.buckets.c"
    assert [(e["op"], e["ns"]) for e in entries] == [
        ("c", cmd), ("c", cmd), ("c", cmd), ("i", f"{db.name}.system.views"),
        ("i", buckets_ns), ("u", buckets_ns), ("i", buckets_ns),
        ("d", f"{db.name}.system.views"), ("c", cmd),
    ]
    create, index, views, view, first, second, third, view_drop, drop = entries
    assert list(create["o"]) == ["create", "clusteredIndex", "validator", "timeseries"]
    assert create["o"]["create"] == "system.buckets.c"
    assert create["o"]["clusteredIndex"] is True
    assert create["o"]["timeseries"] == {"timeField": "t", "metaField": "m",
                                         "granularity": "seconds", "bucketMaxSpanSeconds": 3600}
    assert index["o"] == {"createIndexes": "system.buckets.c", "v": 2,
                          "key": {"meta": 1, "control.min.t": 1, "control.max.t": 1},
                          "name": "m_1_t_1"}
    assert index["ui"] == create["ui"]
    assert views["o"]["create"] == "system.views"
    assert list(view["o"].items()) == [
        ("_id", f"{db.name}.c"), ("viewOn", "system.buckets.c"),
        ("pipeline", [{"$_internalUnpackBucket": {"timeField": "t", "metaField": "m",
                                                  "bucketMaxSpanSeconds": 3600}}]),
    ]
    # a new bucket: version 1, control.min with the time rounded down to the minute
    bucket = first["o"]
    assert first["ui"] == create["ui"]
    assert isinstance(bucket["_id"], ObjectId)
    assert bucket["_id"].generation_time.replace(tzinfo=None) == datetime.datetime(
        2024, 3, 1, 12, 0)
    assert list(bucket) == ["_id", "control", "meta", "data"]
    assert bucket["control"] == {
        "version": 1,
        "min": {"_id": 1, "t": datetime.datetime(2024, 3, 1, 12, 0), "v": 5},
        "max": {"_id": 1, "t": _at(0), "v": 5},
    }
    assert bucket["meta"] == "a"
    assert bucket["data"] == {"_id": {"0": 1}, "t": {"0": _at(0)}, "v": {"0": 5}}
    assert first["o2"] == {"_id": bucket["_id"]}
    # the second measurement of the series: an update of its bucket, as a delta
    assert second["o2"] == {"_id": bucket["_id"]}
    assert second["o"] == {"$v": 2, "diff": {
        "scontrol": {"smin": {"u": {"v": 3}, "i": {"w": True}},
                     "smax": {"u": {"_id": 2, "t": _at(1)}, "i": {"w": True}}},
        "sdata": {"i": {"w": {"1": True}}, "s_id": {"i": {"1": 2}}, "st": {"i": {"1": _at(1)}},
                  "sv": {"i": {"1": 3}}},
    }}
    # another series: another bucket
    assert third["o"]["meta"] == "b"
    assert third["o"]["_id"] != bucket["_id"]
    # drop: the view, then the buckets collection
    assert view_drop["o"] == {"_id": f"{db.name}.c"}
    assert drop["o"] == {"drop": "system.buckets.c"}
    assert drop["ui"] == create["ui"]
    assert db.list_collection_names() == ["system.views"]


def test_a_measurement_past_the_buckets_span_opens_a_new_bucket(server, db):
    db.command("create", "c", timeseries={"timeField": "t", "bucketMaxSpanSeconds": 100,
                                          "bucketRoundingSeconds": 100})
    db.c.insert_one({"t": _at(0)})  # 12:00:30: its bucket from 12:00:00 (rounded to 100 s)
    db.c.insert_one({"t": _at(60)})
    db.c.insert_one({"t": _at(120)})  # 12:02:30: past 12:01:40
    db.c.insert_one({"t": _at(-3600)})  # before the open bucket
    ops = [e["op"] for e in _entries(server, db.name) if e["ns"].endswith("system.buckets.c")]
    assert ops == ["i", "u", "i", "i"]
    buckets = list(db["system.buckets.c"].find().sort("_id", 1))
    assert [b["control"]["min"]["t"] for b in buckets] == [
        datetime.datetime(2024, 3, 1, 11, 0), datetime.datetime(2024, 3, 1, 12, 0),
        datetime.datetime(2024, 3, 1, 12, 1, 40)]
    assert sorted(d["t"] for d in db.c.find()) == [_at(-3600), _at(0), _at(60), _at(120)]


# -- indexes --------------------------------------------------------------------------------------


def test_list_indexes_of_timeseries_and_clustered_collections(db):
    db.command("create", "c", timeseries={"timeField": "t", "metaField": "m"})
    assert [dict(i) for i in db.c.list_indexes()] == [
        {"v": 2, "key": {"m": 1, "t": 1}, "name": "m_1_t_1"}]
    db.command("create", "n", timeseries={"timeField": "t"})
    assert list(db.n.list_indexes()) == []
    buckets = [dict(i) for i in db["system.buckets.c"].list_indexes()]
    assert buckets == [
        {"v": 2, "key": {"_id": 1}, "name": "_id_", "unique": True, "clustered": True},
        {"v": 2, "key": {"meta": 1, "control.min.t": 1, "control.max.t": 1}, "name": "m_1_t_1"},
    ]
    # a clustered collection's index keeps its name (issue 27 item 7)
    db.command("create", "cl", clusteredIndex={"key": {"_id": 1}, "unique": True, "name": "by"})
    db.command("create", "cl2", clusteredIndex={"key": {"_id": 1}, "unique": True},
               expireAfterSeconds=60)
    assert [list(dict(i).items()) for i in db.cl.list_indexes()] == [
        [("v", 2), ("key", {"_id": 1}), ("name", "by"), ("unique", True), ("clustered", True)]]
    assert [dict(i) for i in db.cl2.list_indexes()] == [
        {"v": 2, "key": {"_id": 1}, "name": "_id_", "unique": True, "expireAfterSeconds": 60,
         "clustered": True}]


# -- change streams -------------------------------------------------------------------------------


def test_change_streams_on_a_timeseries_collection_are_refused(db):
    db.command("create", "c", timeseries={"timeField": "t"})
    # 8.0's OplogAggCatalogState::validate: a time-series view's own check, before any view's.
    assert _failure(lambda: db.c.watch()) == (
        166, f"Cannot run aggregation on timeseries with namespace {db.name}.c")
    assert _failure(lambda: db["system.buckets.c"].watch()) == (
        73, f"$changeStream may not be opened on the internal {db.name}.system.buckets.c "
        "collection")


def test_a_database_stream_sees_the_create_but_no_bucket_writes(db):
    with db.watch(show_expanded_events=True) as stream:
        db.command("create", "c", timeseries={"timeField": "t", "metaField": "m"})
        db.c.insert_many([{"t": _at(0), "m": 1}, {"t": _at(1), "m": 1}])
        db.after.insert_one({"_id": 1})
        events = []
        while len(events) < 3:
            event = stream.try_next()
            if event is not None:
                events.append(event)
    created = events[0]
    assert (created["operationType"], created["nsType"], created["ns"]) == (
        "create", "timeseries", {"db": db.name, "coll": "c"})
    assert created["operationDescription"]["viewOn"] == "system.buckets.c"
    assert [(e["operationType"], e["ns"]["coll"]) for e in events[1:]] == [
        ("create", "after"), ("insert", "after")]


# -- collMod --------------------------------------------------------------------------------------


def test_coll_mod_changes_the_bucketing_and_the_view(server, db):
    db.command("create", "c", timeseries={"timeField": "time"})
    db.command("collMod", "c", timeseries={"granularity": "minutes"})
    assert _listing(db)["c"]["options"]["timeseries"] == {
        "timeField": "time", "granularity": "minutes", "bucketMaxSpanSeconds": 86400}
    view_update, coll_mod = _entries(server, db.name)[-2:]
    assert (view_update["op"], view_update["ns"]) == ("u", f"{db.name}.system.views")
    assert view_update["o"]["pipeline"] == [
        {"$_internalUnpackBucket": {"timeField": "time", "bucketMaxSpanSeconds": 86400}}]
    assert coll_mod["o"] == {"collMod": "system.buckets.c",
                             "timeseries": {"granularity": "minutes"}}
    assert coll_mod["o2"]["collectionOptions_old"]["timeseries"]["granularity"] == "seconds"
    # the same granularity again changes nothing; back to seconds is refused
    db.command("collMod", "c", timeseries={"granularity": "minutes"})
    assert _failure(lambda: db.command("collMod", "c", timeseries={"granularity": "seconds"})) == (
        72, "Invalid transition for timeseries.granularity. Can only transition from 'seconds' "
        "to 'minutes' or 'minutes' to 'hours'.")
    db.command("collMod", "c", expireAfterSeconds=3600)
    assert _listing(db)["c"]["options"]["expireAfterSeconds"] == 3600
    db.command("collMod", "c", expireAfterSeconds="off")
    assert "expireAfterSeconds" not in _listing(db)["c"]["options"]
    db.plain.insert_one({})
    assert _failure(lambda: db.command("collMod", "plain",
                                       timeseries={"granularity": "hours"})) == (
        72, "option only supported on a time-series collection: timeseries")


def test_a_database_stream_sees_create_modify_drop_of_a_timeseries_collection(db):
    # jstests/change_streams/ddl_view_events.js, its time-series segment
    with db.watch(show_expanded_events=True) as stream:
        db.command("create", "tc", timeseries={"timeField": "time"})
        db.command("collMod", "tc", timeseries={"granularity": "minutes"})
        db.drop_collection("tc")
        db.after.insert_one({"_id": 1})
        events = []
        while len(events) < 5:
            event = stream.try_next()
            if event is not None:
                events.append(event)
    assert [(e["operationType"], e["ns"]["coll"]) for e in events] == [
        ("create", "tc"), ("modify", "tc"), ("drop", "tc"), ("create", "after"),
        ("insert", "after")]
    assert events[0]["operationDescription"] == {
        "viewOn": "system.buckets.tc",
        "pipeline": [{"$_internalUnpackBucket": {"timeField": "time",
                                                 "bucketMaxSpanSeconds": 3600}}]}
    assert events[0]["nsType"] == "timeseries"
    assert events[1]["operationDescription"] == {
        "viewOn": "system.buckets.tc",
        "pipeline": [{"$_internalUnpackBucket": {"timeField": "time",
                                                 "bucketMaxSpanSeconds": 86400}}]}


def test_a_bucket_written_directly_is_not_added_to(server, db):
    db.command("create", "c", timeseries={"timeField": "t"})
    db.c.insert_one({"t": _at(0), "v": 1})
    db["system.buckets.c"].delete_many({})  # the open bucket is gone
    db.c.insert_one({"t": _at(1), "v": 2})
    db["system.buckets.c"].update_many({}, {"$set": {"control.version": 2}})
    db.c.insert_one({"t": _at(2), "v": 3})  # not a bucket this store adds to
    ops = [e["op"] for e in _entries(server, db.name) if e["ns"].endswith("system.buckets.c")]
    assert ops == ["i", "d", "i", "u", "i"]
    assert db["system.buckets.c"].count_documents({}) == 2
