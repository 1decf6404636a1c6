"""Translated from mongodb/mongo `jstests/change_streams/report_post_batch_resume_token.js` @
1471d6dfadf06fd8db47be942992b8a60c2eb764: the postBatchResumeToken of aggregate and getMore
replies (empty batches, a start in the future, events, unrelated writes, batches cut by size,
events of a transaction, a large token at the size limit).
(`cst.ShellCursor` is the shell's DBCommandCursor.)
"""

from __future__ import annotations

from typing import Any

import bson
from bson.timestamp import Timestamp
from cst import SOON_TRIES, ShellCursor, wo_compare

COLL = "report_post_batch_resume_token"
OTHER = "unrelated_" + COLL
BATCH_SIZE = 2


def test_report_post_batch_resume_token(client: Any) -> None:
    db = client["test"]
    for name in (COLL, OTHER):
        db.drop_collection(name)
        db.create_collection(name)
    coll, other = db[COLL], db[OTHER]
    doc_id = 0

    # Present on an initial aggregate of batchSize 0.
    cs = ShellCursor(coll, batch_size=0)
    assert cs.objs_left_in_batch() == 0
    assert cs.get_resume_token() is not None

    # A stream starting in the future: the PBRT neither advances nor goes back.
    cs = ShellCursor(coll, startAtOperationTime=Timestamp(4102444800, 1))
    assert cs.objs_left_in_batch() == 0
    initial = cs.get_resume_token()
    assert initial is not None
    for _ in range(5):
        assert not cs.has_next()
        assert wo_compare(initial, cs.get_resume_token()) == 0
        coll.insert_one({"_id": doc_id})
        doc_id += 1

    # Present on an empty initial batch, and on an empty getMore batch.
    cs = ShellCursor(coll)
    assert cs.objs_left_in_batch() == 0
    initial = cs.get_resume_token()
    assert initial is not None
    assert not cs.has_next()
    get_more = cs.get_resume_token()
    assert get_more is not None
    assert wo_compare(get_more, initial) >= 0

    # Advances with returned events: equal to the token of the batch's last event.
    coll.insert_one({"_id": doc_id})
    doc_id += 1
    cs.soon_has_next()
    assert cs.objs_left_in_batch() == 1
    token_from_doc = cs.next()["_id"]
    get_more = cs.get_resume_token()
    assert wo_compare(get_more, token_from_doc) == 0
    assert wo_compare(get_more, initial) > 0

    for _ in range(BATCH_SIZE * 2):
        coll.insert_one({"_id": doc_id})
        doc_id += 1

    # A resumed stream's PBRT is the resume token while nothing is returned.
    cs = ShellCursor(coll, batch_size=0, resumeAfter=token_from_doc)
    assert cs.objs_left_in_batch() == 0
    initial = cs.get_resume_token()
    assert wo_compare(initial, token_from_doc) == 0

    # It advances with getMore: equal to the last token of the batch.
    cs.soon_has_next()
    event = None
    while cs.objs_left_in_batch():
        event = cs.next()
        token_from_doc = event["_id"]
    assert event is not None
    get_more = cs.get_resume_token()
    assert wo_compare(token_from_doc, get_more) == 0
    assert wo_compare(get_more, initial) > 0

    # It advances with writes to an unrelated collection.
    while event["fullDocument"]["_id"] < doc_id - 1:
        cs.soon_has_next()
        event = cs.next()
    assert not cs.has_next()
    previous = cs.get_resume_token()
    assert previous is not None
    other.insert_one({"_id": doc_id})
    for _ in range(SOON_TRIES):
        assert not cs.has_next()
        get_more = cs.get_resume_token()
        if wo_compare(get_more, previous) > 0:
            break
    else:
        raise AssertionError("the PBRT did not advance")

    # Two documents of the maximum size: one event per batch, tokens in order.
    limit = client.admin.command("hello")["maxBsonObjectSize"]
    assert limit > 0
    for _ in range(2):
        doc: dict[str, Any] = {"_id": doc_id, "padding": ""}
        doc["padding"] = "a" * (limit - len(bson.encode(doc)))
        coll.insert_one(doc)
        doc_id += 1
    cs.soon_has_next()
    assert cs.objs_left_in_batch() == 1
    token_from_doc = cs.next()["_id"]
    get_more = cs.get_resume_token()
    previous = get_more
    cs.soon_has_next()
    assert cs.objs_left_in_batch() == 1
    token_from_second = cs.next()["_id"]
    get_more = cs.get_resume_token()
    assert wo_compare(previous, token_from_doc) >= 0
    assert wo_compare(token_from_second, previous) > 0
    assert wo_compare(get_more, token_from_second) >= 0

    # Events of a transaction: 3 in this collection, 1 in the unrelated one.
    with client.start_session() as session:
        session.start_transaction()
        for _ in range(3):
            coll.insert_one({"_id": doc_id}, session=session)
            doc_id += 1
        other.insert_one({"_id": doc_id}, session=session)
        session.commit_transaction()

    previous = get_more
    cs = ShellCursor(coll, batch_size=BATCH_SIZE, resumeAfter=previous)
    cs.soon_has_next()
    assert cs.objs_left_in_batch() == 2
    txn1, txn2 = cs.next(), cs.next()
    assert txn2["clusterTime"] == txn1["clusterTime"]
    assert wo_compare(txn1["_id"], previous) > 0
    assert wo_compare(txn2["_id"], txn1["_id"]) > 0
    # More of the transaction to come: the PBRT is the batch's last token.
    get_more = cs.get_resume_token()
    assert wo_compare(get_more, txn2["_id"]) == 0

    previous = get_more
    cs.soon_has_next()
    assert cs.objs_left_in_batch() == 1
    txn3 = cs.next()
    assert txn3["clusterTime"] == txn1["clusterTime"]
    assert wo_compare(txn3["_id"], previous) > 0
    get_more = cs.get_resume_token()
    assert wo_compare(get_more, txn3["_id"]) >= 0

    # A batch with a large post-batch resume token does not exceed the limit.
    cs = ShellCursor(coll)
    second = 80 * 1024
    first = int(16 * 1024 * 1024 - 4.5 * second)
    coll.insert_many([{"a": "x" * first}, {"_id": "x" * second}])
    cs.has_next()  # must not raise
