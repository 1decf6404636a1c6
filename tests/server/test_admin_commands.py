"""The administrative commands (cdcserver/commands/admin.py) through pymongo, as a test harness
or a tool uses them: getCmdLineOpts, getParameter, replSetGetStatus, serverStatus, hostInfo,
listCommands, explain, validate, profile, dbStats / collStats / $collStats, usersInfo,
currentOp / $currentOp, $listLocalSessions; on the embedded store and on a recorded oplog."""

from __future__ import annotations

import os
import threading

import pymongo
import pytest
from bson.int64 import Int64
from pymongo.errors import OperationFailure

from cdcserver import auth
from cdcserver.config import AuthConfig, Config, RoleConfig, ServerConfig, UserConfig
from cdcserver.testing import EmbeddedServer, ThreadServer, write_oplog


def _fresh(client: pymongo.MongoClient, name: str) -> pymongo.collection.Collection:
    client.admin_tests.drop_collection(name)
    return client.admin_tests[name]


# -- getCmdLineOpts / getParameter -------------------------------------------------------------


def test_get_cmd_line_opts_reflects_the_servers_settings(server, client):
    opts = client.admin.command("getCmdLineOpts")
    assert isinstance(opts["argv"], list) and opts["argv"]
    parsed = opts["parsed"]
    hello = client.admin.command("hello")
    assert parsed["net"] == {"bindIp": "127.0.0.1", "port": server.port}
    assert parsed["replication"] == {"replSetName": hello["setName"]}
    assert "security" not in parsed  # authorization off
    assert parsed["storage"] == {"engine": "inMemory"}
    assert parsed["setParameter"] == {"enableTestCommands": "1"}
    with pytest.raises(OperationFailure) as excinfo:
        client.other.command("getCmdLineOpts")
    assert excinfo.value.code == 13
    assert "may only be run against the admin database" in str(excinfo.value)


def test_get_parameter_star_lists_every_parameter_in_name_order(client):
    params = client.admin.command("getParameter", "*")
    names = [k for k in params if k not in ("ok", "$clusterTime", "operationTime")]
    assert names == sorted(names)
    assert params["enableTestCommands"] is True
    assert params["featureCompatibilityVersion"] == {"version": "8.0"}
    assert params["transactionLifetimeLimitSeconds"] == 60
    assert params["authenticationMechanisms"] == ["SCRAM-SHA-1", "SCRAM-SHA-256"]
    one = client.admin.command({"getParameter": 1, "ttlMonitorSleepSecs": 1})
    assert one["ttlMonitorSleepSecs"] == 60 and "enableTestCommands" not in one
    detail = client.admin.command({"getParameter": {"showDetails": True}, "cursorTimeoutMillis": 1})
    assert detail["cursorTimeoutMillis"] == {
        "value": Int64(600_000), "settableAtRuntime": True, "settableAtStartup": True}
    with pytest.raises(OperationFailure) as excinfo:
        client.admin.command({"getParameter": 1, "noSuchParameter": 1})
    assert (excinfo.value.code, excinfo.value.details["errmsg"]) == (72, "no option found to get")


def _user(name: str, password: str, role: str) -> UserConfig:
    creds = {
        "scram_sha_256": auth.derive_credentials(auth.SCRAM_SHA_256, name, password,
                                                 iterations=4096),
    }
    r, d = auth.parse_role(role)
    return UserConfig(user=name, roles=[RoleConfig(role=r, db=d)], **creds)


def test_auth_and_disabled_test_commands_show_in_the_options():
    config = Config(
        auth=AuthConfig(enabled=True, users=[_user("admin", "pw", "root"),
                                             _user("reader", "pw2", "read@shop")]),
        server=ServerConfig(enable_fail_points=False),
    )
    with EmbeddedServer(config=config) as server:
        from cdcserver.commands import failpoints

        server.call(failpoints.set_enabled, server.state, False)
        with pymongo.MongoClient(server.direct_uri, username="admin", password="pw") as client:
            parsed = client.admin.command("getCmdLineOpts")["parsed"]
            assert parsed["security"] == {"authorization": "enabled"}
            assert "setParameter" not in parsed
            assert client.admin.command("getParameter", "*")["enableTestCommands"] is False
            users = client.admin.command("usersInfo", {"forAllDBs": True})["users"]
            assert [(u["user"], u["db"], u["roles"]) for u in users] == [
                ("admin", "admin", [{"role": "root", "db": "admin"}]),
                ("reader", "admin", [{"role": "read", "db": "shop"}]),
            ]
            assert users[0]["_id"] == "admin.admin"
            assert users[0]["mechanisms"] == ["SCRAM-SHA-256"]
            one = client.admin.command("usersInfo", "reader")["users"]
            assert [u["user"] for u in one] == ["reader"]
            assert client.shop.command("usersInfo", 1)["users"] == []  # none defined on shop
        with pymongo.MongoClient(server.direct_uri) as anonymous:
            with pytest.raises(OperationFailure) as excinfo:
                anonymous.admin.command("getCmdLineOpts")
            assert excinfo.value.code == 13  # how PyMongo's harness learns auth is on


# -- the replica set -----------------------------------------------------------------------------


def test_repl_set_get_status_describes_one_primary(client):
    coll = _fresh(client, "status")
    coll.insert_one({"x": 1})
    hello = client.admin.command("hello")
    status = client.admin.command("replSetGetStatus")
    assert status["set"] == hello["setName"]
    assert status["myState"] == 1
    assert status["term"] == Int64(1)
    (member,) = status["members"]
    assert (member["name"], member["stateStr"], member["state"], member["self"]) == (
        hello["me"], "PRIMARY", 1, True)
    assert member["optime"] == hello["lastWrite"]["opTime"]
    assert status["optimes"]["appliedOpTime"] == hello["lastWrite"]["opTime"]
    config = client.admin.command("replSetGetConfig")["config"]
    assert config["_id"] == hello["setName"]
    assert [m["host"] for m in config["members"]] == hello["hosts"]


# -- serverStatus / hostInfo / listCommands -------------------------------------------------------


def test_server_status_counts_operations_and_documents(client):
    coll = _fresh(client, "counted")
    before = client.admin.command("serverStatus")
    coll.insert_many([{"x": i} for i in range(3)])
    coll.update_many({}, {"$set": {"y": 1}})
    list(coll.find({}))
    coll.delete_one({"x": 0})
    with pytest.raises(OperationFailure):
        client.admin_tests.command({"find": 1})  # fails: counted as failed
    after = client.admin.command("serverStatus")
    ops = {k: after["opcounters"][k] - before["opcounters"][k] for k in before["opcounters"]}
    assert ops["insert"] == 3 and ops["update"] == 1 and ops["delete"] == 1
    assert ops["query"] == 2  # the two finds
    docs = after["metrics"]["document"]
    was = before["metrics"]["document"]
    assert docs["inserted"] - was["inserted"] == 3
    assert docs["updated"] - was["updated"] == 3
    assert docs["deleted"] - was["deleted"] == 1
    assert docs["returned"] - was["returned"] == 3
    find = after["metrics"]["commands"]["find"]
    find_was = before["metrics"]["commands"].get("find", {"failed": 0, "total": 0})
    assert (find["total"] - find_was["total"], find["failed"] - find_was["failed"]) == (2, 1)
    assert after["connections"]["current"] >= 1
    assert after["repl"]["setName"] == client.admin.command("hello")["setName"]
    assert after["process"] == "mongod" and after["version"].startswith("8.0.")
    section_names = [k for k in after if k not in (
        "host", "version", "process", "pid", "uptime", "uptimeMillis", "uptimeEstimate",
        "localTime", "ok", "$clusterTime", "operationTime")]
    assert section_names == sorted(section_names)
    trimmed = client.admin.command({"serverStatus": 1, "repl": 0, "metrics": 0})
    assert "repl" not in trimmed and "metrics" not in trimmed and "opcounters" in trimmed


def test_server_status_change_stream_metrics(client):
    _fresh(client, "big")
    coll = client.admin_tests.create_collection(
        "big", changeStreamPreAndPostImages={"enabled": True})
    before = client.admin.command("serverStatus")["metrics"]["changeStreams"]
    with coll.watch(show_expanded_events=True, max_await_time_ms=50):
        pass
    # An event over 16 MiB (two 9 MB images), split by $changeStreamSplitLargeEvent.
    with coll.watch([{"$changeStreamSplitLargeEvent": {}}], full_document="updateLookup",
                    full_document_before_change="required", max_await_time_ms=200) as stream:
        coll.insert_one({"_id": 1, "a": "x" * 9_000_000})
        coll.replace_one({"_id": 1}, {"a": "y" * 9_000_000})
        fragments: list[dict] = []
        while not fragments or fragments[-1]["splitEvent"]["fragment"] < \
                fragments[-1]["splitEvent"]["of"]:
            event = stream.try_next()
            if event is not None and "splitEvent" in event:  # the insert fits unsplit
                fragments.append(event)
    after = client.admin.command("serverStatus")["metrics"]["changeStreams"]
    assert fragments[0]["splitEvent"]["of"] > 1
    assert after["showExpandedEvents"] - before["showExpandedEvents"] == 1
    assert after["largeEventsSplit"] - before["largeEventsSplit"] == 1
    assert after["largeEventsFailed"] == before["largeEventsFailed"]


def test_host_info_and_list_commands(client):
    info = client.admin.command("hostInfo")
    assert info["system"]["numCores"] == os.cpu_count()
    assert info["os"]["type"] == os.uname().sysname
    commands = client.admin.command("listCommands")["commands"]
    assert list(commands) == sorted(commands)
    for name in ("find", "insert", "aggregate", "getCmdLineOpts", "replSetGetStatus", "explain"):
        assert name in commands
    assert commands["find"]["apiVersions"] == ["1"]
    assert commands["getParameter"]["adminOnly"] is True
    assert commands["hello"]["requiresAuth"] is False
    assert not any(name.startswith("$") for name in commands)


# -- explain --------------------------------------------------------------------------------------


def test_explain_find_count_and_writes(client):
    coll = _fresh(client, "explained")
    coll.insert_many([{"x": i} for i in range(10)])
    plan = coll.find({"x": {"$gte": 6}}).sort("x", -1).limit(3).explain()
    assert plan["explainVersion"] == "1"
    planner = plan["queryPlanner"]
    assert planner["namespace"] == "admin_tests.explained"
    assert planner["parsedQuery"] == {"x": {"$gte": 6}}
    assert planner["winningPlan"]["stage"] == "SORT"
    assert planner["winningPlan"]["inputStage"]["stage"] == "COLLSCAN"
    stats = plan["executionStats"]
    assert (stats["nReturned"], stats["totalDocsExamined"]) == (3, 10)
    assert plan["command"]["find"] == "explained"
    assert plan["serverInfo"]["version"].startswith("8.0.")
    count = client.admin_tests.command(
        "explain", {"count": "explained", "query": {"x": 1}}, verbosity="executionStats")
    assert count["queryPlanner"]["winningPlan"]["stage"] == "COUNT"
    assert count["executionStats"]["nReturned"] == 1
    delete = client.admin_tests.command(
        "explain", {"delete": "explained", "deletes": [{"q": {}, "limit": 0}]},
        verbosity="executionStats")
    assert delete["queryPlanner"]["winningPlan"]["stage"] == "DELETE"
    assert coll.count_documents({}) == 10  # explain runs nothing
    agg = client.admin_tests.command(
        "aggregate", "explained", pipeline=[{"$match": {"x": 1}}, {"$group": {"_id": "$x"}}],
        explain=True)
    assert agg["stages"][0]["$cursor"]["queryPlanner"]["parsedQuery"] == {"x": 1}
    assert agg["stages"][1] == {"$group": {"_id": "$x"}}
    with pytest.raises(OperationFailure) as excinfo:
        client.admin_tests.command("explain", {"noSuchCommand": 1})
    assert excinfo.value.code == 59
    with pytest.raises(OperationFailure) as excinfo:
        client.admin_tests.command("explain", {"find": "explained"}, verbosity="loud")
    assert excinfo.value.code == 2


# -- validate / profile / storage statistics ------------------------------------------------------


def test_validate(client):
    coll = _fresh(client, "validated")
    coll.insert_many([{"x": i} for i in range(4)])
    coll.create_index("x")
    result = client.admin_tests.command("validate", "validated")
    assert result["valid"] is True and result["nrecords"] == 4
    assert result["keysPerIndex"] == {"_id_": 4, "x_1": 4}
    assert result["ns"] == "admin_tests.validated"
    with pytest.raises(OperationFailure) as excinfo:
        client.admin_tests.command("validate", "missing")
    assert excinfo.value.code == 26


def test_profile_reports_and_sets_the_slow_threshold(server, client):
    first = client.admin_tests.command("profile", -1)
    assert (first["was"], first["sampleRate"]) == (0, 1.0)
    previous = client.admin_tests.command("profile", 0, slowms=250)
    assert previous["slowms"] == first["slowms"]
    assert client.admin_tests.command("profile", -1)["slowms"] == 250
    assert server.state.slow_s == 0.25  # the "Slow query" log threshold, as mongod's slowms
    client.admin_tests.command("profile", 0, slowms=first["slowms"])
    with pytest.raises(OperationFailure) as excinfo:
        client.admin_tests.command("profile", 3)
    assert excinfo.value.code == 2


def test_db_stats_coll_stats_and_the_coll_stats_stage(client):
    coll = _fresh(client, "sized")
    client.admin_tests.drop_collection("sized_other")
    coll.insert_many([{"x": i, "pad": "p" * 100} for i in range(5)])
    stats = client.admin_tests.command("collStats", "sized")
    assert (stats["ns"], stats["count"], stats["nindexes"]) == ("admin_tests.sized", 5, 1)
    assert stats["size"] == stats["avgObjSize"] * 5
    assert list(stats["indexSizes"]) == ["_id_"]
    (doc,) = coll.aggregate([{"$collStats": {"storageStats": {}, "count": {}}}])
    assert doc["ns"] == "admin_tests.sized" and doc["count"] == 5
    assert doc["storageStats"]["count"] == 5 and doc["storageStats"]["size"] == stats["size"]
    db_stats = client.admin_tests.command("dbStats")
    assert db_stats["db"] == "admin_tests" and db_stats["objects"] >= 5
    missing = client.admin_tests.command("collStats", "sized_other")
    assert (missing["count"], missing["size"]) == (0, 0)


# -- currentOp / $currentOp / $listLocalSessions -----------------------------------------------


def test_current_op_shows_a_command_in_progress(server, client):
    coll = _fresh(client, "slow")
    coll.insert_one({"x": 1})
    client.admin.command({
        "configureFailPoint": "failCommand", "mode": {"times": 1},
        "data": {"failCommands": ["find"], "blockConnection": True, "blockTimeMS": 3000,
                 "appName": "blocked-finder"},
    })
    done = threading.Event()
    with pymongo.MongoClient(server.direct_uri, appname="blocked-finder") as other:
        thread = threading.Thread(target=lambda: (list(other.admin_tests.slow.find({})),
                                                  done.set()))
        thread.start()
        try:
            found = []
            while not found and not done.is_set():
                ops = client.admin.command("currentOp")["inprog"]
                found = [op for op in ops if op.get("command", {}).get("find") == "slow"]
            if found:
                op = found[0]
                assert op["op"] == "query" and op["ns"] == "admin_tests.slow"
                assert op["active"] is True and op["clientMetadata"]["application"] == {
                    "name": "blocked-finder"}
                staged = list(client.admin.aggregate([
                    {"$currentOp": {}}, {"$match": {"command.find": "slow"}}]))
                assert [o["opid"] for o in staged] == [op["opid"]]
        finally:
            thread.join()
    assert found, "the blocked find never showed in currentOp"
    with pytest.raises(OperationFailure) as excinfo:
        list(client.admin_tests.aggregate([{"$currentOp": {}}]))
    assert excinfo.value.code == 73


@pytest.mark.parametrize("db,spec,code,message", [
    # mongod's lite parse: before the namespace check, 14 TypeMismatch
    ("admin_tests", 1, 14, "$currentOp options must be specified in an object, but found: int"),
    ("admin_tests", {"allUsers": 1}, 14,
     "The 'allUsers' parameter of the $currentOp stage must be a boolean value, but found: int"),
    ("admin", {"localOps": "x"}, 14, "The 'localOps' parameter of the $currentOp stage must "
     "be a boolean value, but found: string"),
    # then createFromBson: the namespace (73), the other options (9 FailedToParse)
    ("admin_tests", {"idleCursors": 1}, 73,
     "$currentOp must be run against the 'admin' database with {aggregate: 1}"),
    ("admin", {"idleCursors": 1}, 9, "The 'idleCursors' parameter of the $currentOp stage "
     "must be a boolean value, but found: int"),
    ("admin", {"bogus": True}, 9, "Unrecognized option 'bogus' in $currentOp stage."),
])
def test_current_op_stage_errors_in_mongods_order(client, db, spec, code, message):
    with pytest.raises(OperationFailure) as excinfo:
        list(client[db].aggregate([{"$currentOp": spec}]))
    assert (excinfo.value.code, excinfo.value.details["errmsg"]) == (code, message)


def test_list_local_sessions(client):
    with client.start_session() as session:
        client.admin_tests.command("ping", session=session)
        session_id = session.session_id["id"]
        sessions = list(client.admin.aggregate([{"$listLocalSessions": {}}]))
        assert session_id in [s["_id"]["id"] for s in sessions]
    with pytest.raises(OperationFailure) as excinfo:
        list(client.admin_tests.some.aggregate([{"$listLocalSessions": {}}]))
    assert excinfo.value.code == 73


# -- a recorded oplog (no embedded store) --------------------------------------------------------


def test_admin_commands_serving_a_recorded_oplog(tmp_path):
    from bson.timestamp import Timestamp

    path = write_oplog(tmp_path / "oplog.jsonl", [
        {"ts": Timestamp(1_700_000_000, 1), "t": Int64(1), "op": "n", "ns": "",
         "o": {"msg": "new primary"}, "wall": None, "v": Int64(2)},
    ])
    with ThreadServer([path], follow=False) as server, \
            pymongo.MongoClient(server.direct_uri) as client:
        parsed = client.admin.command("getCmdLineOpts")["parsed"]
        assert "storage" not in parsed and parsed["net"]["port"] == server.port
        params = client.admin.command("getParameter", "*")
        assert params["enableTestCommands"] is True
        assert "transactionLifetimeLimitSeconds" not in params  # no transactions here
        assert client.admin.command("replSetGetStatus")["members"][0]["stateStr"] == "PRIMARY"
        assert client.admin.command("serverStatus")["opcounters"]["command"] >= 1
        ops = list(client.admin.aggregate([{"$currentOp": {}}]))
        assert any(op["command"].get("aggregate") == 1 for op in ops)


# -- Stable API parameters ------------------------------------------------------------------------


def test_stable_api_parameters(server, client):
    from pymongo.server_api import ServerApi

    _fresh(client, "api").insert_one({"x": 1})
    with server.client(server_api=ServerApi("1", strict=True)) as strict:
        coll = strict.admin_tests.api
        assert coll.count_documents({}) == 1  # aggregate and count are in API version 1
        with strict.start_session() as session:
            with session.start_transaction():
                coll.insert_one({"x": 2}, session=session)
        with pytest.raises(OperationFailure) as excinfo:
            coll.distinct("x")
        assert excinfo.value.code == 323
        assert excinfo.value.details["codeName"] == "APIStrictError"
        assert excinfo.value.details["errmsg"].startswith(
            "Provided apiStrict:true, but the command distinct is not in API Version 1.")
        with pytest.raises(OperationFailure) as excinfo:
            list(strict.admin.aggregate([{"$listLocalSessions": {}}]))
        assert (excinfo.value.code, excinfo.value.details["errmsg"]) == (
            323, "$listLocalSessions is not allowed with 'apiStrict: true' in API Version 1")
    with pytest.raises(OperationFailure) as excinfo:
        client.admin.command({"ping": 1, "apiVersion": "server_will_never_support_this"})
    assert (excinfo.value.code, excinfo.value.details["errmsg"]) == (
        322, 'API version must be "1"')
    with pytest.raises(OperationFailure) as excinfo:
        client.admin.command({"ping": 1, "apiStrict": True})
    assert excinfo.value.code == 4886600
    assert client.admin_tests.command({"distinct": "api", "key": "x", "apiVersion": "1"})[
        "values"] == [1, 2]  # not strict: any command


def test_oplog_storage_statistics(server, client):
    """What mongosh's rs.printReplicationInfo() reads: local.oplog.rs's size and maxSize."""
    _fresh(client, "logged").insert_many([{"x": i} for i in range(3)])
    entries = server.call(server.store.oplog_entries)
    stats = client.local.command("collStats", "oplog.rs")
    assert (stats["count"], stats["capped"], stats["nindexes"]) == (len(entries), True, 0)
    assert stats["size"] == sum(len(raw) for raw in entries)
    assert stats["maxSize"] == server.store.oplog_size_bytes
    (doc,) = client.local["oplog.rs"].aggregate([{"$collStats": {"storageStats": {}}}])
    assert doc["storageStats"]["maxSize"] == stats["maxSize"]
    assert doc["storageStats"]["count"] == len(entries)
