"""Translated from mongodb/mongo `jstests/change_streams/resume_from_high_water_mark_token.js`
@ 134a4083953270e8a11430395357fb70a29047ad: a high-water-mark token (one taken before the
collection exists, or a later one) resumes like an event token; a resumed stream uses the
simple collation unless the aggregate gives one, never the collection's."""

from __future__ import annotations

from typing import Any

from cst import SOON_TRIES, ShellCursor, wo_compare

COLL = "resume_from_high_water_mark_token"
OTHER = "unrelated_" + COLL
MATCH_ONE_TWO = {"$match": {"$or": [{"fullDocument._id": "INSERT_ONE"},
                                    {"fullDocument._id": "INSERT_TWO"}]}}


def _aggregate(db: Any, stage: dict, *rest: Any, **extra: Any) -> ShellCursor:
    session = db.client.start_session()  # the cursor's, for its getMores too
    reply = db.command({"aggregate": COLL, "pipeline": [{"$changeStream": stage}, *rest],
                        "cursor": extra.pop("cursor", {}), **extra}, session=session)
    return ShellCursor(db[COLL], reply=reply, session=session)


# The jstest is one script; it is cut in two where it starts over with a new pre-creation
# high-water mark, so that the second half is checked on its own.
def test_pre_creation_high_water_mark_and_collation(client: Any) -> None:
    db = client["test"]
    db.drop_collection(COLL)
    db.drop_collection(OTHER)
    coll = db[COLL]

    def aggregate(stage: dict, *rest: Any, **extra: Any) -> ShellCursor:
        return _aggregate(db, stage, *rest, **extra)

    # A PBRT exists before the collection does.
    cs = aggregate({})
    pbrt_before = cs.get_resume_token()
    assert pbrt_before is not None
    cs.close()

    # resumeAfter and startAfter it while the collection does not exist.
    for resume_type in ("startAfter", "resumeAfter"):
        cs = aggregate({resume_type: pbrt_before}, MATCH_ONE_TWO)

    # Created with a case-insensitive collation, the resumed stream keeps the simple one.
    db.create_collection(COLL, collation={"locale": "en_US", "strength": 2})
    coll.insert_one({"_id": "insert_one"})
    coll.insert_one({"_id": "INSERT_TWO"})
    cs.soon_has_next()
    assert cs.next()["fullDocument"] == {"_id": "INSERT_TWO"}
    cs.close()

    cs = aggregate({"resumeAfter": pbrt_before}, MATCH_ONE_TWO)
    cs.soon_has_next()
    assert cs.next()["fullDocument"] == {"_id": "INSERT_TWO"}
    cs.close()

    # An explicit non-simple collation is adopted.
    cs = aggregate({"resumeAfter": pbrt_before}, MATCH_ONE_TWO,
                   collation={"locale": "en_US", "strength": 2})
    cs.soon_has_next()
    assert cs.next()["fullDocument"] == {"_id": "insert_one"}
    cs.soon_has_next()
    assert cs.next()["fullDocument"] == {"_id": "INSERT_TWO"}
    cs.close()

    cs = aggregate({}, cursor={"batchSize": 0})
    hwm_with_collation = cs.get_resume_token()
    assert hwm_with_collation is not None
    cs.close()
    coll.insert_one({"_id": "insert_three"})
    coll.insert_one({"_id": "INSERT_FOUR"})
    cs = aggregate({"resumeAfter": hwm_with_collation},
                   {"$match": {"$or": [{"fullDocument._id": "INSERT_THREE"},
                                       {"fullDocument._id": "INSERT_FOUR"}]}})
    cs.soon_has_next()
    assert cs.next()["fullDocument"] == {"_id": "INSERT_FOUR"}
    cs.close()



def test_high_water_marks_before_and_after_creation(client: Any) -> None:
    db = client["test"]
    db.drop_collection(COLL)
    db.drop_collection(OTHER)
    coll, other = db[COLL], db[OTHER]

    def aggregate(stage: dict, *rest: Any, **extra: Any) -> ShellCursor:
        return _aggregate(db, stage, *rest, **extra)

    # A new pre-creation high-water mark.
    db.drop_collection(COLL)
    cs = aggregate({})
    pbrt_before = cs.get_resume_token()
    assert pbrt_before is not None
    cs.close()

    db.create_collection(COLL)
    db.create_collection(OTHER)
    doc_id = 0
    cs = ShellCursor(coll)
    coll.insert_one({"_id": doc_id})
    doc_id += 1
    related = None
    hwm = None
    for _ in range(SOON_TRIES):
        other.insert_one({})
        if cs.has_next():
            related = cs.next()
        assert cs.objs_left_in_batch() == 0
        hwm = cs.get_resume_token()
        assert hwm is not None
        if related is not None and wo_compare(hwm, related["_id"]) > 0:
            break
    else:
        raise AssertionError("no high-water mark past the event")
    cs.close()

    for _ in range(5):
        coll.insert_one({"_id": doc_id})
        doc_id += 1

    # resumeAfter / startAfter the high-water mark: only the last 5 documents.
    for resume_type in ("startAfter", "resumeAfter"):
        cs = ShellCursor(coll, **{resume_type: hwm})
        for _ in range(SOON_TRIES):
            if cs.has_next():
                related = cs.next()
                assert wo_compare(related["_id"], hwm) > 0
                assert related["fullDocument"]["_id"] > 0
            if related["fullDocument"]["_id"] == doc_id - 1:
                break
        else:
            raise AssertionError("not every document seen")
        cs.close()

    def assert_sees_every_document(cursor: ShellCursor) -> None:
        count = 0
        for _ in range(SOON_TRIES):
            if cursor.has_next():
                event = cursor.next()
                assert event["fullDocument"]["_id"] == count
                count += 1
            if count == doc_id:
                return
        raise AssertionError(f"saw {count} of {doc_id} documents")

    # From the token taken before the collection was created: every event since.
    cs = aggregate({"resumeAfter": pbrt_before})
    assert_sees_every_document(cs)

    # Later high-water marks now carry the UUID: the PBRT advances on an unrelated write.
    hwm_post_creation = cs.get_resume_token()
    other.insert_one({})
    for _ in range(SOON_TRIES):
        assert not cs.has_next()
        if wo_compare(cs.get_resume_token(), hwm_post_creation) > 0:
            break
    else:
        raise AssertionError("the PBRT did not advance")
    hwm_post_creation = cs.get_resume_token()
    cs.close()

    # Resumable after a drop, after a re-creation (another UUID), with an explicit collation.
    db.drop_collection(COLL)
    aggregate({"resumeAfter": hwm_post_creation}).close()
    db.create_collection(COLL)
    aggregate({"resumeAfter": hwm_post_creation}).close()
    aggregate({"resumeAfter": hwm_post_creation}, collation={"locale": "simple"}).close()

    # Still resumable from the pre-creation mark: the first incarnation's events, then the
    # invalidate of its drop.
    cs = aggregate({"resumeAfter": pbrt_before})
    assert_sees_every_document(cs)
    for _ in range(SOON_TRIES):
        if cs.has_next() and cs.next()["operationType"] == "invalidate":
            break
    else:
        raise AssertionError("no invalidate")
