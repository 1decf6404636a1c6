"""Translated from mongodb/mongo `jstests/change_streams/delete_in_txn_produces_correct_doc_key.js`
@ 3e0ff89ff121d04bdb697eefb2e90cdb91f9ce9e: deletes in a multi-document transaction carry only
the documentKey (not the whole document), and a stream resumes after them."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest
from cst import ChangeStreamTest

DB = "test"
COLL = "delete_in_txn_produces_correct_doc_key"
NS = {"db": DB, "coll": COLL}


def _delete(_id: int) -> dict[str, Any]:
    return {"documentKey": {"_id": _id}, "ns": NS, "operationType": "delete"}


CASES: list[tuple[str, Callable[[Any, Any], Any], list[dict[str, Any]]]] = [
    ("deleteOne", lambda c, s: c.delete_one({"_id": 1}, session=s), [_delete(1)]),
    ("deleteMany", lambda c, s: c.delete_many({"a": 0, "_id": {"$gt": 0}}, session=s),
     [_delete(1), _delete(2), _delete(3)]),
    # findAndModify deletes only the first matching document.
    ("findAndModify", lambda c, s: c.find_one_and_delete({"a": 0}, sort=[("_id", 1)], session=s),
     [_delete(1)]),
]


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_delete_in_multi_doc_txn(client: Any, case: tuple) -> None:
    _, delete_command, expected = case
    db = client[DB]
    db.drop_collection(COLL)
    db.create_collection(COLL)
    coll = db[COLL]
    coll.insert_many([
        {"_id": 1, "a": 0, "fullDoc": "It's a full document!"},
        {"_id": 2, "a": 0}, {"_id": 3, "a": 0}, {"_id": 4, "a": 1},
    ])
    cst = ChangeStreamTest(db)
    cursor = cst.start_watching_changes([{"$changeStream": {}}], COLL)

    with client.start_session() as session:
        session.start_transaction()
        delete_command(coll, session)
        session.commit_transaction()

    changes = cst.assert_next_changes_equal(cursor, expected)

    # Resumable after a delete event from within the transaction.
    cursor = cst.start_watching_changes(
        [{"$changeStream": {"resumeAfter": changes[-1]["_id"]}}], COLL
    )
    coll.insert_one({"_id": 5})
    assert cst.get_one_change(cursor)["documentKey"] == {"_id": 5}
    cst.clean_up()
