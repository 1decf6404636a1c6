"""Atlas Search on the embedded store, as mongod 8.0 without a search service answers it: 31082
SearchNotEnabled with mongod's texts (search_index_common.cpp for the search index commands and
`$listSearchIndexes`, mongot_cursor.cpp for `$search`, `$searchMeta`, `$vectorSearch`), after
the commands' IDL parse (search_index_commands.idl) and before the collection is looked up.
"""

from __future__ import annotations

import pymongo
import pytest
from pymongo.errors import OperationFailure
from pymongo.operations import SearchIndexModel

INDEX_TEXT = (
    "Using Atlas Search Database Commands and the $listSearchIndexes aggregation stage requires "
    "additional configuration. Please connect to Atlas or an AtlasCLI local deployment to "
    "enable. For more information on how to connect, see "
    "https://dochub.mongodb.org/core/atlas-cli-deploy-local-reqs."
)
MONGOT_TEXT = (
    "Using $search and $vectorSearch aggregation stages requires additional configuration. "
    "Please connect to Atlas or an AtlasCLI local deployment to enable.For more information on "
    "how to connect, see https://dochub.mongodb.org/core/atlas-cli-deploy-local-reqs."
)


@pytest.fixture
def coll(client):
    c = client.search_off.things
    c.drop()
    c.insert_one({"_id": 1, "text": "hello"})
    yield c
    client.drop_database("search_off")


def _not_enabled(info, text: str) -> None:
    err = info.value
    assert (err.code, err.details["codeName"], err.details["errmsg"]) == (
        31082, "SearchNotEnabled", text)


def test_pymongo_search_index_helpers(coll) -> None:
    model = SearchIndexModel(definition={"mappings": {"dynamic": True}}, name="default")
    with pytest.raises(OperationFailure) as info:
        coll.create_search_index(model)
    _not_enabled(info, INDEX_TEXT)
    with pytest.raises(OperationFailure) as info:
        coll.create_search_indexes([model])
    _not_enabled(info, INDEX_TEXT)
    with pytest.raises(OperationFailure) as info:
        coll.update_search_index("default", {"mappings": {"dynamic": False}})
    _not_enabled(info, INDEX_TEXT)
    with pytest.raises(OperationFailure) as info:
        coll.drop_search_index("default")
    _not_enabled(info, INDEX_TEXT)
    with pytest.raises(OperationFailure) as info:
        list(coll.list_search_indexes())  # the $listSearchIndexes stage
    _not_enabled(info, INDEX_TEXT)


def test_commands_refuse_before_the_collection_is_looked_up(client) -> None:
    db = client.search_off
    db.drop_collection("missing")
    for cmd in (
        {"createSearchIndexes": "missing", "indexes": [{"definition": {}}]},
        {"updateSearchIndex": "missing", "name": "x", "definition": {}},
        {"dropSearchIndex": "missing", "id": "x"},
        {"listSearchIndexes": "missing"},
    ):
        with pytest.raises(OperationFailure) as info:
            db.command(cmd)
        _not_enabled(info, INDEX_TEXT)


@pytest.mark.parametrize(("cmd", "code", "text"), [
    ({"createSearchIndexes": "c"}, 40414,
     "BSON field 'createSearchIndexes.indexes' is missing but a required field"),
    ({"createSearchIndexes": "c", "indexes": {}}, 14,
     "BSON field 'createSearchIndexes.indexes' is the wrong type 'object', expected type "
     "'array'"),
    ({"createSearchIndexes": "c", "indexes": [{}]}, 40414,
     "BSON field 'createSearchIndexes.indexes.definition' is missing but a required field"),
    ({"createSearchIndexes": "c", "indexes": [{"definition": {}, "other": 1}]}, 40415,
     "BSON field 'createSearchIndexes.indexes.other' is an unknown field."),
    ({"updateSearchIndex": "c", "name": "x"}, 40414,
     "BSON field 'updateSearchIndex.definition' is missing but a required field"),
    ({"dropSearchIndex": "c", "name": 1}, 14,
     "BSON field 'dropSearchIndex.name' is the wrong type 'int', expected type 'string'"),
    ({"dropSearchIndex": "c", "unknown": 1}, 40415,
     "BSON field 'dropSearchIndex.unknown' is an unknown field."),
    ({"dropSearchIndex": 1}, 73, "collection name has invalid type int"),
])
def test_idl_parse_comes_first(client, cmd, code, text) -> None:
    with pytest.raises(OperationFailure) as info:
        client.search_off.command(cmd)
    assert (info.value.code, info.value.details["errmsg"]) == (code, text)


@pytest.mark.parametrize("stage", ["$search", "$searchMeta", "$vectorSearch"])
def test_mongot_stages(coll, stage) -> None:
    for pipeline in (
        [{stage: {"text": {"query": "hello", "path": "text"}}}],
        [{stage: "not even an object"}],  # refused before its specification is parsed
        [{"$match": {}}, {stage: {}}],
        [{"$lookup": {"from": "other", "pipeline": [{stage: {}}], "as": "x"}}],
        [{"$unionWith": {"coll": "other", "pipeline": [{stage: {}}]}}],
    ):
        with pytest.raises(OperationFailure) as info:
            list(coll.aggregate(pipeline))
        _not_enabled(info, MONGOT_TEXT)
    with pytest.raises(OperationFailure) as info:  # explain parses the pipeline too
        coll.database.command("explain", {"aggregate": coll.name, "pipeline": [{stage: {}}],
                                          "cursor": {}})
    _not_enabled(info, MONGOT_TEXT)


def test_list_search_indexes_stage_on_a_missing_collection(client) -> None:
    with pytest.raises(OperationFailure) as info:
        list(client.search_off.missing.aggregate([{"$listSearchIndexes": {}}]))
    _not_enabled(info, INDEX_TEXT)


def test_other_pipelines_still_run(coll) -> None:
    assert list(coll.aggregate([{"$match": {"_id": 1}}, {"$project": {"_id": 1}}])) == [
        {"_id": 1}]
    assert isinstance(coll.database.client, pymongo.MongoClient)


def test_recorded_oplog_parses_search_stages_too(cdcserver_sample) -> None:
    with pymongo.MongoClient(cdcserver_sample.uri) as recorded:
        with pytest.raises(OperationFailure) as info:
            list(recorded.test.c.aggregate([{"$vectorSearch": {}}]))
        _not_enabled(info, MONGOT_TEXT)
        with pytest.raises(OperationFailure) as info:
            recorded.test.command({"createSearchIndexes": "c", "indexes": [{"definition": {}}]})
        _not_enabled(info, INDEX_TEXT)
