"""Write concern on the embedded store, as a single-member replica-set primary takes it."""

from __future__ import annotations

import pytest
from pymongo import errors
from pymongo.write_concern import WriteConcern


@pytest.fixture
def db(server):
    c = server.client()
    yield c.wc
    c.drop_database("wc")
    c.close()


@pytest.mark.parametrize("wc", [{"w": 1}, {"w": "majority"}, {"w": 1, "j": True},
                                {"w": "majority", "wtimeout": 100}, {"j": False}])
def test_satisfiable_write_concerns(db, wc):
    reply = db.command({"insert": "c", "documents": [{"a": 1}], "writeConcern": wc})
    assert reply["n"] == 1 and "writeConcernError" not in reply


def test_more_members_than_the_set_has(db):
    reply = db.command({"insert": "c", "documents": [{"_id": 1}], "writeConcern": {"w": 2}})
    assert reply["ok"] == 1 and reply["n"] == 1  # the write is applied
    assert reply["writeConcernError"] == {
        "code": 100, "codeName": "UnsatisfiableWriteConcern",
        "errmsg": "Not enough data-bearing nodes",
        "errInfo": {"writeConcern": {"w": 2, "wtimeout": 0, "provenance": "clientSupplied"}},
    }
    assert db.c.find_one({"_id": 1}) == {"_id": 1}
    with pytest.raises(errors.WriteConcernError) as info:
        db.get_collection("c", write_concern=WriteConcern(w=3)).insert_one({"_id": 2})
    assert info.value.code == 100


def test_unknown_tag(db):
    reply = db.command({"delete": "c", "deletes": [{"q": {}, "limit": 0}],
                        "writeConcern": {"w": "dc2"}})
    assert reply["writeConcernError"]["code"] == 79
    assert reply["writeConcernError"]["codeName"] == "UnknownReplWriteConcern"
    assert reply["writeConcernError"]["errmsg"] == (
        "No write concern mode named 'dc2' found in replica set configuration"
    )


@pytest.mark.parametrize(
    ("wc", "errmsg"),
    [
        ({"w": -1}, "w has to be a non-negative number and not greater than 50; found: -1"),
        ({"w": 51}, "w has to be a non-negative number and not greater than 50; found: 51"),
        ({"w": True}, "w has to be a number or string"),
        ({"j": "yes"}, "j must be numeric or a boolean value"),
    ],
)
def test_malformed_write_concern_fails_the_command(db, wc, errmsg):
    with pytest.raises(errors.OperationFailure) as info:
        db.command({"insert": "c", "documents": [{"_id": 9}], "writeConcern": wc})
    assert (info.value.code, info.value.details["codeName"]) == (9, "FailedToParse")
    assert info.value.details["errmsg"] == errmsg
    assert db.c.find_one({"_id": 9}) is None


def test_unacknowledged_writes_are_applied(db, server):
    coll = db.get_collection("u", write_concern=WriteConcern(w=0))
    result = coll.insert_one({"_id": 1})
    assert not result.acknowledged
    coll.update_one({"_id": 1}, {"$set": {"a": 1}})
    # a later acknowledged command on the same connection runs after them
    assert db.u.find_one() == {"_id": 1, "a": 1}


def test_find_and_modify_and_update_carry_it(db):
    db.c.insert_one({"_id": 5, "a": 1})
    reply = db.command({"findAndModify": "c", "query": {"_id": 5}, "update": {"$inc": {"a": 1}},
                        "writeConcern": {"w": 2}})
    assert reply["value"] == {"_id": 5, "a": 1} and reply["writeConcernError"]["code"] == 100
    reply = db.command({"update": "c", "updates": [{"q": {"_id": 5}, "u": {"$inc": {"a": 1}}}],
                        "writeConcern": {"w": 2}})
    assert reply["nModified"] == 1 and reply["writeConcernError"]["code"] == 100
