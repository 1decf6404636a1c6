"""`$lookup`, `$graphLookup` and `$unionWith` reading a view or a time-series collection in the
embedded store, through pymongo: mongod resolves the name to the view's `viewOn` collection
with the view's pipeline in front (views on views too, under the view's default collation),
and a time-series collection to its measurements."""

from __future__ import annotations

import datetime

import pytest
from pymongo.errors import OperationFailure

from cdcserver.testing import EmbeddedServer


@pytest.fixture(scope="module")
def db():
    with EmbeddedServer() as s:
        client = s.client()
        d = client.t
        d.a.insert_many([{"_id": 1, "x": 1}, {"_id": 2, "x": 2}])
        d.b.insert_many([{"_id": 1, "k": 1, "v": "b"}, {"_id": 2, "k": 2, "v": "B"},
                         {"_id": 3, "k": 1, "v": "a"}])
        d.command("create", "vb", viewOn="b", pipeline=[{"$match": {"k": 1}}])
        d.command("create", "vvb", viewOn="vb",
                  pipeline=[{"$project": {"_id": 0, "v": 1, "k": 1}}])
        d.command("create", "sorted", viewOn="b", pipeline=[{"$sort": {"v": 1}}],
                  collation={"locale": "en", "strength": 1})
        d.create_collection("ts", timeseries={"timeField": "t", "metaField": "m"})
        d.ts.insert_many([{"t": datetime.datetime(2024, 1, 1, h), "m": h % 2, "x": h}
                          for h in range(3)])
        yield d
        client.close()


def test_lookup_local_foreign_field_reads_the_view(db):
    out = list(db.a.aggregate([{"$lookup": {
        "from": "vb", "localField": "x", "foreignField": "k", "as": "j"}}]))
    assert out == [{"_id": 1, "x": 1, "j": [{"_id": 1, "k": 1, "v": "b"},
                                            {"_id": 3, "k": 1, "v": "a"}]},
                   {"_id": 2, "x": 2, "j": []}]


def test_lookup_pipeline_reads_a_view_on_a_view(db):
    out = list(db.a.aggregate([
        {"$match": {"_id": 1}},
        {"$lookup": {"from": "vvb", "pipeline": [{"$match": {"v": "a"}}], "as": "j"}}]))
    assert out == [{"_id": 1, "x": 1, "j": [{"k": 1, "v": "a"}]}]


def test_graph_lookup_reads_the_view(db):
    out = list(db.a.aggregate([{"$graphLookup": {
        "from": "vb", "startWith": "$x", "connectFromField": "k", "connectToField": "k",
        "as": "g"}}, {"$project": {"n": {"$size": "$g"}}}]))
    assert out == [{"_id": 1, "n": 2}, {"_id": 2, "n": 0}]


def test_union_with_reads_a_view_on_a_view(db):
    out = list(db.a.aggregate([{"$unionWith": {"coll": "vvb", "pipeline": [
        {"$sort": {"v": 1}}]}}]))
    assert out == [{"_id": 1, "x": 1}, {"_id": 2, "x": 2}, {"k": 1, "v": "a"},
                   {"k": 1, "v": "b"}]


def test_union_with_view_runs_under_its_collation(db):
    # the view's $sort under {locale: en, strength: 1}: "a" < "b" == "B" (simple: "B" first)
    out = [d["v"] for d in db.a.aggregate([
        {"$match": {"_id": 0}}, {"$unionWith": "sorted"}], collation={
            "locale": "en", "strength": 1})]
    assert out[0] == "a"
    assert sorted(out[1:]) == ["B", "b"]


def test_union_with_time_series_reads_measurements(db):
    out = list(db.a.aggregate([{"$match": {"_id": 0}}, {"$unionWith": {
        "coll": "ts", "pipeline": [{"$project": {"_id": 0, "m": 1, "x": 1}},
                                   {"$sort": {"x": 1}}]}}]))
    assert out == [{"m": 0, "x": 0}, {"m": 1, "x": 1}, {"m": 0, "x": 2}]


def test_lookup_time_series_reads_measurements(db):
    out = list(db.a.aggregate([{"$lookup": {
        "from": "ts", "localField": "x", "foreignField": "x", "as": "j"}},
        {"$project": {"j.x": 1, "j.m": 1}}]))
    assert out == [{"_id": 1, "j": [{"m": 1, "x": 1}]}, {"_id": 2, "j": [{"m": 0, "x": 2}]}]


def test_a_view_read_under_another_collation_is_167(db):
    # the view's default collation is {en, strength 1}; the aggregation's is simple
    for stage in ({"$unionWith": "sorted"},
                  {"$lookup": {"from": "sorted", "pipeline": [], "as": "j"}},
                  {"$facet": {"f": [{"$graphLookup": {
                      "from": "sorted", "startWith": "$x", "connectFromField": "k",
                      "connectToField": "k", "as": "g"}}]}}):
        with pytest.raises(OperationFailure) as info:
            db.a.aggregate([stage]).to_list()
        assert info.value.code == 167
        assert info.value.details["errmsg"] == (
            "Cannot override a view's default collationt.sorted")
    with pytest.raises(OperationFailure) as info:  # nor under another locale
        db.a.aggregate([{"$unionWith": "sorted"}], collation={"locale": "fr"}).to_list()
    assert info.value.code == 167
    # views without a collation read under the simple one: fine without a collation
    assert len(db.a.aggregate([{"$unionWith": "vb"}]).to_list()) == 4
