"""`$changeStreamSplitLargeEvent` (reference oplog_to_events.md §8;
`document_source_change_stream_split_large_event.cpp`, `change_stream_split_event_helpers.cpp`).

An event whose BSON size is above 16 MiB + 16 KiB - 8 KiB is cut into fragments: every field but
`_id`, sorted by (BSON element size, field name), packed greedily; each fragment is
`{_id: <the event's token + fragmentNum>, splitEvent: {fragment: i, of: n}, <fields>}` and is
measured, as mongod measures it, with its `$sortKey` metadata (`[token]`) included. The space
left for fields is the threshold minus the size of the event's resume-token document, so that
a fragment plus a post-batch resume token fits a reply.

Resuming from a fragment token: the stage regenerates the split of the resumed event and drops
the fragments before the token's (it must be given the client's token, `resume_after`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from pipeline_stages import bson_bytes, resume_token
from pipeline_stages.check_resumability import SPLIT_OF_RESUME_POINT, compare_to_client_token
from pipeline_stages.errors import MongoError
from pipeline_stages.resume_token import ResumeTokenData
from pipeline_stages.transform import MISSING
from pipeline_stages.value_string import bson_obj_string

# DocumentSourceChangeStreamSplitLargeEvent::kBSONObjMaxChangeEventSize:
# BSONObjMaxInternalSize (16 MiB + 16 KiB) - 8 KiB.
MAX_CHANGE_EVENT_SIZE = 16 * 1024 * 1024 + 16 * 1024 - 8 * 1024

NOT_LARGE_ENOUGH_MESSAGE = (
    "Attempted to resume from a split event fragment, but the event in the resumed stream was "
    "not large enough to be split"
)
DIFFERENT_SPLIT_MESSAGE = (
    "Attempted to resume from a split event, but the resumed stream produced a different split. "
    "Ensure that the pipeline used to resume is the same as the original"
)

_ELEMENT_OVERHEAD = 5  # a one-field document's size minus its element's size

# BSONObjMaxInternalSize: the largest document mongod builds; a change event above it (one
# without $changeStreamSplitLargeEvent) fails the cursor with BSONObjectTooLarge.
BSON_OBJ_MAX_INTERNAL_SIZE = 16 * 1024 * 1024 + 16 * 1024


def check_event_size(raw: bytes, event: Mapping[str, Any]) -> None:
    """10334 as BSONObj's size check words it when an encoded event is over the limit."""
    size = len(raw)
    if size <= BSON_OBJ_MAX_INTERNAL_SIZE:
        return
    first = next(((k, v) for k, v in event.items() if v is not MISSING), None)
    element = f" First element: {first[0]}: {bson_obj_string(first[1])}" if first else ""
    raise MongoError(
        10334,
        f"BSONObj size: {size} (0x{size:X}) is invalid. Size must be between 0 and "
        f"{BSON_OBJ_MAX_INTERNAL_SIZE}(16MB){element}",
    )


def element_size(name: str, value: Any) -> int:
    """The BSON size of the element `name: value`."""
    return len(bson_bytes.encode({name: value})) - _ELEMENT_OVERHEAD


def _fields(event: Mapping[str, Any]) -> list[tuple[str, Any]]:
    return [(k, v) for k, v in event.items() if v is not MISSING]


def bson_size(event: Mapping[str, Any]) -> int:
    """The event's BSON size (MISSING slots are not part of it)."""
    if any(v is MISSING for v in event.values()):
        event = dict(_fields(event))
    return len(bson_bytes.encode(event))


def _fragment_base_size(token: Mapping[str, Any], fragment: int) -> int:
    """`{_id: token, splitEvent: {fragment, of: 0}}` with its `$sortKey: [token]` metadata."""
    return len(
        bson_bytes.encode(
            {"_id": token, "splitEvent": {"fragment": fragment, "of": 0}, "$sortKey": [token]}
        )
    )


def split_change_event(
    event: Mapping[str, Any],
    max_fragment_size: int,
    skip_first: int = 0,
    token: Mapping[str, Any] | None = None,
) -> list[dict[str, Any]]:
    """`change_stream_split_event::splitChangeEvent`: the fragments of `event` (all of them, less
    the first `skip_first`). `token`: the event's resume token (default: its `_id`)."""
    fields = [(k, v) for k, v in _fields(event) if k != "_id"]
    # (element size, name) orders the fields; std::string compares bytes, as UTF-8 order does.
    sized = sorted(
        ((element_size(k, v), bson_bytes.utf8(k), k, v) for k, v in fields), key=lambda f: f[:2]
    )
    if not sized:
        raise MongoError(
            7182502, "Cannot split an empty event or an event containing solely '_id' field"
        )
    data = resume_token.decode(token if token is not None else event["_id"])

    fragments: list[dict[str, Any]] = []
    i = 0
    while i < len(sized):
        data.fragment_num = len(fragments)
        fragment_token = data.to_document()
        number = len(fragments) + 1
        fragment: dict[str, Any] = {
            "_id": fragment_token,
            "splitEvent": {"fragment": number, "of": 0},
        }
        size = _fragment_base_size(fragment_token, number)
        while True:
            field_size, _, name, value = sized[i]
            fragment[name] = value
            size += field_size
            i += 1
            if i == len(sized) or size + sized[i][0] > max_fragment_size:
                break
        if size > max_fragment_size:
            raise MongoError(
                7182500,
                f"Splitting change event failed: fragment size {size} is greater than maximum "
                f"allowed fragment size {max_fragment_size}",
            )
        fragments.append(fragment)
    total = len(fragments)
    for fragment in fragments:
        fragment["splitEvent"]["of"] = total
    return fragments[skip_first:]


# -- resuming from a fragment -------------------------------------------------------------------

CHECK_NEXT, NEEDS_SPLIT, FOUND, SURPASSED = "check_next", "needs_split", "found", "surpassed"


def resume_status(event: ResumeTokenData, client: ResumeTokenData) -> str:
    """`compareAgainstClientResumeToken`: where `event` stands relative to the client's token."""
    return _STATUS[compare_to_client_token(event, client)]


_STATUS = {-1: CHECK_NEXT, 0: FOUND, 1: SURPASSED, SPLIT_OF_RESUME_POINT: NEEDS_SPLIT}


class SplitLargeEvent:
    """`$changeStreamSplitLargeEvent`. `resume_after`: the client's resume token (decoded or as a
    document); only a fragment token (one with `fragmentNum`) changes anything."""

    def __init__(self, resume_after: ResumeTokenData | Mapping[str, Any] | None = None) -> None:
        if resume_after is not None and not isinstance(resume_after, ResumeTokenData):
            resume_after = resume_token.decode(resume_after)
        self._resume_after_split = (
            resume_after
            if resume_after is not None and resume_after.fragment_num is not None
            else None
        )

    def process(
        self,
        events: list[Mapping[str, Any]],
        tokens: list[Mapping[str, Any]] | None = None,
    ) -> list[Mapping[str, Any]]:
        """Events at most `MAX_CHANGE_EVENT_SIZE` bytes unchanged, larger ones as fragments.

        `tokens`: each event's resume token when a user stage may have changed its `_id`
        (`UserStages.apply`); mongod splits by the token and checks the `_id` of what it returns
        afterwards, so unsplit events are then checked here (280)."""
        out: list[Mapping[str, Any]] = []
        for i, event in enumerate(events):
            token = tokens[i] if tokens is not None else event["_id"]
            size = bson_size(event)
            skip = self._skip_for(token, size)
            if size <= MAX_CHANGE_EVENT_SIZE:
                if tokens is not None:
                    from pipeline_stages.user_stages import check_resume_token

                    check_resume_token(event, token)
                out.append(event)
                continue
            token_size = len(bson_bytes.encode(token))
            fragments = split_change_event(event, MAX_CHANGE_EVENT_SIZE - token_size, skip, token)
            if skip > 0 and not fragments:
                raise MongoError(280, DIFFERENT_SPLIT_MESSAGE)
            out.extend(fragments)
        return out

    def _skip_for(self, token: Mapping[str, Any], size: int) -> int:
        """`_handleResumeAfterSplit`: how many fragments of this event the client already has."""
        client = self._resume_after_split
        if client is None:
            return 0
        status = resume_status(resume_token.decode(token), client)
        if status == CHECK_NEXT:
            raise MongoError(7182805, "Observed unexpected event before resume point")
        if status == NEEDS_SPLIT and size <= MAX_CHANGE_EVENT_SIZE:
            raise MongoError(280, NOT_LARGE_ENOUGH_MESSAGE)
        self._resume_after_split = None
        # a fragment token (only those are kept in _resume_after_split)
        return (client.fragment_num or 0) if status == NEEDS_SPLIT else 0
