"""Translated from mongodb/mongo `jstests/change_streams/collation_in_transaction.js` @
b49ada695bf64aef5ec39358d613d3f4b93f378b: a change stream's collation (the aggregate's, never
the collection's default) applies to the events unwound from a transaction, and never to the
namespace filter over the transaction's operations. One case per `it`; the `before` (two
collections with a case-insensitive default collation, names differing only in case) runs
for each, on its own server."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from cst import ChangeStreamTest
from pymongo import WriteConcern
from pymongo.read_concern import ReadConcern

CASE_INSENSITIVE = {"locale": "en_US", "strength": 2}
WATCHED = "change_stream_txn_case_insensitive"
SIMILAR = "cHaNgE_sTrEaM_tXn_cAsE_iNsEnSiTiVe"
PIPELINE = [
    {"$changeStream": {}},
    {"$match": {"fullDocument.text": "abc"}},
    {"$project": {"docId": "$documentKey._id"}},
]


def _in_transaction(client: Any, body: Callable[[Any, Any], None]) -> None:
    db = client["test"]
    with client.start_session(causal_consistency=False) as session:
        with session.start_transaction(read_concern=ReadConcern("snapshot"),
                                       write_concern=WriteConcern(w="majority")):
            body(db, session)


def _explicit_collation(client: Any, cst: ChangeStreamTest) -> None:
    stream = cst.start_watching_changes(PIPELINE, WATCHED, {"collation": CASE_INSENSITIVE})

    def body(db: Any, s: Any) -> None:
        db[WATCHED].insert_one({"_id": 0, "text": "aBc"}, session=s)
        db[WATCHED].insert_one({"_id": 1, "text": "abc"}, session=s)

    _in_transaction(client, body)
    cst.assert_next_changes_equal(stream, [{"docId": 0}, {"docId": 1}])


def _no_inherited_collation(client: Any, cst: ChangeStreamTest) -> None:
    stream = cst.start_watching_changes(PIPELINE, WATCHED)

    def body(db: Any, s: Any) -> None:
        db[WATCHED].insert_one({"_id": 2, "text": "aBc"}, session=s)
        db[WATCHED].insert_one({"_id": 3, "text": "abc"}, session=s)

    _in_transaction(client, body)
    cst.assert_next_changes_equal(stream, [{"docId": 3}])


def _namespace_filter_binary(client: Any, cst: ChangeStreamTest) -> None:
    stream = cst.start_watching_changes(PIPELINE, WATCHED, {"collation": CASE_INSENSITIVE})

    def body(db: Any, s: Any) -> None:
        db[SIMILAR].insert_one({"_id": 10, "text": "aBc"}, session=s)
        db[WATCHED].insert_one({"_id": 20, "text": "ABC"}, session=s)

    _in_transaction(client, body)
    cst.assert_next_changes_equal(stream, [{"docId": 20}])


@pytest.mark.parametrize("case", [
    pytest.param(_explicit_collation,
                 id="applies an explicit collation to change events generated from a "
                    "transaction"),
    pytest.param(_no_inherited_collation,
                 id="does not inherit the collection's default collation for change events"),
    pytest.param(_namespace_filter_binary,
                 id="does not apply the collation to the transaction namespace filter"),
])
def test_collation_in_transaction(client: Any, case: Callable[..., None]) -> None:
    db = client["test"]
    for name in (WATCHED, SIMILAR):
        db.drop_collection(name)
        db.create_collection(name, collation=CASE_INSENSITIVE)
    cst = ChangeStreamTest(db)
    case(client, cst)
    cst.clean_up()
