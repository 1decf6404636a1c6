"""Atlas Search through the embedded cluster's front, as mongos 8.0 without mongot answers it:
31082 SearchNotEnabled with the texts of mongot_cursor.cpp / search_index_common.cpp, on a
sharded collection as on an unsharded one (mongos parses the pipeline itself)."""

from __future__ import annotations

import pymongo
import pytest
from pymongo.errors import OperationFailure
from pymongo.operations import SearchIndexModel

from tests.embedded.test_search_not_enabled import INDEX_TEXT, MONGOT_TEXT


@pytest.fixture(scope="module")
def colls(client: pymongo.MongoClient):
    client.admin.command("enableSharding", "search_sh")
    client.admin.command("shardCollection", "search_sh.sharded", key={"_id": "hashed"})
    db = client.search_sh
    db.sharded.insert_many([{"_id": i, "text": "hello"} for i in range(4)])
    db.plain.insert_one({"_id": 1, "text": "hello"})
    yield db.sharded, db.plain
    client.drop_database("search_sh")


def _not_enabled(info, text: str) -> None:
    err = info.value
    assert (err.code, err.details["codeName"], err.details["errmsg"]) == (
        31082, "SearchNotEnabled", text)


@pytest.mark.parametrize("pipeline, text", [
    ([{"$search": {"text": {"query": "hello", "path": "text"}}}], MONGOT_TEXT),
    ([{"$searchMeta": {"count": {"type": "total"}}}], MONGOT_TEXT),
    ([{"$vectorSearch": {"path": "v", "queryVector": [1.0], "limit": 1}}], MONGOT_TEXT),
    ([{"$listSearchIndexes": {}}], INDEX_TEXT),
    ([{"$match": {}}, {"$search": {}}], MONGOT_TEXT),
    ([{"$lookup": {"from": "plain", "pipeline": [{"$search": {}}], "as": "x"}}], MONGOT_TEXT),
    ([{"$unionWith": {"coll": "plain", "pipeline": [{"$vectorSearch": {}}]}}], MONGOT_TEXT),
])
def test_search_stages_on_a_sharded_collection(colls, pipeline, text) -> None:
    for coll in colls:
        with pytest.raises(OperationFailure) as info:
            list(coll.aggregate(pipeline))
        _not_enabled(info, text)
    sharded = colls[0]
    with pytest.raises(OperationFailure) as info:
        sharded.database.command("aggregate", sharded.name, pipeline=pipeline, explain=True)
    _not_enabled(info, text)


def test_search_index_helpers_on_a_sharded_collection(colls) -> None:
    sharded = colls[0]
    model = SearchIndexModel(definition={"mappings": {"dynamic": True}}, name="default")
    with pytest.raises(OperationFailure) as info:
        sharded.create_search_index(model)
    _not_enabled(info, INDEX_TEXT)
    with pytest.raises(OperationFailure) as info:
        sharded.update_search_index("default", {"mappings": {"dynamic": False}})
    _not_enabled(info, INDEX_TEXT)
    with pytest.raises(OperationFailure) as info:
        sharded.drop_search_index("default")
    _not_enabled(info, INDEX_TEXT)
    with pytest.raises(OperationFailure) as info:
        list(sharded.list_search_indexes())
    _not_enabled(info, INDEX_TEXT)


def test_other_pipelines_still_run_on_a_sharded_collection(colls) -> None:
    sharded = colls[0]
    assert sorted(d["_id"] for d in sharded.aggregate([{"$match": {"text": "hello"}}])) == [
        0, 1, 2, 3]
