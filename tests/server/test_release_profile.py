"""The compatibility profile (`[server] compatibility`): the embedded store answering as mongod
8.0 (the default) and as 9.0, through a real driver. What differs is what the profile says
(pipeline_stages/release.py): version, wire version, the `$changeStream` options 9.0 adds,
serverStatus's change-stream counters, the FCV and setFeatureCompatibilityVersion."""

from __future__ import annotations

import pytest
from pymongo.errors import OperationFailure

from cdcserver.config import Config, ServerConfig, check_config
from cdcserver.testing import EmbeddedServer
from pipeline_stages.release import MONGODB_8_0, MONGODB_9_0, release_for_upstream


def _server(compatibility: str) -> EmbeddedServer:
    return EmbeddedServer(config=Config(server=ServerConfig(compatibility=compatibility)))


@pytest.fixture(params=["8.0", "9.0"])
def profile(request):
    server = _server(request.param)
    try:
        with server.client() as client:
            yield request.param, client
    finally:
        server.stop()


def _open(client, coll="c", **options):
    db = client.admin if options.get("allChangesForCluster") else client.test
    target = 1 if coll is None or options.get("allChangesForCluster") else coll
    reply = db.command("aggregate", target, pipeline=[{"$changeStream": options}], cursor={})
    db.command("killCursors", target, cursors=[reply["cursor"]["id"]])
    return reply


def _cs_metrics(client):
    return client.admin.command("serverStatus")["metrics"]["changeStreams"]


def test_version_and_wire_version_are_the_profiles(profile):
    name, client = profile
    release = MONGODB_9_0 if name == "9.0" else MONGODB_8_0
    info = client.admin.command("buildInfo")
    assert info["version"] == release.version
    assert info["versionArray"][:2] == [int(x) for x in name.split(".")]
    assert client.admin.command("hello")["maxWireVersion"] == release.max_wire_version
    assert client.server_info()["version"].startswith(name + ".")
    assert client.admin.command("serverStatus")["version"] == release.version
    fcv = client.admin.command("getParameter", 1, featureCompatibilityVersion=1)
    assert fcv["featureCompatibilityVersion"] == {"version": name}


@pytest.mark.parametrize("option,value", [("ignoreRemovedShards", True), ("version", "v1"),
                                          ("version", "v2")])
def test_9_0_options_are_unknown_fields_on_8_0_and_accepted_on_9_0(profile, option, value):
    name, client = profile
    if name == "8.0":
        with pytest.raises(OperationFailure) as err:
            _open(client, **{option: value})
        assert err.value.code == 40415
        assert err.value.details["errmsg"] == (
            f"BSON field '$changeStream.{option}' is an unknown field.")
    else:
        assert _open(client, **{option: value})["ok"] == 1.0


def test_9_0_refuses_other_reader_versions_and_types():
    server = _server("9.0")
    try:
        with server.client() as client:
            with pytest.raises(OperationFailure) as err:
                _open(client, version="v3")
            assert err.value.code == 2
            assert err.value.details["errmsg"] == (
                "Enumeration value 'v3' for field '$changeStream.version' is not a valid value.")
            with pytest.raises(OperationFailure) as err:
                _open(client, ignoreRemovedShards=1)
            assert err.value.code == 14
    finally:
        server.stop()


def test_9_0_counts_options_and_scopes_8_0_counts_show_expanded_events(profile):
    name, client = profile
    before = _cs_metrics(client)
    _open(client, showExpandedEvents=True, fullDocument="updateLookup")
    _open(client, coll=None, fullDocumentBeforeChange="whenAvailable")
    _open(client, coll=None, allChangesForCluster=True, showExpandedEvents=False)
    after = _cs_metrics(client)
    if name == "8.0":
        assert list(after) == ["largeEventsFailed", "largeEventsSplit", "showExpandedEvents"]
        assert after["showExpandedEvents"] == before["showExpandedEvents"] + 1
        return
    assert list(after) == ["largeEventsFailed", "largeEventsSplit", "option", "scope"]
    assert list(after["option"]["fullDocument"]) == ["required", "updateLookup",
                                                     "whenAvailable"]
    assert after["option"]["showExpandedEvents"] == before["option"]["showExpandedEvents"] + 1
    assert (after["option"]["fullDocument"]["updateLookup"]
            == before["option"]["fullDocument"]["updateLookup"] + 1)
    assert (after["option"]["fullDocumentBeforeChange"]["whenAvailable"]
            == before["option"]["fullDocumentBeforeChange"]["whenAvailable"] + 1)
    assert after["option"]["startAtOperationTime"] == before["option"]["startAtOperationTime"]
    assert {k: after["scope"][k] - before["scope"][k] for k in after["scope"]} == {
        "cluster": 1, "collection": 1, "db": 1}


def test_a_resume_option_counts_only_when_the_client_gave_it():
    server = _server("9.0")
    try:
        with server.client() as client:
            client.test.c.insert_one({"_id": 1})
            start = client.admin.command("ping")["operationTime"]
            before = _cs_metrics(client)["option"]
            _open(client, startAtOperationTime=start)
            _open(client)
            after = _cs_metrics(client)["option"]
            assert after["startAtOperationTime"] == before["startAtOperationTime"] + 1
            assert after["resumeAfter"] == before["resumeAfter"]
    finally:
        server.stop()


def test_set_feature_compatibility_version_as_mongod(profile):
    name, client = profile
    older = "7.0" if name == "8.0" else "8.0"
    with pytest.raises(OperationFailure) as err:
        client.admin.command("setFeatureCompatibilityVersion", older)
    assert err.value.code == 7369100
    assert "continue with the FCV downgrade" in err.value.details["errmsg"]
    with pytest.raises(OperationFailure) as err:
        client.test.command("setFeatureCompatibilityVersion", older, confirm=True)
    assert err.value.code == 13
    with pytest.raises(OperationFailure) as err:
        client.admin.command("setFeatureCompatibilityVersion", "10.0", confirm=True)
    assert err.value.code == 2
    assert client.admin.command("setFeatureCompatibilityVersion", name)["ok"] == 1.0  # no-op
    client.admin.command("setFeatureCompatibilityVersion", older, confirm=True)
    fcv = client.admin.command("getParameter", 1, featureCompatibilityVersion=1)
    assert fcv["featureCompatibilityVersion"] == {"version": older}
    assert client.admin.command("serverStatus")["featureCompatibilityVersion"] == {
        "version": older}
    with pytest.raises(OperationFailure) as err:
        client.admin.command("setFeatureCompatibilityVersion", name)
    assert "continue with the FCV upgrade" in err.value.details["errmsg"]
    assert f"upgraded to {name}," in err.value.details["errmsg"]


def test_the_fcv_is_durable_with_the_store(tmp_path):
    server = EmbeddedServer(tmp_path, config=Config(server=ServerConfig(compatibility="9.0")))
    try:
        with server.client() as client:
            client.admin.command("setFeatureCompatibilityVersion", "8.0", confirm=True)
    finally:
        server.stop()
    server = EmbeddedServer(tmp_path, config=Config(server=ServerConfig(compatibility="9.0")))
    try:
        with server.client() as client:
            fcv = client.admin.command("getParameter", 1, featureCompatibilityVersion=1)
            assert fcv["featureCompatibilityVersion"] == {"version": "8.0"}
    finally:
        server.stop()


def test_an_unknown_compatibility_is_a_config_error(tmp_path):
    path = tmp_path / "c.toml"
    path.write_text('[server]\ncompatibility = "8.2"\n')
    _, errors = check_config(str(path), env={})
    assert errors == ['server.compatibility: must be one of "8.0", "9.0", got \'8.2\'']


@pytest.mark.parametrize("version,wire,expected", [
    ("8.0.4", 25, MONGODB_8_0), ("8.2.1", 27, MONGODB_8_0), ("9.0.4", 29, MONGODB_9_0),
    ("9.1.0-rc0", 30, MONGODB_9_0), (None, 29, MONGODB_9_0), (None, 21, MONGODB_8_0),
    ("7.0.2", 21, MONGODB_8_0),
])
def test_an_upstreams_release_picks_the_newest_profile_not_newer(version, wire, expected):
    assert release_for_upstream(version, wire) is expected


def test_a_sidecar_answers_as_its_upstream_and_follows_its_upgrade():
    from tests.server.test_upstream import UpstreamServer, latest_ts

    a = EmbeddedServer()  # the upstream: 8.0 until its "binary upgrade" below
    b = None
    try:
        b = UpstreamServer(a.uri, max_await_ms=100)
        b.wait_ready()
        with a.client() as ca, b.client() as cb:
            assert cb.admin.command("buildInfo")["version"] == MONGODB_8_0.version
            with pytest.raises(OperationFailure) as err:
                _open(cb, version="v1")
            assert err.value.code == 40415
            stream = cb.test.c.watch(max_await_time_ms=100)
            ca.test.c.insert_one({"_id": 1})
            assert stream.next()["documentKey"] == {"_id": 1}
            a.call(setattr, a.state, "configured_release", MONGODB_9_0)
            ca.test.c.insert_one({"_id": 2})  # B polls A's hello for this one's commit
            b.wait_caught_up(latest_ts(a))
            assert stream.next()["documentKey"] == {"_id": 2}  # the stream goes on
            assert cb.admin.command("buildInfo")["version"] == MONGODB_9_0.version
            assert cb.admin.command("hello")["maxWireVersion"] == MONGODB_9_0.max_wire_version
            assert _open(cb, version="v1", ignoreRemovedShards=True)["ok"] == 1.0
            stream.close()
    finally:
        if b is not None:
            b.stop()
        a.stop()


class _Stream:
    """A change stream read by hand (getMore), with options drivers' watch() does not pass
    (showSystemEvents, allowToRunOnSystemNS)."""

    def __init__(self, client, db, coll, aggregate=None, **options):
        self.db, self.coll = client[db], coll
        reply = self.db.command("aggregate", coll, cursor={},
                                pipeline=[{"$changeStream": options}], **(aggregate or {}))
        self.id = reply["cursor"]["id"]
        self.ns_coll = reply["cursor"]["ns"].partition(".")[2]  # `$cmd.aggregate` for db/cluster
        self.events = list(reply["cursor"]["firstBatch"])

    def read(self):
        """Every event so far (until a getMore comes back empty or the cursor closes)."""
        while self.id:
            reply = self.db.command("getMore", self.id, collection=self.ns_coll, maxTimeMS=100)
            self.id = reply["cursor"]["id"]
            batch = list(reply["cursor"]["nextBatch"])
            if not batch:
                break
            self.events += batch
        return self.events

    def close(self):
        if self.id:
            self.db.command("killCursors", self.ns_coll, cursors=[self.id])


def _fcv_of(client):
    """The FCV serverStatus shows: a sidecar's own answer (getParameter it forwards)."""
    return client.admin.command("serverStatus")["featureCompatibilityVersion"]


def test_a_sidecar_follows_its_upstreams_fcv_upgrade_with_a_time_series_collection():
    """The upstream: 8.0 (FCV 8.0), then its "binary" 9.0 (FCV still 8.0), then FCV 9.0,
    which converts its time-series collection. The sidecar answers each FCV in turn, and its
    streams give every event once, the conversion as rename (+ invalidate), exactly as the
    upstream's own streams do."""
    import datetime

    from tests.server.test_upstream import UpstreamServer, latest_ts

    a = EmbeddedServer()
    b = None
    opened: list[_Stream] = []
    try:
        with a.client() as ca:
            ca.admin.command("setFeatureCompatibilityVersion", "7.0", confirm=True)
            ca.admin.command("setFeatureCompatibilityVersion", "8.0", confirm=True)
            b = UpstreamServer(a.uri, max_await_ms=100)
            b.wait_ready()
            with b.client() as cb:
                assert _fcv_of(cb) == {"version": "8.0"}
                start = latest_ts(a)
                options = {"startAtOperationTime": start, "showExpandedEvents": True,
                           "showSystemEvents": True}
                pairs = {}
                for name, client in (("a", ca), ("b", cb)):
                    pairs[name] = (
                        _Stream(client, "admin", 1, allChangesForCluster=True, **options),
                        _Stream(client, "test", 1, **options),
                        _Stream(client, "test", "system.buckets.ts",
                                allowToRunOnSystemNS=True, startAtOperationTime=start),
                        _Stream(client, "test", 1, {"rawData": True}, **options),
                    )
                    opened += pairs[name]
                t0 = datetime.datetime(2024, 5, 1)
                ca.test.create_collection("ts", timeseries={"timeField": "t", "metaField": "m"})
                ca.test.ts.insert_one({"t": t0, "m": "before", "v": 1})
                a.call(setattr, a.state, "configured_release", MONGODB_9_0)  # binary upgrade
                ca.test.other.insert_one({"_id": 1})
                b.wait_caught_up(latest_ts(a))
                assert cb.admin.command("buildInfo")["version"] == MONGODB_9_0.version
                assert _fcv_of(cb) == {"version": "8.0"}  # a binary upgrade keeps the FCV
                ca.admin.command("setFeatureCompatibilityVersion", "9.0", confirm=True)
                ca.test.ts.insert_one({"t": t0, "m": "after", "v": 2})
                b.wait_caught_up(latest_ts(a))
                assert _fcv_of(cb) == {"version": "9.0"}
                assert b.call(lambda: b.source.version.fcv) == {"version": "9.0"}
                assert cb.admin.command("getParameter", 1, featureCompatibilityVersion=1)[
                    "featureCompatibilityVersion"] == {"version": "9.0"}  # forwarded
                for upstream, sidecar in zip(pairs["a"], pairs["b"], strict=True):
                    want, got = upstream.read(), sidecar.read()
                    assert got == want  # every event once, tokens and all
                cluster, db_stream, on_buckets, raw = (s.events for s in pairs["b"])
                kinds = [(e["operationType"], e["ns"].get("coll")) for e in cluster]
                # The insert into the viewless collection is marked isTimeseries: shown only
                # with rawData, as mongod 9.0 shows it (change_stream_timeseries_fcv_upgrade_
                # downgrade.js's ts1PostInsertCmd).
                assert kinds == [
                    ("create", "system.buckets.ts"), ("createIndexes", "system.buckets.ts"),
                    ("create", "system.views"), ("create", "ts"),
                    ("insert", "system.buckets.ts"), ("create", "other"), ("insert", "other"),
                    ("rename", "system.buckets.ts")]
                assert raw == [*db_stream, raw[-1]]
                assert (raw[-1]["operationType"], raw[-1]["ns"]["coll"]) == ("insert", "ts")
                assert raw[-1]["fullDocument"]["meta"] == "after"
                rename = cluster[7]
                assert rename["to"] == {"db": "test", "coll": "ts"}
                assert rename["operationDescription"] == {"to": {"db": "test", "coll": "ts"}}
                assert rename["collectionUUID"] == cluster[0]["collectionUUID"]
                assert db_stream == cluster
                assert [e["operationType"] for e in on_buckets] == [
                    "insert", "rename", "invalidate"]
    finally:
        for stream in opened:
            try:
                stream.close()
            except Exception:  # noqa: BLE001 - the server may be gone already
                pass
        if b is not None:
            b.stop()
        a.stop()


def test_a_sidecar_passes_an_unknown_command_through_with_one_warning(caplog):
    from tests.server.test_upstream import UpstreamServer, latest_ts

    a = EmbeddedServer()
    b = None
    try:
        b = UpstreamServer(a.uri, max_await_ms=100)
        b.wait_ready()
        with a.client() as ca, b.client() as cb:
            stream = cb.watch(max_await_time_ms=100)

            def future_commands():
                store = a.state.store
                with store.batch():  # a command no release cdcserver knows writes, twice
                    store.append_oplog("c", "test.$cmd", {"reticulateSplines": "c"})
                    store.append_oplog("c", "test.$cmd", {"reticulateSplines": "d"})

            with caplog.at_level("WARNING", logger="cdcserver.sources.upstream_version"):
                a.call(future_commands)
                ca.test.c.insert_one({"_id": 1})
                b.wait_caught_up(latest_ts(a))
                change = stream.next()  # the stream goes on past them
                assert change["operationType"] == "insert"
                assert change["documentKey"] == {"_id": 1}
            warnings = [r for r in caplog.records if "reticulateSplines" in r.getMessage()]
            assert len(warnings) == 1
            assert "MongoDB 8.0" in warnings[0].getMessage()
            stream.close()
    finally:
        if b is not None:
            b.stop()
        a.stop()


def test_retry_change_stream_is_resumable_in_both_profiles(profile):
    """RetryChangeStream (234) is in isResumableChangeStreamError's codes in 8.0 and 9.0
    alike (error_labels.cpp): a change stream's getMore failing with it after its cursor was
    checked out (the fail point the spec's errorLabels tests use) is labelled
    ResumableChangeStreamError; a query cursor's getMore is not."""
    name, client = profile
    client.test.c.insert_many([{"_id": i} for i in range(3)])
    for pipeline, labels in (([{"$changeStream": {}}], ["ResumableChangeStreamError"]),
                             ([], None)):
        reply = client.test.command("aggregate", "c", pipeline=pipeline,
                                    cursor={"batchSize": 0})
        client.admin.command("configureFailPoint", "failGetMoreAfterCursorCheckout",
                             mode={"times": 1}, data={"errorCode": 234})
        with pytest.raises(OperationFailure) as err:
            client.test.command("getMore", reply["cursor"]["id"], collection="c")
        assert err.value.code == 234
        assert err.value.details.get("errorLabels") == labels


def test_the_fcv_a_sidecar_takes_from_its_upstreams_oplog():
    from cdcserver.sources.upstream_version import UpstreamVersion

    version = UpstreamVersion()
    version.stale = False
    key = {"_id": "featureCompatibilityVersion"}
    version.note_version_write({"op": "u", "o": {"_id": "other", "version": "1"},
                                "o2": {"_id": "other"}})
    assert version.fcv is None and not version.stale
    version.note_version_write({"op": "u", "o2": key, "o": {
        "_id": "featureCompatibilityVersion", "version": "8.0", "targetVersion": "9.0"}})
    assert version.fcv == {"version": "8.0", "targetVersion": "9.0"}
    # A delta does not hold the whole document: read it again (getParameter).
    version.note_version_write({"op": "u", "o2": key,
                                "o": {"$v": 2, "diff": {"u": {"version": "9.0"}}}})
    assert version.stale and version.fcv == {"version": "8.0", "targetVersion": "9.0"}
    version.note_version_write({"op": "i", "o": {"_id": "featureCompatibilityVersion",
                                                 "version": "9.0"}})
    assert version.fcv == {"version": "9.0"}


@pytest.mark.parametrize("compatibility", ["8.0", "9.0"])
def test_a_sidecar_refuses_a_stream_its_upstream_refuses(compatibility):
    """A collection stream on the upstream's view is refused (166), and on its viewless
    time-series collection (9.0 at FCV 9.0) without rawData (115), read from the upstream's
    catalog when the stream opens, with the messages the upstream's own aggregate gives; with
    rawData the viewless one opens, and a database stream always does."""
    import datetime

    from tests.server.test_upstream import UpstreamServer

    a = _server(compatibility)
    b = None
    try:
        with a.client() as ca:
            ca.test.create_collection("ts", timeseries={"timeField": "t"})
            ca.test.command("create", "v", viewOn="plain", pipeline=[])
            b = UpstreamServer(a.uri, max_await_ms=100)
            b.wait_ready()
            with b.client() as cb:
                def refusal_of(client, coll, **aggregate):
                    with pytest.raises(OperationFailure) as err:
                        client.test.command("aggregate", coll, cursor={},
                                            pipeline=[{"$changeStream": {}}], **aggregate)
                    return err.value.code, err.value.details["errmsg"]

                refused = ["v", "ts"]
                for coll in refused:
                    assert refusal_of(cb, coll) == refusal_of(ca, coll)
                assert refusal_of(cb, "v") == (166, "Namespace test.v is a view, not a collection")
                want = ((115, "Cannot run aggregation on timeseries with namespace test.ts")
                        if compatibility == "9.0" else
                        (166, "Cannot run aggregation on timeseries with namespace test.ts"))
                assert refusal_of(cb, "ts") == want
                opened = [_Stream(cb, "test", 1), _Stream(cb, "test", "plain")]
                if compatibility == "9.0":
                    assert refusal_of(cb, "v", rawData=True) == refusal_of(ca, "v", rawData=True)
                    opened.append(_Stream(cb, "test", "ts", {"rawData": True}))
                    ca.test.ts.insert_one({"t": datetime.datetime(2024, 5, 1), "v": 1})
                    b.wait_caught_up(ca.admin.command("ping")["operationTime"])
                    assert [e["operationType"] for e in opened[-1].read()] == ["insert"]
                for stream in opened:
                    stream.close()
    finally:
        if b is not None:
            b.stop()
        a.stop()
