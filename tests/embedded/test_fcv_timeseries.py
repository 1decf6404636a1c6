"""MongoDB 9.0's setFeatureCompatibilityVersion across its viewless time-series FCV: every
time-series collection converted (the buckets collection renamed over its view, or back), one
`upgradeDowngradeViewlessTimeseries` oplog entry each, which change streams report as the
rename it is (and which invalidates a collection stream on either name), as mongod 9.0's
setFCV and change_stream_timeseries_fcv_upgrade_downgrade.js show."""

from __future__ import annotations

import datetime

import bson
import pytest
from bson.timestamp import Timestamp
from pymongo.errors import OperationFailure

from cdcserver.config import Config, ServerConfig
from cdcserver.testing import EmbeddedServer
from pipeline_stages.oplog_entry import decode_entry
from pipeline_stages.oplog_match import OplogFilter
from pipeline_stages.release import MONGODB_9_0
from pipeline_stages.spec import parse_aggregate

T0 = datetime.datetime(2024, 5, 1)


@pytest.fixture
def server():
    s = EmbeddedServer(config=Config(server=ServerConfig(compatibility="9.0")))
    try:
        yield s
    finally:
        s.stop()


def _fcv(client, version):
    client.admin.command("setFeatureCompatibilityVersion", version, confirm=True)


def _oplog(client, **query):
    return list(client.local["oplog.rs"].find(query))


class _SystemStream:
    """A collection stream on a system namespace (allowToRunOnSystemNS, as the jstest opens
    one on the buckets), or with the aggregate's rawData, read by hand: drivers' watch() does
    not pass those options."""

    def __init__(self, db, coll, options=None, **aggregate):
        self.db, self.coll = db, coll
        options = {"allowToRunOnSystemNS": True} if options is None else options
        reply = db.command("aggregate", coll, cursor={},
                           pipeline=[{"$changeStream": options}], **aggregate)
        self.id = reply["cursor"]["id"]
        self.first = list(reply["cursor"]["firstBatch"])

    def changes(self):
        out, self.first = self.first, []
        while self.id:
            coll = self.coll if isinstance(self.coll, str) else "$cmd.aggregate"
            reply = self.db.command("getMore", self.id, collection=coll, maxTimeMS=50)
            self.id = reply["cursor"]["id"]
            batch = list(reply["cursor"]["nextBatch"])
            if not batch:
                break
            out += batch
        return out


def _drain(stream):
    out = []
    while True:
        change = stream.try_next()
        if change is None:
            return out
        out.append(change)


def test_an_fcv_upgrade_converts_time_series_collections_and_logs_one_entry_each(server):
    with server.client() as client:
        _fcv(client, "8.0")
        client.test.create_collection("ts", timeseries={"timeField": "t", "metaField": "m"})
        client.test.create_collection("plain")
        client.test.ts.insert_one({"t": T0, "m": "a", "v": 1})
        uuid = client.test["system.buckets.ts"].options()  # viewful: the buckets exist
        assert uuid["timeseries"]["timeField"] == "t"
        buckets_ui = _oplog(client, op="c", **{"o.create": "system.buckets.ts"})[0]["ui"]
        _fcv(client, "9.0")
        names = client.test.list_collection_names()
        assert "ts" in names and "system.buckets.ts" not in names
        info = next(client.test.list_collections(filter={"name": "ts"}))
        assert info["type"] == "timeseries" and "timeseries" in info["options"]
        assert info["info"]["uuid"] == buckets_ui  # the UUID is kept
        raw = client.test.command("listCollections", filter={"name": "ts"}, rawData=True)
        raw_info = raw["cursor"]["firstBatch"][0]
        assert raw_info["type"] == "collection" and raw_info["options"]["clusteredIndex"]
        assert "validator" not in raw_info["options"]
        entries = _oplog(client, op="c", **{"o.upgradeDowngradeViewlessTimeseries": {
            "$exists": True}})
        assert [(e["ns"], dict(e["o"]), e["ui"]) for e in entries] == [
            ("test.$cmd", {"upgradeDowngradeViewlessTimeseries": "ts", "isUpgrade": True},
             buckets_ui)]
        # The FCV document: the transitional upgrading state, then 9.0.
        fcv_docs = [e["o"] for e in _oplog(client, ns="admin.system.version")]
        assert fcv_docs[-2:] == [
            {"_id": "featureCompatibilityVersion", "version": "8.0", "targetVersion": "9.0"},
            {"_id": "featureCompatibilityVersion", "version": "9.0"}]
        fcv = client.admin.command("getParameter", 1, featureCompatibilityVersion=1)
        assert fcv["featureCompatibilityVersion"] == {"version": "9.0"}
        # Inserts go on into buckets, now in the collection itself; reads unpack them as
        # the view did (rawData: the buckets).
        client.test.ts.insert_one({"t": T0, "m": "b", "v": 2})
        found = list(client.test.ts.find({}, {"_id": 0}).sort("v", 1))
        assert found == [{"t": T0, "m": "a", "v": 1}, {"t": T0, "m": "b", "v": 2}]
        assert client.test.ts.count_documents({"m": "b"}) == 1
        raw = client.test.command("find", "ts", rawData=True)["cursor"]["firstBatch"]
        assert sorted(b["meta"] for b in raw) == ["a", "b"]


def test_change_streams_see_the_upgrade_and_the_downgrade_as_renames(server):
    with server.client() as client:
        _fcv(client, "8.0")
        client.test.create_collection("ts", timeseries={"timeField": "t"})
        cluster = client.watch(max_await_time_ms=50)
        expanded = client.test.watch(show_expanded_events=True, max_await_time_ms=50)
        on_buckets = _SystemStream(client.test, "system.buckets.ts")
        _fcv(client, "9.0")
        on_main = _SystemStream(client.test, "ts", {}, rawData=True)  # viewless: rawData
        _fcv(client, "8.0")
        ui = next(client.test.list_collections(filter={"name": "system.buckets.ts"}))[
            "info"]["uuid"]

        def simple(change):
            return {k: change[k] for k in ("operationType", "ns", "to") if k in change}

        up = {"operationType": "rename", "ns": {"db": "test", "coll": "system.buckets.ts"},
              "to": {"db": "test", "coll": "ts"}}
        down = {"operationType": "rename", "ns": {"db": "test", "coll": "ts"},
                "to": {"db": "test", "coll": "system.buckets.ts"}}
        seen = [simple(c) for c in _drain(cluster)]
        assert [c for c in seen if c["operationType"] == "rename"] == [up, down]
        events = _drain(expanded)
        renames = [c for c in events if c["operationType"] == "rename"]
        assert [simple(c) for c in renames] == [up, down]
        first = renames[0]
        # A rename's expanded fields, in the order mongod gives a rename's (`to` first).
        assert list(first.keys()) == ["to", "_id", "operationType", "clusterTime",
                                      "collectionUUID", "wallTime", "ns", "operationDescription"]
        assert first["collectionUUID"] == ui
        assert first["operationDescription"] == {"to": {"db": "test", "coll": "ts"}}
        # A collection stream on either name ends with the rename.
        assert [c["operationType"] for c in on_buckets.changes()] == ["rename", "invalidate"]
        assert [simple(c) for c in on_main.changes()] == [down, {"operationType": "invalidate"}]


def test_the_8_0_profile_has_no_viewless_conversion():
    server = EmbeddedServer()
    try:
        with server.client() as client:
            client.test.create_collection("ts", timeseries={"timeField": "t"})
            _fcv(client, "7.0")
            _fcv(client, "8.0")
            assert "system.buckets.ts" in client.test.list_collection_names()
            assert not _oplog(client, **{"o.upgradeDowngradeViewlessTimeseries": {
                "$exists": True}})
    finally:
        server.stop()


def test_the_conversion_is_durable_with_the_store(tmp_path):
    def start():
        return EmbeddedServer(tmp_path, config=Config(server=ServerConfig(compatibility="9.0")))

    server = start()
    try:
        with server.client() as client:
            _fcv(client, "8.0")
            client.test.create_collection("ts", timeseries={"timeField": "t"})
            client.test.ts.insert_one({"t": T0, "v": 1})
            _fcv(client, "9.0")
    finally:
        server.stop()
    server = start()
    try:
        with server.client() as client:
            assert client.admin.command("getParameter", 1, featureCompatibilityVersion=1)[
                "featureCompatibilityVersion"] == {"version": "9.0"}
            info = {c["name"]: c for c in client.test.list_collections()}
            assert set(info) == {"ts", "system.views"}  # system.views stays, as on mongod
            assert info["ts"]["type"] == "timeseries"
            client.test.ts.insert_one({"t": T0, "v": 2})
            assert [d["v"] for d in client.test.ts.find().sort("v", 1)] == [1, 2]
            _fcv(client, "8.0")  # and back, durably too
    finally:
        server.stop()
    server = start()
    try:
        with server.client() as client:
            names = set(client.test.list_collection_names())
            assert names == {"ts", "system.buckets.ts", "system.views"}
            view = next(client.test.list_collections(filter={"name": "ts"}))
            assert view["type"] == "timeseries"
            assert sorted(d["v"] for d in client.test.ts.find()) == [1, 2]
    finally:
        server.stop()


def test_a_create_at_fcv_9_0_makes_a_viewless_collection(server):
    with server.client() as client:
        client.test.create_collection("ts", timeseries={"timeField": "t", "metaField": "m"})
        assert client.test.list_collection_names() == ["ts"]  # no buckets, no system.views
        ts_options = {"timeField": "t", "metaField": "m", "granularity": "seconds",
                      "bucketMaxSpanSeconds": 3600}
        info = next(client.test.list_collections())
        assert info["type"] == "timeseries" and info["options"] == {"timeseries": ts_options}
        assert "idIndex" not in info  # clustered
        raw = client.test.command("listCollections", rawData=True)["cursor"]["firstBatch"]
        assert [(i["type"], i["options"]) for i in raw] == [
            ("collection", {"clusteredIndex": True, "timeseries": ts_options})]
        # Its create entry names the collection, with no validator (mongod 9.0's
        # change_stream_timeseries.js: the viewless collectionCreationEvent).
        creates = _oplog(client, op="c", ns="test.$cmd", **{"o.create": {"$exists": True}})
        assert [dict(e["o"]) for e in creates] == [
            {"create": "ts", "clusteredIndex": True, "timeseries": ts_options}]
        assert creates[0]["ui"] == info["info"]["uuid"]
        indexes = _oplog(client, op="c", **{"o.createIndexes": "ts"})
        assert [e["o"]["key"] for e in indexes] == [
            {"meta": 1, "control.min.t": 1, "control.max.t": 1}]
        # The same create again answers ok; another one, or a view on the name, 48.
        client.test.command("create", "ts", timeseries={"timeField": "t", "metaField": "m"})
        for other in ({"timeseries": {"timeField": "u"}}, {"viewOn": "x", "pipeline": []}, {}):
            with pytest.raises(OperationFailure) as failed:
                client.test.command("create", "ts", **other)
            assert failed.value.code == 48
        client.test.ts.insert_many([{"t": T0, "m": "a", "v": 1}, {"t": T0, "m": "b", "v": 2}])
        assert [d["v"] for d in client.test.ts.find().sort("v", 1)] == [1, 2]
        raw_docs = client.test.command("find", "ts", rawData=True)["cursor"]["firstBatch"]
        assert sorted(b["meta"] for b in raw_docs) == ["a", "b"]
        # Its indexes list as the view's did (on the measurements), rawData as they are;
        # collMod changes its bucketing itself, with no view to redefine.
        assert [i["key"] for i in client.test.ts.list_indexes()] == [{"m": 1, "t": 1}]
        raw_indexes = client.test.command("listIndexes", "ts", rawData=True)
        assert {"meta": 1, "control.min.t": 1, "control.max.t": 1} in [
            i["key"] for i in raw_indexes["cursor"]["firstBatch"]]
        client.test.command("collMod", "ts", timeseries={"granularity": "hours"})
        info = next(client.test.list_collections())
        assert info["options"]["timeseries"]["granularity"] == "hours"
        mods = _oplog(client, op="c", **{"o.collMod": "ts"})
        assert [(e["o"]["timeseries"], e.get("isTimeseries")) for e in mods] == [
            ({"granularity": "hours"}, True)]
        assert client.test.list_collection_names() == ["ts"]
        assert client.test.command("drop", "ts")["nIndexesWas"] == 1
        assert client.test.list_collection_names() == []


def test_at_fcv_8_0_a_create_makes_a_viewful_collection(server):
    with server.client() as client:
        _fcv(client, "8.0")
        client.test.create_collection("ts", timeseries={"timeField": "t"})
        names = set(client.test.list_collection_names())
        assert names == {"ts", "system.buckets.ts", "system.views"}
        creates = _oplog(client, op="c", ns="test.$cmd", **{"o.create": {"$exists": True}})
        assert [e["o"]["create"] for e in creates] == ["system.buckets.ts", "system.views"]
        assert "validator" in creates[0]["o"]
        # The view's definition, in system.views, is what names the collection.
        views = _oplog(client, op="i", ns="test.system.views")
        assert [e["o"]["_id"] for e in views] == ["test.ts"]


def _stream_changes(db, target, options, **aggregate):
    """The events of a stream opened at `options`' start, read to its end for now."""
    return _SystemStream(db, target, {"showExpandedEvents": True, **options},
                         **aggregate).changes()


def test_a_viewless_collections_events_are_shown_only_with_raw_data(server):
    """As mongod 9.0's change_stream_timeseries.js: the entries of a viewless time-series
    collection carry `isTimeseries: true` (oplog_timeseries_marker.js); database and cluster
    streams show none of them (DDL or DML) without the aggregate's rawData, whatever
    showSystemEvents says, and all of them with it; a collection stream on it is refused
    without rawData and reads it with it."""
    with server.client() as client:
        start = client.admin.command("ping")["operationTime"]
        client.test.create_collection("ts", timeseries={"timeField": "t", "metaField": "m"})
        client.test.ts.insert_one({"t": T0, "m": "a", "v": 1})
        client.test.ts.insert_many([{"t": T0, "m": "b", "v": 2}, {"t": T0, "m": "c", "v": 3}])
        client.test.plain.insert_one({"x": 1})
        client.test.ts.drop()
        ts_ui = _oplog(client, **{"o.create": "ts"})[0]["ui"]
        marked = _oplog(client, isTimeseries=True)
        assert [(e["op"], next(iter(e["o"])) if e["op"] == "c" else e["ns"]) for e in marked] == [
            ("c", "create"), ("c", "createIndexes"), ("i", "test.ts"), ("i", "test.ts"),
            ("i", "test.ts"), ("c", "drop")]
        assert all(e["ui"] == ts_ui for e in marked)
        assert not _oplog(client, ns="test.plain", isTimeseries={"$exists": True})

        def seen(events):
            return [(e["operationType"], e["ns"]["coll"], e.get("nsType")) for e in events]

        plain = [("create", "plain", "collection"), ("insert", "plain", None)]
        viewless = [("create", "ts", "timeseries"), ("createIndexes", "ts", None),
                    ("insert", "ts", None), ("insert", "ts", None), ("insert", "ts", None)]
        for system in (False, True):
            options = {"startAtOperationTime": start, "showSystemEvents": system}
            assert seen(_stream_changes(client.test, 1, options)) == plain
            assert seen(_stream_changes(client.test, 1, options, rawData=True)) == [
                *viewless, *plain, ("drop", "ts", None)]
            cluster = _stream_changes(client.admin, 1, {**options, "allChangesForCluster": True})
            assert seen(cluster) == plain
        raw = _stream_changes(client.test, 1, {"startAtOperationTime": start}, rawData=True)
        create = raw[0]
        assert create["operationDescription"] == {"clusteredIndex": True, "timeseries": {
            "timeField": "t", "metaField": "m", "granularity": "seconds",
            "bucketMaxSpanSeconds": 3600}}
        assert raw[2]["fullDocument"]["meta"] == "a"  # the bucket, as it is stored

        client.test.create_collection("ts2", timeseries={"timeField": "t"})
        with pytest.raises(OperationFailure) as refused:
            client.test.command("aggregate", "ts2", pipeline=[{"$changeStream": {}}], cursor={})
        # OplogAggCatalogState::validate: a time-series collection without rawData (115);
        # the view check (166) is for a namespace that is a view.
        assert refused.value.code == 115
        assert refused.value.details["errmsg"] == (
            "Cannot run aggregation on timeseries with namespace test.ts2")
        on_ts2 = _SystemStream(client.test, "ts2", {}, rawData=True)
        client.test.ts2.insert_one({"t": T0, "v": 1})
        client.test.ts2.drop()
        assert [c["operationType"] for c in on_ts2.changes()] == ["insert", "drop", "invalidate"]


def test_after_an_fcv_upgrade_writes_are_marked_and_the_rename_is_not(server):
    """The conversion's rename is every stream's (change_stream_timeseries_fcv_upgrade_
    downgrade.js), the writes after it need rawData (its ts1PostInsertCmd); after a
    downgrade, they are the buckets collection's again, unmarked."""
    with server.client() as client:
        _fcv(client, "8.0")
        client.test.create_collection("ts", timeseries={"timeField": "t"})
        start = client.admin.command("ping")["operationTime"]
        client.test.ts.insert_one({"t": T0, "v": 1})  # into system.buckets.ts
        _fcv(client, "9.0")
        client.test.ts.insert_one({"t": T0, "v": 2})
        _fcv(client, "8.0")
        client.test.ts.insert_one({"t": T0, "v": 3})
        assert [e["ns"] for e in _oplog(client, isTimeseries=True)] == ["test.ts"]
        options = {"startAtOperationTime": start, "showSystemEvents": True}

        def seen(events):
            return [(e["operationType"], e["ns"]["coll"]) for e in events]

        up = ("rename", "system.buckets.ts")
        down = ("rename", "ts")
        # (The start is the view's create; the later measurements go into the first bucket.)
        assert seen(_stream_changes(client.test, 1, options)) == [
            ("create", "ts"), ("insert", "system.buckets.ts"), up, down,
            ("update", "system.buckets.ts")]
        assert seen(_stream_changes(client.test, 1, options, rawData=True)) == [
            ("create", "ts"), ("insert", "system.buckets.ts"), up, ("update", "ts"), down,
            ("update", "system.buckets.ts")]


def test_the_marker_hides_a_9_0_upstreams_entries_too():
    """The filter reads the marker, not the catalog: a sidecar of a mongod 9.0 hides what
    that mongod's own streams hide."""
    entry = {"op": "i", "ns": "db.ts", "o": {"_id": 1}, "isTimeseries": True,
             "ts": Timestamp(1, 1)}
    conversion = {"op": "c", "ns": "db.$cmd", "o": {
        "upgradeDowngradeViewlessTimeseries": "ts", "isUpgrade": True}, "isTimeseries": True,
        "ts": Timestamp(1, 2)}
    for raw, shown in ((False, False), (True, True)):
        cmd = {"aggregate": 1, "pipeline": [{"$changeStream": {}}], "cursor": {}}
        if raw:
            cmd["rawData"] = True
        f = OplogFilter(parse_aggregate(cmd, "db", MONGODB_9_0))
        assert f.matches(decode_entry(bson.encode(entry))) is shown
        assert f.matches(decode_entry(bson.encode(conversion))) is True
        inner = {"op": "i", "ns": "db.ts", "o": {"_id": 2}, "isTimeseries": True}
        assert f.matches_transaction_op(inner) is shown


@pytest.mark.parametrize("compatibility,timeseries_view_message", [
    ("8.0", "Cannot run aggregation on timeseries with namespace test.ts"),
    ("9.0", "Namespace test.ts is a view, not a collection"),
])
def test_a_collection_stream_on_a_view_is_refused_rawdata_or_not(
        compatibility, timeseries_view_message):
    """A view is refused (166) whatever rawData says; a time-series collection's view (its
    FCV 8.0 form) with 8.0's "Cannot run aggregation on timeseries" message, as any view from
    8.3 on. A database stream is not refused."""
    server = EmbeddedServer(config=Config(server=ServerConfig(compatibility=compatibility)))
    try:
        with server.client() as client:
            if compatibility == "9.0":
                _fcv(client, "8.0")  # time-series collections made with their view
            client.test.create_collection("ts", timeseries={"timeField": "t"})
            client.test.command("create", "v", viewOn="plain", pipeline=[])
            for coll, message in (("v", "Namespace test.v is a view, not a collection"),
                                  ("ts", timeseries_view_message)):
                # (rawData is 8.2's: asked of 8.0 only without it.)
                for aggregate in ({}, {"rawData": True})[:2 if compatibility == "9.0" else 1]:
                    with pytest.raises(OperationFailure) as refused:
                        client.test.command("aggregate", coll, cursor={},
                                            pipeline=[{"$changeStream": {}}], **aggregate)
                    assert refused.value.code == 166
                    assert refused.value.details["errmsg"] == message
            _SystemStream(client.test, 1, {}).changes()  # the database's stream opens
    finally:
        server.stop()


def test_a_live_stream_hides_a_viewless_collections_writes_too(server):
    """The writes a stream meets as they happen (its getMore: the fast path of plain CRUD
    streams, fast_path.py) are filtered on the marker as the ones it reads back: none without
    rawData, each with it."""
    with server.client() as client:
        client.test.create_collection("ts", timeseries={"timeField": "t", "metaField": "m"})
        for aggregate, shown in (({}, []), ({"rawData": True}, [("insert", "ts")])):
            stream = _SystemStream(client.test, 1, {}, **aggregate)
            client.test.ts.insert_one({"t": T0, "m": str(aggregate), "v": 1})  # a new bucket
            assert [(c["operationType"], c["ns"]["coll"]) for c in stream.changes()] == shown


@pytest.mark.parametrize("fcv", ["8.0", "9.0"], ids=["viewful", "viewless"])
def test_updates_and_deletes_write_measurements(server, fcv):
    """On the collection's name (its view at FCV 8.0, itself at 9.0), updates and deletes
    match and count measurements, as mongod's time-series write path: a bucket emptied is
    deleted, another one replaced by what it keeps, an updated measurement inserted again
    through the bucket catalog, an upsert too; rawData writes the buckets as they are."""
    with server.client() as client:
        _fcv(client, fcv)
        client.test.create_collection("ts", timeseries={"timeField": "t", "metaField": "m"})
        buckets_name = "ts" if fcv == "9.0" else "system.buckets.ts"
        ts = client.test.ts

        def buckets(filter_doc=None):  # as stored (rawData on the viewless collection)
            return client.test.command("find", buckets_name, filter=filter_doc or {},
                                       rawData=True)["cursor"]["firstBatch"]
        ts.insert_many([{"_id": i, "t": T0, "m": m, "v": i}
                        for i, m in enumerate("aaab")])  # two buckets: a (3), b (1)
        start = client.admin.command("ping")["operationTime"]

        def values():
            return sorted((d["m"], d["v"]) for d in ts.find())

        def bucket_ops():
            ns = f"test.{buckets_name}"
            return [e["op"] for e in client.local["oplog.rs"].find(
                {"ns": ns, "ts": {"$gt": start}})]

        assert ts.delete_one({"v": {"$gte": 1}}).deleted_count == 1  # the first in order
        assert values() == [("a", 0), ("a", 2), ("b", 3)]
        assert bucket_ops() == ["u"]  # the bucket of a, replaced by the two it keeps
        [a] = buckets({"meta": "a"})
        assert a["control"]["min"]["v"] == 0 and a["control"]["max"]["v"] == 2
        assert sorted(a["data"]["v"].items()) == [("0", 0), ("1", 2)]
        assert ts.delete_many({"m": "b"}).deleted_count == 1
        assert bucket_ops() == ["u", "d"]  # b's bucket emptied: deleted
        assert len(buckets()) == 1

        result = ts.update_many({"m": "a"}, {"$inc": {"v": 10}})
        assert (result.matched_count, result.modified_count) == (2, 2)
        assert values() == [("a", 10), ("a", 12)]
        result = ts.update_one({"v": 10}, {"$set": {"v": 10}})  # matched, not modified
        assert (result.matched_count, result.modified_count) == (1, 0)
        result = ts.update_one({"v": 10}, {"$set": {"m": "c"}})  # into another series
        assert (result.matched_count, result.modified_count) == (1, 1)
        assert values() == [("a", 12), ("c", 10)]
        assert sorted(b["meta"] for b in buckets()) == ["a", "c"]
        with pytest.raises(OperationFailure) as bad_time:
            ts.update_one({"v": 12}, {"$set": {"t": "noon"}})
        assert bad_time.value.code == 2
        assert values() == [("a", 12), ("c", 10)]  # nothing written
        upserted = ts.update_one({"v": 99}, {"$set": {"t": T0, "m": "d"}}, upsert=True)
        assert upserted.upserted_id is not None
        assert values() == [("a", 12), ("c", 10), ("d", 99)]
        assert ts.delete_many({}).deleted_count == 3
        assert buckets() == []

        if fcv == "9.0":  # rawData: the buckets, as they are
            ts.insert_one({"t": T0, "m": "e", "v": 1})
            raw = client.test.command("delete", "ts", deletes=[{"q": {"meta": "e"}, "limit": 0}],
                                      rawData=True)
            assert raw["n"] == 1 and ts.count_documents({}) == 0


@pytest.mark.parametrize("fcv", ["8.0", "9.0"], ids=["viewful", "viewless"])
def test_find_and_modify_takes_one_measurement(server, fcv):
    """findAndModify on the collection's name (timeseries_findAndModify_basic.js): one
    measurement removed or updated (the first, or the first by sort), the value before or
    after, an upsert's document a measurement."""
    with server.client() as client:
        _fcv(client, fcv)
        client.test.create_collection("ts", timeseries={"timeField": "t"})
        ts = client.test.ts
        ts.insert_many([{"_id": i, "t": T0, "v": i} for i in range(4)])
        before = ts.find_one_and_update({"v": {"$gt": 0}}, {"$set": {"w": 1}})
        assert before == {"t": T0, "_id": 1, "v": 1}
        after = ts.find_one_and_update({"v": {"$gt": 0}}, {"$inc": {"v": 10}},
                                       sort=[("v", -1)], return_document=True)
        assert after["_id"] == 3 and after["v"] == 13
        assert ts.count_documents({"w": 1}) == 1
        removed = ts.find_one_and_delete({"w": 1})
        assert removed["_id"] == 1 and removed["w"] == 1
        assert sorted(d["_id"] for d in ts.find()) == [0, 2, 3]
        assert ts.find_one_and_delete({"v": 99}) is None
        upserted = ts.find_one_and_update({"v": 99}, {"$set": {"t": T0}}, upsert=True,
                                          return_document=True)
        assert upserted["v"] == 99 and ts.count_documents({}) == 4
