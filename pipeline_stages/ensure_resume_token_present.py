"""`$_internalChangeStreamEnsureResumeTokenPresent`: the resumed-from event must be seen.

Only for streams resumed from an event token (not a high-water mark). The event equal to the
token is swallowed; if the stream passes the token's position without having seen it, the
stream fails with 280, quoting the `_id` of the first event after the resume point.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypeVar

from pipeline_stages import resume_token
from pipeline_stages.check_resumability import SPLIT_OF_RESUME_POINT, compare_to_client_token
from pipeline_stages.errors import MongoError
from pipeline_stages.resume_token import ResumeTokenData
from pipeline_stages.value_string import document_string

# An event: a dict out of the pipeline's stages, or a RawBSONDocument (a front's merged shards).
Event = TypeVar("Event", bound=Mapping[str, Any])


class EnsureResumeTokenPresent:
    def __init__(self, client: ResumeTokenData) -> None:
        self.client = client
        self.found = False
        self.done = False
        # Resuming from a fragment: the split stage regenerates the resumed event's fragments
        # from the client's one on, and this stage (after it in mongod's optimized pipeline)
        # must see that fragment first and swallow it (`after_split`).
        self.awaiting_fragment = False

    def process(self, events: list[Event]) -> list[Event]:
        if self.done:
            return events
        out: list[Event] = []
        for i, event in enumerate(events):
            cmp = compare_to_client_token(resume_token.decode(event["_id"]), self.client)
            if cmp == SPLIT_OF_RESUME_POINT:  # the split stage drops the fragments before it
                self.found = self.done = True
                self.awaiting_fragment = True
                out.extend(events[i:])
                break
            if cmp <= 0:  # the resume point itself (or a duplicate of it)
                self.found = self.found or cmp == 0
                continue
            if not self.found:
                raise MongoError(
                    280,
                    "cannot resume stream; the resume token was not found. "
                    + document_string(event["_id"]),
                )
            self.done = True
            out.extend(events[i:])
            break
        return out

    def after_split(self, events: list[Any]) -> list[Any]:
        """The events out of $changeStreamSplitLargeEvent: when resuming from a fragment, the
        first must be the client's fragment (swallowed); anything else means the resumed
        pipeline split the event differently, or filtered it out: 280."""
        if not self.awaiting_fragment or not events:
            return events
        self.awaiting_fragment = False
        first = events[0]
        if compare_to_client_token(resume_token.decode(first["_id"]), self.client) == 0:
            return events[1:]
        raise MongoError(
            280, "cannot resume stream; the resume token was not found. "
            + document_string(first["_id"]),
        )
