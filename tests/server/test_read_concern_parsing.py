"""A command's `readConcern`, parsed as mongod 8.0 parses it before the command runs
(read_concern_args.cpp: `initialize` wants a document, 9 FailedToParse "readConcern field should
be an object"; then its IDL ReadConcernIdl, whose `level` is an enum: 14 TypeMismatch for a level
that is not a string, 2 BadValue "Enumeration value '<level>' for field 'readConcern.level' is
not a valid value." for one mongod does not have).
"""

from __future__ import annotations

import pytest
from pymongo.errors import OperationFailure
from pymongo.read_concern import ReadConcern


@pytest.fixture
def coll(client):
    c = client.rc_parsing.c
    c.drop()
    c.insert_one({"_id": 1})
    yield c
    client.drop_database("rc_parsing")


def _error(db, cmd) -> tuple[int, str, str]:
    with pytest.raises(OperationFailure) as info:
        db.command(cmd)
    return info.value.code, info.value.details["codeName"], info.value.details["errmsg"]


def test_unknown_level_through_pymongo(coll) -> None:
    bad = coll.with_options(read_concern=ReadConcern("bogus"))
    for read in (lambda: bad.find_one(), lambda: list(bad.aggregate([])),
                 lambda: bad.count_documents({}), lambda: bad.distinct("_id")):
        with pytest.raises(OperationFailure) as info:
            read()
        assert (info.value.code, info.value.details["codeName"],
                info.value.details["errmsg"]) == (
            2, "BadValue",
            "Enumeration value 'bogus' for field 'readConcern.level' is not a valid value.")


def test_level_of_the_wrong_type(coll) -> None:
    assert _error(coll.database, {"find": "c", "readConcern": {"level": 1}}) == (
        14, "TypeMismatch",
        "BSON field 'readConcern.level' is the wrong type 'int', expected type 'string'")


def test_not_a_document(coll) -> None:
    assert _error(coll.database, {"find": "c", "readConcern": "majority"}) == (
        9, "FailedToParse", "readConcern field should be an object")


@pytest.mark.parametrize("level", ["local", "majority", "available", "linearizable"])
def test_every_level_mongod_has_is_taken(coll, level) -> None:
    reply = coll.database.command({"find": "c", "readConcern": {"level": level}})
    assert reply["cursor"]["firstBatch"] == [{"_id": 1}]
    assert coll.database.command({"find": "c", "readConcern": {}})["ok"] == 1.0
