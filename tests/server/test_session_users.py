"""With authentication on, a logical session is `{id, uid}`, `uid` the SHA-256 of the
authenticated "user@db" (mongod's getLogicalSessionUserDigestForLoggedInUser): the same
`lsid.id` sent by another user is another session, so nobody commits, aborts, extends or reads
another user's transaction (issue 13, item 3). commitTransaction and abortTransaction need no
privilege (as in mongod): the separation is the session's. Oplog entries and change events
carry the lsid as mongod writes it, with the uid."""

from __future__ import annotations

import hashlib

import pymongo
import pytest
from bson.binary import Binary
from bson.int64 import Int64
from pymongo.errors import OperationFailure

from cdcserver import auth
from cdcserver.config import AuthConfig, Config, RoleConfig, UserConfig
from cdcserver.testing import EmbeddedServer


def make_user(name: str, password: str, *roles: str) -> UserConfig:
    parsed = [auth.parse_role(r) for r in roles]
    return UserConfig(
        user=name, db="admin", roles=[RoleConfig(role=r, db=d) for r, d in parsed],
        scram_sha_256=auth.derive_credentials(auth.SCRAM_SHA_256, name, password,
                                              iterations=4096),
    )


USERS = [
    make_user("alice", "a-pass", "readWrite@shop"),
    make_user("bob", "b-pass", "read@other"),  # only read, on another database
    make_user("carol", "c-pass", "readWrite@shop"),  # the same privileges as alice
    make_user("admin", "root-pass", "root"),
]


@pytest.fixture(scope="module")
def server():
    with EmbeddedServer(config=Config(auth=AuthConfig(enabled=True, users=USERS))) as s:
        yield s


@pytest.fixture
def clients(server):
    made = {}
    for user in ("alice", "bob", "carol", "admin"):
        made[user] = pymongo.MongoClient(
            server.direct_uri, username=user, password=f"{user[0]}-pass"
            if user != "admin" else "root-pass", serverSelectionTimeoutMS=5000,
        )
    made["admin"].shop.c.drop()
    made["admin"].shop.create_collection("c")  # not created inside anyone's transaction
    yield made
    for c in made.values():
        c.close()


def session_as(client: pymongo.MongoClient, lsid: dict):
    """A session of `client` sending `lsid` (the driver's session object, its id replaced)."""
    s = client.start_session()
    s.session_id  # noqa: B018  (materializes the server session)
    s._server_session.session_id = dict(lsid)
    s._server_session.mark_dirty()  # never back to the driver's pool of sessions
    return s


def digest(user: str) -> bytes:
    return hashlib.sha256(f"{user}@admin".encode()).digest()  # BinData 0 decodes as bytes


def test_another_user_cannot_commit_abort_extend_or_read_a_transaction(clients):
    alice, bob, carol = clients["alice"], clients["bob"], clients["carol"]
    with alice.start_session() as mine:
        mine.start_transaction()
        alice.shop.c.insert_one({"_id": 1}, session=mine)
        number = mine._server_session.transaction_id
        theirs = {"id": mine.session_id["id"]}
        in_txn = {"txnNumber": Int64(number), "autocommit": False}
        for other in (bob, carol):
            s = session_as(other, theirs)
            for name in ("commitTransaction", "abortTransaction"):
                with pytest.raises(OperationFailure) as info:
                    other.admin.command({name: 1, **in_txn}, session=s)
                assert info.value.code == 251, name  # no such transaction in their session
            s.end_session()
        s = session_as(carol, theirs)
        with pytest.raises(OperationFailure) as info:  # read her uncommitted write
            carol.shop.command({"find": "c", **in_txn}, session=s)
        assert info.value.code == 251
        with pytest.raises(OperationFailure) as info:  # add a write to her transaction
            carol.shop.command({"insert": "c", "documents": [{"_id": "carol"}], **in_txn},
                               session=s)
        assert info.value.code == 251
        # the same id and number starting a transaction: carol's own, beside alice's
        carol.shop.command({"insert": "c", "documents": [{"_id": "carol"}],
                            "startTransaction": True, **in_txn}, session=s)
        carol.admin.command({"abortTransaction": 1, **in_txn}, session=s)
        s.end_session()
        assert carol.shop.c.find_one({"_id": 1}) is None  # still uncommitted
        alice.shop.c.insert_one({"_id": 2}, session=mine)  # her transaction goes on
        mine.commit_transaction()
    assert sorted(d["_id"] for d in carol.shop.c.find()) == [1, 2]


def test_a_client_uid_needs_impersonation(clients):
    alice, admin = clients["alice"], clients["admin"]
    with alice.start_session() as s:
        s.session_id  # noqa: B018
        s._server_session.session_id = {"id": s.session_id["id"], "uid": Binary(digest("carol"), 0)}
        with pytest.raises(OperationFailure) as info:
            alice.shop.command({"find": "c"}, session=s)
        assert info.value.code == 13
        assert info.value.details["errmsg"] == (
            "Unauthorized to set user digest in LogicalSessionId")
    with admin.start_session() as s:  # root may impersonate
        s.session_id  # noqa: B018
        s._server_session.session_id = {"id": s.session_id["id"], "uid": digest("carol")}
        s._server_session.mark_dirty()
        assert admin.shop.command({"find": "c"}, session=s)["ok"] == 1.0


def test_oplog_and_change_events_carry_the_users_digest(clients):
    alice, admin = clients["alice"], clients["admin"]
    with admin.shop.c.watch() as stream:
        with alice.start_session() as s:
            s.start_transaction()
            alice.shop.c.insert_one({"_id": "t"}, session=s)
            s.commit_transaction()
            lsid = {"id": s.session_id["id"], "uid": digest("alice")}
            alice.shop.c.insert_one({"_id": "r"}, session=s)  # a retryable write
        events = [stream.next(), stream.next()]
    assert events[0]["documentKey"] == {"_id": "t"} and events[0]["lsid"] == lsid
    assert events[0]["txnNumber"] == Int64(1)
    entries = list(admin.local.oplog.rs.find({"lsid.id": lsid["id"]}))
    assert [e["lsid"] for e in entries] == [lsid, lsid]
    assert events[1]["documentKey"] == {"_id": "r"}


def test_ending_sessions_reaches_only_the_users_own(clients):
    alice, bob, carol, admin = (clients[u] for u in ("alice", "bob", "carol", "admin"))

    def open_txn(client, doc_id):
        s = client.start_session()
        s.start_transaction()
        client.shop.c.insert_one({"_id": doc_id}, session=s)
        return s

    def committed(client, s) -> bool:
        try:
            s.commit_transaction()
            return True
        except OperationFailure as err:
            assert err.code == 251
            return False
        finally:
            s.end_session()

    mine, hers = open_txn(alice, "a1"), open_txn(carol, "c1")
    for command in ("endSessions", "killSessions"):  # alice's id from bob: bob's session
        bob.admin.command({command: [{"id": mine.session_id["id"]}]})
    with pytest.raises(OperationFailure) as info:
        bob.admin.command({"killSessions": [{"id": mine.session_id["id"],
                                             "uid": Binary(digest("alice"), 0)}]})
    assert info.value.code == 13  # naming another user's session needs killAnySession
    with pytest.raises(OperationFailure) as info:
        alice.admin.command({"killAllSessions": []})
    assert info.value.code == 13
    assert committed(alice, mine) and committed(carol, hers)

    mine, hers = open_txn(alice, "a2"), open_txn(carol, "c2")
    alice.admin.command({"killSessions": []})  # all of alice's sessions, only hers
    assert not committed(alice, mine) and committed(carol, hers)

    mine, hers = open_txn(alice, "a3"), open_txn(carol, "c3")
    admin.admin.command({"killAllSessions": [{"user": "carol", "db": "admin"}]})
    assert committed(alice, mine) and not committed(carol, hers)
    assert sorted(d["_id"] for d in admin.shop.c.find()) == ["a1", "a3", "c1", "c2"]
