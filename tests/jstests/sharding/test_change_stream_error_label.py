"""Translated from mongodb/mongo
`jstests/sharding/query/change_streams/change_stream_error_label.js` @
3c86964f0f9dd44d8264f1f9ada8e3275fa93fe0, its first part: with the mongos's
`failGetMoreAfterCursorCheckout` fail point set to a resumable code (ShutdownInProgress), a
change stream's getMore fails with it and the `ResumableChangeStreamError` label; with a
non-resumable one (FailedToParse), without any label.

Left out: the rest, an outage of shard0 (`st.rs0.stopSet()`) and the errors of the change
stream, find and aggregate cursors then: the embedded cluster's front reaches its shards in
process, so closing a shard's listener (`ShardedServer.restart_shard`) is no outage for it."""

from __future__ import annotations

import pytest

NAME = "change_stream_error_label"


@pytest.mark.parametrize(("code", "expected_label"), [(91, True), (9, False)],
                         ids=["ShutdownInProgress", "FailedToParse"])
def test_fail_get_more_after_cursor_checkout(st, code, expected_label):
    db = st.s[NAME]
    db.command({"create": "test"})
    st.s.admin.command({"configureFailPoint": "failGetMoreAfterCursorCheckout",
                        "mode": "alwaysOn", "data": {"errorCode": code}})
    try:
        reply = db.command({"aggregate": "test", "pipeline": [{"$changeStream": {}}],
                            "cursor": {}})
        # The raw reply (pymongo would raise ShutdownInProgress as a NotPrimaryError).
        details = db.command({"getMore": reply["cursor"]["id"], "collection": "test"},
                             check=False)
        assert details["ok"] == 0 and details["code"] == code, details
        assert ("errorLabels" in details) == expected_label, details
        assert ("ResumableChangeStreamError" in details.get("errorLabels", [])) == \
            expected_label, details
    finally:
        st.s.admin.command({"configureFailPoint": "failGetMoreAfterCursorCheckout",
                            "mode": "off"})
