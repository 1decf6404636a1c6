"""Other users' operations, sessions and cursors are shown or killed only with mongod 8.0's
privileges (issue 28, item 4): `$currentOp {allUsers: true}` and `currentOp` without
`$ownOps` need `inprog` (clusterMonitor, clusterAdmin, root); `$listLocalSessions` /
`$listSessions` of anyone else need `listSessions`; killing another user's session needs
`killAnySession`, another user's cursor `killAnyCursor` (hostManager, clusterAdmin, root);
`profile` needs `enableProfiler` (dbAdmin), reading `system.profile` find on it (dbAdmin,
clusterMonitor). Refusals are 13 Unauthorized with mongod's messages."""

from __future__ import annotations

import hashlib
import threading
from collections.abc import Iterator

import pymongo
import pytest
from bson.binary import Binary
from pymongo.errors import OperationFailure

from cdcserver import auth
from cdcserver.config import AuthConfig, Config, RoleConfig, UserConfig
from cdcserver.testing import EmbeddedServer

ROLES = {
    "owner": "readWrite@shop",  # runs the operations the others look at
    "reader": "readAnyDatabase",  # no inprog, no listSessions: the issue's user
    "dbadmin": "dbAdmin@shop",
    "monitor": "clusterMonitor",
    "host": "hostManager",
    "manager": "clusterManager",  # listSessions, but neither inprog nor any kill privilege
    "cadmin": "clusterAdmin",
    "root": "root",
}
SEES_ALL = ("monitor", "cadmin", "root")  # inprog and listSessions
SEES_OWN = ("reader", "dbadmin", "host")
KILLS_ANY = ("host", "cadmin", "root")  # killAnyCursor and killAnySession
KILLS_OWN = ("reader", "dbadmin", "monitor", "manager")


def _user(name: str, role: str) -> UserConfig:
    r, d = auth.parse_role(role)
    return UserConfig(user=name, db="admin", roles=[RoleConfig(role=r, db=d)],
                      scram_sha_256=auth.derive_credentials(auth.SCRAM_SHA_256, name,
                                                            f"{name}-pw", iterations=4096))


@pytest.fixture(scope="module")
def server() -> Iterator[EmbeddedServer]:
    users = [_user(n, r) for n, r in ROLES.items()]
    with EmbeddedServer(config=Config(auth=AuthConfig(enabled=True, users=users))) as s:
        yield s


@pytest.fixture(scope="module")
def clients(server: EmbeddedServer) -> Iterator[dict[str, pymongo.MongoClient]]:
    made = {n: pymongo.MongoClient(server.direct_uri, username=n, password=f"{n}-pw",
                                   serverSelectionTimeoutMS=5000) for n in ROLES}
    made["root"].shop.c.drop()
    made["root"].shop.create_collection("c")
    yield made
    for c in made.values():
        c.close()


def digest(user: str) -> bytes:
    return hashlib.sha256(f"{user}@admin".encode()).digest()


def refused(excinfo: pytest.ExceptionInfo[OperationFailure], prefix: str) -> None:
    err = excinfo.value
    assert err.code == 13, err.details
    assert err.details["codeName"] == "Unauthorized"
    assert err.details["errmsg"].startswith(prefix), err.details["errmsg"]


class WaitingGetMore:
    """The owner's change-stream getMore, waiting (awaitData) with a comment, until an insert
    wakes it."""

    COMMENT = "owner's secret comment"

    def __init__(self, clients: dict[str, pymongo.MongoClient]) -> None:
        self.clients = clients
        owner = clients["owner"]
        reply = owner.shop.command("aggregate", "c", pipeline=[{"$changeStream": {}}],
                                   cursor={})
        self.cursor_id = reply["cursor"]["id"]
        self.thread = threading.Thread(target=self._get_more)

    def _get_more(self) -> None:
        self.clients["owner"].shop.command("getMore", self.cursor_id, collection="c",
                                           maxTimeMS=60_000, comment=self.COMMENT)

    def __enter__(self) -> WaitingGetMore:
        self.thread.start()
        for _ in range(500):  # until root sees it in progress
            if any(self._is_it(op) for op in self.all_ops("root")):
                return self
            self.thread.join(0.01)
        raise AssertionError("the getMore never showed in $currentOp")

    def __exit__(self, *exc: object) -> None:
        self.clients["root"].shop.c.insert_one({})  # the event ends the getMore
        self.thread.join(30)
        self.clients["owner"].shop.command("killCursors", "c", cursors=[self.cursor_id])

    def _is_it(self, op: dict) -> bool:
        return op.get("command", {}).get("getMore") == self.cursor_id

    def all_ops(self, user: str) -> list[dict]:
        return list(self.clients[user].admin.aggregate([{"$currentOp": {"allUsers": True}}]))

    def seen_by(self, ops: list[dict]) -> list[dict]:
        return [op for op in ops if self._is_it(op)]


def test_current_op_stage_other_users_need_inprog(clients):
    with WaitingGetMore(clients) as waiting:
        for user in (*SEES_OWN, "manager"):
            with pytest.raises(OperationFailure) as excinfo:
                waiting.all_ops(user)
            refused(excinfo, "not authorized on admin to execute command { aggregate: 1, "
                             "pipeline: [ { $currentOp: { allUsers: true } } ]")
            own = list(clients[user].admin.aggregate([{"$currentOp": {}}]))
            assert waiting.seen_by(own) == []  # without allUsers: only one's own
            assert own and all(op["effectiveUsers"] == [{"user": user, "db": "admin"}]
                               for op in own if op["type"] == "op")
        for user in SEES_ALL:
            [op] = waiting.seen_by(waiting.all_ops(user))
            assert op["command"]["comment"] == WaitingGetMore.COMMENT
            assert op["effectiveUsers"] == [{"user": "owner", "db": "admin"}]
            assert op["op"] == "getmore"
            # allUsers: false shows the holder of inprog only their own, too
            mine = list(clients[user].admin.aggregate([{"$currentOp": {"allUsers": False}}]))
            assert waiting.seen_by(mine) == []
        # the owner sees their own getMore without any privilege
        owned = list(clients["owner"].admin.aggregate([{"$currentOp": {}}]))
        assert len(waiting.seen_by(owned)) == 1


def test_current_op_command_needs_inprog_or_own_ops(clients):
    with WaitingGetMore(clients) as waiting:
        for user in SEES_OWN:
            with pytest.raises(OperationFailure) as excinfo:
                clients[user].admin.command("currentOp")
            refused(excinfo, "not authorized on admin to execute command { currentOp: 1")
            own = clients[user].admin.command("currentOp", **{"$ownOps": True})["inprog"]
            assert waiting.seen_by(own) == []
            assert any(op.get("command", {}).get("currentOp") == 1 for op in own)
        for user in SEES_ALL:
            [op] = waiting.seen_by(clients[user].admin.command("currentOp")["inprog"])
            assert op["command"]["comment"] == WaitingGetMore.COMMENT
            own = clients[user].admin.command("currentOp", **{"$ownOps": 1})["inprog"]
            assert waiting.seen_by(own) == []
        owned = clients["owner"].admin.command("currentOp", **{"$ownOps": True})["inprog"]
        assert len(waiting.seen_by(owned)) == 1


def _uids(docs: list[dict]) -> set[bytes]:
    return {bytes(d["_id"]["uid"]) for d in docs}


@pytest.mark.parametrize("stage,db,coll", [("$listLocalSessions", "admin", None),
                                           ("$listSessions", "config", "system.sessions")])
def test_listing_other_users_sessions_needs_list_sessions(clients, stage, db, coll):
    clients["owner"].shop.c.find_one({})  # the owner's session is now known

    def listing(user: str, spec: dict) -> list[dict]:
        database = clients[user][db]
        target = database if coll is None else database[coll]
        return list(target.aggregate([{stage: spec}]))

    others = [{"user": "owner", "db": "admin"}]
    for user in SEES_OWN:
        for spec in ({"allUsers": True}, {"users": others},
                     {"users": [{"user": user, "db": "admin"}, *others]}):
            with pytest.raises(OperationFailure) as excinfo:
                listing(user, spec)
            refused(excinfo, f"not authorized on {db} to execute command {{ aggregate: ")
        assert _uids(listing(user, {})) <= {digest(user)}
        assert _uids(listing(user, {"users": [{"user": user, "db": "admin"}]})) <= {digest(user)}
        assert _uids(listing(user, {"users": []})) <= {digest(user)}  # [] : oneself
    for user in (*SEES_ALL, "manager"):
        assert digest("owner") in _uids(listing(user, {"allUsers": True}))
        assert _uids(listing(user, {"users": others})) == {digest("owner")}
        assert digest("owner") not in _uids(listing(user, {}))
    with pytest.raises(OperationFailure) as excinfo:
        listing("root", {"allUsers": True, "users": others})
    assert excinfo.value.code == 115
    assert excinfo.value.details["errmsg"] == (
        f"{stage} may not specify {{allUsers:true}} and {{users:[...]}} at the same time")


def test_list_sessions_runs_on_config_system_sessions_only(clients):
    with pytest.raises(OperationFailure) as excinfo:
        list(clients["root"].admin.aggregate([{"$listSessions": {}}]))
    assert excinfo.value.code == 73
    assert excinfo.value.details["errmsg"] == (
        "$listSessions must be run against the 'system.sessions' collection in the 'config' "
        "database.")


def test_killing_another_users_session_needs_kill_any_session(clients):
    owner = clients["owner"]
    for user in (*KILLS_OWN, *KILLS_ANY):
        with owner.start_session() as session:
            session.start_transaction()
            owner.shop.c.insert_one({"by": user}, session=session)
            lsid = {"id": session.session_id["id"], "uid": Binary(digest("owner"), 0)}
            if user in KILLS_ANY:
                assert clients[user].admin.command("killSessions", [lsid])["ok"] == 1.0
                with pytest.raises(OperationFailure) as excinfo:
                    session.commit_transaction()
                assert excinfo.value.code == 251  # NoSuchTransaction: it was killed
                continue
            with pytest.raises(OperationFailure) as excinfo:
                clients[user].admin.command("killSessions", [lsid])
            assert excinfo.value.code == 13
            assert excinfo.value.details["errmsg"] == (
                "Unauthorized to set user digest in LogicalSessionId")
            # without the uid the id names the caller's own session: the owner's lives on
            clients[user].admin.command("killSessions", [{"id": lsid["id"]}])
            session.commit_transaction()
    # one's own uid needs no privilege
    with clients["reader"].start_session() as mine:
        own = {"id": mine.session_id["id"], "uid": Binary(digest("reader"), 0)}
        assert clients["reader"].admin.command("killSessions", [own])["ok"] == 1.0


def test_killing_another_users_cursor_needs_kill_any_cursor(clients):
    owner = clients["owner"]
    owner.shop.c.insert_many([{} for _ in range(3)])
    for user in (*KILLS_OWN, *KILLS_ANY):
        cursor_id = owner.shop.command("find", "c", batchSize=1)["cursor"]["id"]
        assert cursor_id
        if user in KILLS_ANY:
            reply = clients[user].shop.command("killCursors", "c", cursors=[cursor_id])
            assert reply["cursorsKilled"] == [cursor_id]
            continue
        with pytest.raises(OperationFailure) as excinfo:
            clients[user].shop.command("killCursors", "c", cursors=[cursor_id])
        refused(excinfo, 'not authorized on shop to execute command { killCursors: "c", '
                         "cursors: [ ")
        assert owner.shop.command("killCursors", "c",
                                  cursors=[cursor_id])["cursorsKilled"] == [cursor_id]


def test_profiler_needs_enable_profiler_and_find_on_system_profile(clients):
    dbadmin, monitor = clients["dbadmin"], clients["monitor"]
    assert dbadmin.shop.command("profile", 2)["ok"] == 1.0
    clients["owner"].shop.c.find_one({"profiled": 1})
    try:
        docs = list(dbadmin.shop["system.profile"].find({"command.filter": {"profiled": 1}}))
        assert len(docs) == 1
        assert docs[0]["user"] == "owner@admin"
        assert len(list(monitor.shop["system.profile"].find({"command.filter":
                                                             {"profiled": 1}}))) == 1
        assert monitor.shop.command("profile", -1)["was"] == 2  # reading the level: find
        for user in ("owner", "reader", "host"):
            with pytest.raises(OperationFailure) as excinfo:
                list(clients[user].shop["system.profile"].find())
            refused(excinfo, 'not authorized on shop to execute command { find: '
                             '"system.profile"')
            with pytest.raises(OperationFailure) as excinfo:
                clients[user].shop.command("profile", -1)
            refused(excinfo, "not authorized on shop to execute command { profile: -1")
        for user in ("owner", "reader", "monitor", "host"):
            with pytest.raises(OperationFailure) as excinfo:
                clients[user].shop.command("profile", 0)
            refused(excinfo, "not authorized on shop to execute command { profile: 0")
        with pytest.raises(OperationFailure) as excinfo:
            monitor.shop.command("profile", -1, slowms=50)  # a change: enableProfiler
        refused(excinfo, "not authorized on shop to execute command { profile: -1, slowms: 50")
        with pytest.raises(OperationFailure) as excinfo:
            dbadmin.other.command("profile", 1)  # dbAdmin of shop only
        refused(excinfo, "not authorized on other to execute command { profile: 1")
    finally:
        assert dbadmin.shop.command("profile", 0)["was"] == 2
