"""`$_internalChangeStreamCheckResumability`: skip to the resume point; history-lost check.

Events are compared with the client's token field by field as mongod's
`compareAgainstClientResumeToken` does (clusterTime, tokenType, txnOpIndex, fromInvalidate,
uuid, eventIdentifier, fragmentNum; never the version), not by `_data` bytes, because a stream
may emit a different token version than the client's token.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from bson.timestamp import Timestamp

from pipeline_stages import resume_token
from pipeline_stages.errors import MongoError
from pipeline_stages.resume_token import ResumeTokenData

HISTORY_LOST_MESSAGE = (
    "Resume of change stream was not possible, as the resume point may no longer be in the oplog."
)


def _identifier_key(data: ResumeTokenData) -> bytes:
    # KeyString bytes: equal <=> equal BSON values, and byte order = BSON order.
    return resume_token.identifier_keystring(data.event_identifier) or b""


def comparison_key(data: ResumeTokenData) -> tuple[Any, ...]:
    return (
        data.cluster_time,
        data.token_type,
        data.txn_op_index,
        data.from_invalidate,
        data.uuid or b"",
        _identifier_key(data),
        -1 if data.fragment_num is None else data.fragment_num,
    )


SPLIT_OF_RESUME_POINT = 2


def compare_to_client_token(event: ResumeTokenData, client: ResumeTokenData) -> int:
    """-1: the event is before the resume point; 0: it is the resume point; 1: after it;
    SPLIT_OF_RESUME_POINT: the unsplit event whose fragment the client resumes from (it must
    go on to $changeStreamSplitLargeEvent, which regenerates the fragments and skips those
    before the resume point)."""
    a, b = comparison_key(event), comparison_key(client)
    if a[:-1] == b[:-1] and event.fragment_num is None and client.fragment_num is not None:
        return SPLIT_OF_RESUME_POINT
    return (a > b) - (a < b)


def check_history(oldest: Mapping[str, Any] | None, start: Timestamp) -> None:
    """286 when the source's oldest entry is newer than `start` (the oplog rolled over), unless
    it is the very first entry of the replica set ("initiating set")."""
    if oldest is None or oldest["ts"] <= start:
        return
    o = oldest.get("o")
    if oldest.get("op") == "n" and isinstance(o, Mapping) and o.get("msg") == "initiating set":
        return
    raise MongoError(286, HISTORY_LOST_MESSAGE)


class CheckResumability:
    """Swallows events that sort before the client's token; passes everything after it.

    Events equal to an event token are passed on (EnsureResumeTokenPresent swallows them).
    """

    def __init__(self, client: ResumeTokenData | None) -> None:
        self.client = client
        self.passed = client is None

    def process(self, events: list[dict[str, Any]]) -> list[dict[str, Any]]:
        if self.passed:
            return events
        client = self.client
        assert client is not None
        out = []
        for i, event in enumerate(events):
            cmp = compare_to_client_token(resume_token.decode(event["_id"]), client)
            if cmp < 0:
                continue
            out.append(event)
            if cmp == 1:
                self.passed = True
                out.extend(events[i + 1 :])
                break
        return out
