"""Translated from mongodb/mongo `jstests/change_streams/generate_v1_resume_token.js` @
49395d449c33b1201fb57f4a4f2aca8278c36a5b: the aggregate's `$_generateV2ResumeTokens: false`
makes a stream return v1 tokens where the default is v2; the events are otherwise the same."""

from __future__ import annotations

from typing import Any

from cst import ShellCursor

from pipeline_stages import resume_token

COLL = "generate_v1_resume_token"


def _watch(db: Any, **aggregate_options: Any) -> ShellCursor:
    # The shell's watch() puts options it does not know into the aggregate command.
    session = db.client.start_session()  # the cursor's, for its getMores too
    reply = db.command({"aggregate": COLL, "pipeline": [{"$changeStream": {}}], "cursor": {},
                        **aggregate_options}, session=session)
    return ShellCursor(db[COLL], reply=reply, session=session)


def test_generate_v1_resume_token(client: Any) -> None:
    db = client["test"]
    db.drop_collection(COLL)
    db.create_collection(COLL)
    v2_stream = _watch(db)
    v1_stream = _watch(db, **{"$_generateV2ResumeTokens": False})
    db[COLL].insert_one({"_id": 1})

    v1_stream.soon_has_next()
    v2_stream.soon_has_next()
    v1_event = v1_stream.next()
    v2_event = v2_stream.next()
    v1_token = v1_event.pop("_id")
    v2_token = v2_event.pop("_id")
    assert v1_event == v2_event
    assert v1_token != v2_token
    # (beyond the jstest: the versions are the ones asked for)
    assert resume_token.decode(v1_token).version == 1
    assert resume_token.decode(v2_token).version == 2
    v1_stream.close()
    v2_stream.close()
