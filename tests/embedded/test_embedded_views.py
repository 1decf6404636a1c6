"""Views in the embedded store, through pymongo: what the oplog records (the `system.views`
documents mongod 8.0 writes), the create/modify/drop events a `showExpandedEvents` stream
reports for them, reads through views, listCollections, mongod's errors, and persistence."""

from __future__ import annotations

import pytest
from bson.binary import Binary
from pymongo import AsyncMongoClient, errors

from cdcserver.testing import EmbeddedServer

VIEW_ERROR = "Namespace {ns} is a view, not a collection"


@pytest.fixture
def db(server, request):
    client = server.client()
    name = "v_" + request.node.name.replace("[", "_").replace("]", "_")[:50]
    client.drop_database(name)
    database = client[name]
    # `src`: ten documents, g = _id % 3; `v1`: g == 1; `v4`: v1 projected (a view on a view)
    database.src.insert_many(
        [{"_id": i, "g": i % 3, "v": i * 10, "tags": [i, i + 1]} for i in range(10)]
    )
    database.create_collection("v1", viewOn="src", pipeline=[{"$match": {"g": 1}}])
    database.command("create", "v4", viewOn="v1", pipeline=[{"$project": {"v": 1, "g": 1}}])
    yield database
    client.drop_database(name)
    client.close()


def _failure(call) -> tuple[int, str]:
    with pytest.raises(errors.OperationFailure) as info:
        call()
    return info.value.code, info.value.details["errmsg"]


def _view_entries(server: EmbeddedServer, db_name: str) -> list[dict]:
    return [e for e in server.entries() if e["ns"] in (f"{db_name}.system.views",)
            or (e["ns"] == f"{db_name}.$cmd" and e["o"].get("create") == "system.views")]


def test_the_oplog_holds_system_views_writes_as_mongod_writes_them(server, db):
    db.command("collMod", "v1", pipeline=[{"$match": {"g": 2}}])
    db.drop_collection("v4")
    entries = _view_entries(server, db.name)
    assert [(e["op"], next(iter(e["o"]))) for e in entries] == [
        ("c", "create"), ("i", "_id"), ("i", "_id"), ("u", "_id"), ("d", "_id"),
    ]
    create, insert_v1, insert_v4, update, delete = entries
    # system.views is created (its own entry, with its _id index) before the first view
    assert create["o"] == {"create": "system.views",
                           "idIndex": {"v": 2, "key": {"_id": 1}, "name": "_id_"}}
    ui = create["ui"]
    assert all(e["ui"] == ui for e in entries)
    assert list(insert_v1["o"].items()) == [
        ("_id", f"{db.name}.v1"), ("viewOn", "src"), ("pipeline", [{"$match": {"g": 1}}]),
    ]
    assert insert_v1["o2"] == {"_id": f"{db.name}.v1"}
    assert insert_v4["o"]["viewOn"] == "v1"
    # collMod replaces the whole definition; no collMod command entry is written for a view
    assert update["o"] == {"_id": f"{db.name}.v1", "viewOn": "src",
                           "pipeline": [{"$match": {"g": 2}}]}
    assert update["o2"] == {"_id": f"{db.name}.v1"}
    assert delete["o"] == {"_id": f"{db.name}.v4"}
    assert not [e for e in server.entries()
                if e["ns"] == f"{db.name}.$cmd" and ("collMod" in e["o"] or "drop" in e["o"])]


def test_a_database_stream_with_expanded_events_reports_view_ddl(db):
    with db.watch(show_expanded_events=True) as stream, db.watch() as plain, \
            db.src.watch(show_expanded_events=True) as on_src:
        db.command("create", "v9", viewOn="src", pipeline=[{"$match": {"g": 0}}],
                   collation={"locale": "fr"})
        db.command("collMod", "v9", pipeline=[{"$match": {"g": 2}}])
        db.drop_collection("v9")
        db.src.insert_one({"_id": 100})
        create, modify, drop, insert = (stream.next() for _ in range(4))
        assert plain.next()["operationType"] == "insert"  # no view events without the flag
        assert on_src.next()["operationType"] == "insert"  # nor on a collection stream
    assert list(create) == ["_id", "operationType", "clusterTime", "wallTime", "ns",
                            "operationDescription", "nsType"]
    assert create["operationType"] == "create" and create["nsType"] == "view"
    assert create["ns"] == {"db": db.name, "coll": "v9"}
    description = create["operationDescription"]
    assert list(description) == ["viewOn", "pipeline", "collation"]
    assert description["viewOn"] == "src"
    assert description["pipeline"] == [{"$match": {"g": 0}}]
    assert description["collation"]["locale"] == "fr"
    assert description["collation"]["strength"] == 3
    assert list(modify) == ["_id", "operationType", "clusterTime", "wallTime", "ns",
                            "operationDescription"]
    assert modify["operationType"] == "modify"
    assert modify["operationDescription"]["pipeline"] == [{"$match": {"g": 2}}]
    assert modify["operationDescription"]["viewOn"] == "src"
    # a view reads only views of its own collation
    assert _failure(lambda: db.command("create", "v10", viewOn="v1", collation={"locale": "fr"}))[
        0] == 167
    assert list(drop) == ["_id", "operationType", "clusterTime", "wallTime", "ns"]
    assert (drop["operationType"], drop["ns"]) == ("drop", {"db": db.name, "coll": "v9"})
    assert insert["operationType"] == "insert"


def test_reads_go_through_the_view_pipeline(db):
    assert [d["_id"] for d in db.v1.find()] == [1, 4, 7]
    assert list(db.v4.find()) == [{"_id": 1, "g": 1, "v": 10}, {"_id": 4, "g": 1, "v": 40},
                                  {"_id": 7, "g": 1, "v": 70}]
    found = db.v1.find({"v": {"$gt": 10}}, {"v": 1, "_id": 0}).sort("v", -1).limit(1)
    assert list(found) == [{"v": 70}]
    assert [d["_id"] for d in db.v1.find().sort("_id", 1).skip(1)] == [4, 7]
    assert db.v1.count_documents({}) == 3
    assert db.v4.count_documents({"v": {"$gte": 40}}) == 2
    assert sorted(db.v1.distinct("tags")) == [1, 2, 4, 5, 7, 8]
    assert sorted(db.v4.distinct("v", {"v": {"$gt": 10}})) == [40, 70]
    total = list(db.v4.aggregate([{"$group": {"_id": "$g", "sum": {"$sum": "$v"}}}]))
    assert total == [{"_id": 1, "sum": 120}]
    db.src.insert_one({"_id": 10, "g": 1, "v": 100})  # a view reads the current documents
    assert db.v4.count_documents({}) == 4
    db.create_collection("later", viewOn="nosuch")
    assert list(db.later.find()) == []


def test_list_collections_shows_views_as_mongod(db):
    infos = {i["name"]: i for i in db.list_collections()}
    assert infos["v1"] == {"name": "v1", "type": "view",
                           "options": {"viewOn": "src", "pipeline": [{"$match": {"g": 1}}]},
                           "info": {"readOnly": True}}
    assert list(infos["v1"]) == ["name", "type", "options", "info"]
    assert infos["system.views"]["type"] == "collection"
    assert isinstance(infos["src"]["info"]["uuid"], Binary)
    names = list(db.list_collections(filter={"type": "view"}, nameOnly=True))
    assert names == [{"name": "v1", "type": "view"}, {"name": "v4", "type": "view"}]
    # mongod lists collections first, then views
    assert [i["type"] for i in db.list_collections()][-2:] == ["view", "view"]


def test_writes_and_collection_commands_on_a_view_fail_with_166(db, server):
    refused = VIEW_ERROR.format(ns=f"{db.name}.v1")
    before = len(server.entries())
    for cmd, reported in [
        ({"insert": "v1", "documents": [{"_id": 100}, {"_id": 101}]}, 1),
        ({"insert": "v1", "documents": [{"_id": 100}, {"_id": 101}], "ordered": False}, 2),
        ({"update": "v1", "updates": [{"q": {}, "u": {"$set": {"a": 1}}}]}, 1),
        ({"delete": "v1", "ordered": False,
          "deletes": [{"q": {}, "limit": 1}, {"q": {}, "limit": 0}]}, 2),
    ]:
        reply = db.command(cmd)
        assert reply["n"] == 0
        assert [(e["index"], e["code"], e["errmsg"]) for e in reply["writeErrors"]] == [
            (i, 166, refused) for i in range(reported)
        ]
    for cmd in [
        {"findAndModify": "v1", "query": {}, "remove": True},
        {"createIndexes": "v1", "indexes": [{"key": {"v": 1}, "name": "v_1"}]},
        {"listIndexes": "v1"},
        {"dropIndexes": "v1", "index": "*"},
    ]:
        assert _failure(lambda cmd=cmd: db.command(cmd)) == (166, refused)
    admin = db.client.admin
    assert _failure(lambda: admin.command("renameCollection", f"{db.name}.v1",
                                          to=f"{db.name}.v1b")) == (
        166, f"cannot rename view: {db.name}.v1")
    assert _failure(lambda: admin.command("renameCollection", f"{db.name}.src",
                                          to=f"{db.name}.v1", dropTarget=True)) == (
        48, f"a view already exists with that name: {db.name}.v1")
    assert _failure(lambda: db.v1.watch()) == (166, refused)
    assert _failure(lambda: db.command({"find": "v1", "tailable": True})) == (
        168, "Tailable cursors are not supported in aggregation.")
    assert _failure(lambda: db.command({"find": "v1", "collation": {"locale": "fr"}})) == (
        167, "Cannot override a view's default collation")
    assert len(server.entries()) == before  # nothing was written
    assert [d["_id"] for d in db.v1.find()] == [1, 4, 7]


def test_view_definitions_are_checked_as_mongod_checks_them(db):
    ns = db.name
    invalid = f"Invalid pipeline for view {ns}.bad :: caused by :: "
    for cmd, code, message in [
        ({"create": "bad", "pipeline": []}, 72,
         "'pipeline' requires 'viewOn' to also be specified"),
        ({"create": "bad", "viewOn": "src", "pipeline": [{"$nope": 1}]}, 40324,
         "Unrecognized pipeline stage name: '$nope'"),
        ({"create": "bad", "viewOn": "src", "pipeline": [{"$merge": {"into": "x"}}]}, 167,
         f"{invalid}The aggregation stage $merge in location 0 of the pipeline cannot be used "
         f"in the view definition of {ns}.bad because it writes to disk"),
        ({"create": "bad", "viewOn": "src", "pipeline": [{"$changeStream": {}}]}, 167,
         f"{invalid}$changeStream cannot be used in a view definition"),
        ({"create": "bad", "viewOn": "src", "pipeline": {"$match": {}}}, 14,
         "BSON field 'create.pipeline' is the wrong type 'object', expected type 'array'"),
        ({"create": "bad", "viewOn": 5, "pipeline": []}, 14,
         "BSON field 'create.viewOn' is the wrong type 'int', expected type 'string'"),
        ({"create": "bad", "viewOn": "", "pipeline": []}, 2, "'viewOn' cannot be empty"),
        ({"create": "bad", "viewOn": "bad", "pipeline": []}, 5,
         f"View cycle detected: {ns}.bad => {ns}.bad => {ns}.bad"),
        ({"create": "bad", "viewOn": "src", "changeStreamPreAndPostImages": {"enabled": True}},
         72, "option not supported on a view: changeStreamPreAndPostImages"),
        ({"create": "system.views", "viewOn": "src"}, 73,
         "Cannot create a view called 'system.views': this is a reserved system namespace"),
        ({"collMod": "src", "viewOn": "other", "pipeline": []}, 72,
         "option only supported on a view: pipeline"),
        ({"collMod": "src", "viewOn": "other"}, 72, "option only supported on a view: viewOn"),
        ({"collMod": "v1", "validator": {"a": 1}}, 72,
         "option not supported on a view: validator"),
        ({"collMod": "v1", "viewOn": "v4", "pipeline": []}, 5,
         f"View cycle detected: {ns}.v1 => {ns}.v1 => {ns}.v4 => {ns}.v1"),
        ({"create": "v1", "viewOn": "other"}, 48,
         f"namespace {ns}.v1 already exists, but is a view on {ns}.src rather than {ns}.other"),
        ({"create": "v1", "viewOn": "src"}, 48,
         f"namespace {ns}.v1 already exists, but with pipeline {{ 0: {{ $match: {{ g: 1 }} }} }}"
         " rather than {}"),
    ]:
        assert _failure(lambda cmd=cmd: db.command(cmd)) == (code, message), cmd
    assert "bad" not in db.list_collection_names()
    # the same definition again is no error (create is idempotent since 7.0)
    assert db.command("create", "v1", viewOn="src", pipeline=[{"$match": {"g": 1}}])["ok"] == 1


def test_views_nest_at_most_twenty_deep(db):
    previous = "src"
    for i in range(20):
        db.command("create", f"d{i}", viewOn=previous)
        previous = f"d{i}"
    assert db.d18.count_documents({}) == 10
    # mongod's resolveView stops after 20 lookups: the 20th view of a chain cannot be read
    assert _failure(lambda: db.d19.count_documents({})) == (
        165, "View depth too deep or view cycle detected; maximum depth is 20")
    code, message = _failure(lambda: db.command("create", "d20", viewOn="d19"))
    assert (code, message) == (165, "View depth limit exceeded; maximum depth is 20")


def test_drop_and_drop_database_remove_views(db):
    reply = db.command("drop", "v4")
    assert list(reply)[:2] == ["ns", "ok"]  # no nIndexesWas for a view
    assert reply["ns"] == f"{db.name}.v4"
    assert "v4" not in db.list_collection_names()
    assert list(db.v4.find()) == []
    db.client.drop_database(db.name)
    assert db.list_collection_names() == []
    db.create_collection("v1", viewOn="src")  # the name is free again


def test_views_survive_a_restart(tmp_path):
    data = tmp_path / "data"
    with EmbeddedServer(data) as first:
        client = first.client()
        client.d.src.insert_many([{"_id": i, "g": i % 2} for i in range(6)])
        client.d.create_collection("odd", viewOn="src", pipeline=[{"$match": {"g": 1}}])
        client.d.command("create", "gone", viewOn="odd")
        client.d.drop_collection("gone")
        client.close()
    with EmbeddedServer(data) as second:
        client = second.client()
        assert [d["_id"] for d in client.d.odd.find()] == [1, 3, 5]
        assert client.d.list_collection_names(filter={"type": "view"}) == ["odd"]
        assert _failure(lambda: client.d.odd.insert_one({"_id": 9}))[0] == 166
        client.d.command("collMod", "odd", pipeline=[{"$match": {"g": 0}}])
        assert [d["_id"] for d in client.d.odd.find()] == [0, 2, 4]
        client.close()


async def test_async_client_creates_and_reads_a_view(server):
    client = AsyncMongoClient(server.direct_uri)
    try:
        db = client.v_async
        await client.drop_database("v_async")
        await db.src.insert_many([{"_id": i, "n": i} for i in range(5)])
        async with await db.watch(show_expanded_events=True) as stream:
            await db.create_collection(
                "big", viewOn="src", pipeline=[{"$match": {"n": {"$gte": 3}}}]
            )
            event = await stream.next()
        assert (event["operationType"], event["nsType"]) == ("create", "view")
        assert [d["_id"] async for d in db.big.find()] == [3, 4]
        assert await db.big.count_documents({}) == 2
        with pytest.raises(errors.WriteError) as info:
            await db.big.insert_one({"_id": 7})
        assert info.value.code == 166
        await client.drop_database("v_async")
    finally:
        await client.close()
