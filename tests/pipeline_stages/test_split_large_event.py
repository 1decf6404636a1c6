"""$changeStreamSplitLargeEvent (reference oplog_to_events.md §8): threshold, fragment order and
sizes, fragment tokens, the too-large-field error and resuming from a fragment."""

from __future__ import annotations

import datetime
import uuid
from typing import Any

import bson
import pytest
from bson.binary import Binary
from bson.int64 import Int64
from bson.raw_bson import RawBSONDocument
from bson.timestamp import Timestamp

from pipeline_stages import resume_token
from pipeline_stages.add_post_image import strip_internal_fields
from pipeline_stages.errors import MongoError
from pipeline_stages.oplog_entry import decode_entry
from pipeline_stages.resume_token import ResumeTokenData
from pipeline_stages.spec import ChangeStreamSpec
from pipeline_stages.split_large_event import (
    DIFFERENT_SPLIT_MESSAGE,
    MAX_CHANGE_EVENT_SIZE,
    NOT_LARGE_ENOUGH_MESSAGE,
    SplitLargeEvent,
    split_change_event,
)
from pipeline_stages.transform import MISSING, ChangeStreamTransform
from pipeline_stages.user_stages import ID_MODIFIED_MESSAGE, UserStages

UUID_A = Binary(uuid.UUID("0123456789abcdef0123456789abcdef").bytes, 4)
WALL = datetime.datetime(2024, 5, 1, 12, 0, 0)
MIB = 1024 * 1024


def update_event(ts: int, big: int, before: int = 0, _id: Any = 1) -> dict[str, Any]:
    """An update event with a `fullDocument` of about `big` bytes (and, if `before`, a
    `fullDocumentBeforeChange` of about `before` bytes), as the transform makes it."""
    spec = ChangeStreamSpec(scope="collection", db="test", coll="c")
    entry = decode_entry(bson.encode(
        {"op": "u", "ns": "test.c", "ui": UUID_A, "o": {"$v": 2, "diff": {"u": {"n": 2}}},
         "o2": {"_id": _id}, "ts": Timestamp(1700000000, ts), "t": Int64(1), "v": Int64(2),
         "wall": WALL}
    ))
    event = ChangeStreamTransform(spec).transform(entry)
    strip_internal_fields(event)
    event["fullDocument"] = RawBSONDocument(bson.encode({"_id": _id, "n": 2, "s": "x" * big}))
    if before:
        event["fullDocumentBeforeChange"] = RawBSONDocument(
            bson.encode({"_id": _id, "n": 1, "s": "y" * before})
        )
    return event


def size(doc: Any) -> int:
    return len(bson.encode(doc))


def padded(event: dict[str, Any], target: int) -> dict[str, Any]:
    """`event` plus a string field `pad` making its BSON size exactly `target`."""
    base = size(event)
    event = dict(event)
    event["pad"] = "p" * (target - base - len(b"\x02pad\x00") - 4 - 1)
    assert size(event) == target
    return event


def element_size(name: str, value: Any) -> int:
    return size({name: value}) - 5


def fragment_base(token: dict[str, Any], number: int) -> int:
    """A fragment's fixed part as mongod measures it: with its `$sortKey` metadata."""
    return size({"_id": token, "splitEvent": {"fragment": number, "of": 0}, "$sortKey": [token]})


def test_threshold_is_16_mib_plus_16_kib_minus_8_kib():
    assert MAX_CHANGE_EVENT_SIZE == 16_785_408


# -- the threshold ------------------------------------------------------------------------------


def test_events_up_to_the_threshold_are_returned_unchanged():
    small = update_event(1, 100)
    under = padded(update_event(2, 8 * MIB), MAX_CHANGE_EVENT_SIZE - 1)
    at = padded(update_event(3, 8 * MIB), MAX_CHANGE_EVENT_SIZE)
    out = SplitLargeEvent().process([small, under, at])
    assert len(out) == 3 and all(a is b for a, b in zip(out, [small, under, at]))


def test_one_byte_over_the_threshold_is_split():
    over = padded(update_event(4, 8 * MIB), MAX_CHANGE_EVENT_SIZE + 1)
    out = SplitLargeEvent().process([over])
    assert [f["splitEvent"] for f in out] == [{"fragment": 1, "of": 2}, {"fragment": 2, "of": 2}]
    # The smaller fields and the 8 MiB fullDocument fit in the first; the pad does not.
    assert list(out[1]) == ["_id", "splitEvent", "pad"]


# -- fragments ----------------------------------------------------------------------------------


def test_fragment_shape_order_and_sizes():
    event = update_event(5, 7 * MIB, before=12 * MIB)
    event["emptySlot"] = MISSING  # an empty slot is not a field
    out = SplitLargeEvent().process([event])
    assert len(out) == 2
    assert all("emptySlot" not in f for f in out)
    fields = [(k, v) for k, v in event.items() if k != "_id" and v is not MISSING]
    order = [k for _, k in sorted((element_size(k, v), k) for k, v in fields)]
    assert order[-2:] == ["fullDocument", "fullDocumentBeforeChange"]
    assert list(out[0])[:2] == ["_id", "splitEvent"]
    assert list(out[0])[2:] == order[:-1] and list(out[1])[2:] == order[-1:]
    for i, fragment in enumerate(out):
        assert fragment["splitEvent"] == {"fragment": i + 1, "of": 2}
        for name in list(fragment)[2:]:
            assert fragment[name] is event[name]  # values are the event's own
        limit = MAX_CHANGE_EVENT_SIZE - size(event["_id"])
        with_meta = size({**fragment, "$sortKey": [fragment["_id"]]})
        assert with_meta <= limit  # room left for a postBatchResumeToken
        assert size(fragment) < MAX_CHANGE_EVENT_SIZE


def test_fields_of_equal_size_go_by_name_and_the_greedy_boundary_is_inclusive():
    token = update_event(6, 1)["_id"]
    event = {"_id": token, "b": 321, "a": 123}
    field = element_size("a", 123)
    token0 = _fragment_token(token, 0)
    token1 = _fragment_token(token, 1)
    # Exactly room for both: one fragment.
    out = split_change_event(event, fragment_base(token0, 1) + 2 * field)
    assert len(out) == 1 and list(out[0]) == ["_id", "splitEvent", "a", "b"]
    # One byte short: a, then b.
    limit = fragment_base(token0, 1) + 2 * field - 1
    assert fragment_base(token1, 2) + field <= limit  # b fits a fragment of its own
    out = split_change_event(event, limit)
    assert [list(f)[2:] for f in out] == [["a"], ["b"]]
    assert [f["splitEvent"] for f in out] == [{"fragment": 1, "of": 2}, {"fragment": 2, "of": 2}]


def _fragment_token(token: dict[str, Any], n: int) -> dict[str, Any]:
    data = resume_token.decode(token)
    data.fragment_num = n
    return data.to_document()


def test_fragment_tokens_carry_fragment_num_and_sort_in_order():
    event = update_event(7, 6 * MIB, before=6 * MIB)
    event["extra"] = RawBSONDocument(bson.encode({"s": "z" * (6 * MIB)}))
    following = update_event(8, 10)
    out = SplitLargeEvent().process([event, following])
    fragments, last = out[:-1], out[-1]
    assert last is following and len(fragments) == 2
    original = resume_token.decode(event["_id"])
    datas = [resume_token.decode(f["_id"]) for f in fragments]
    assert [d.fragment_num for d in datas] == [0, 1]
    for d in datas:
        d.fragment_num = None
        assert d == original
    keys = [resume_token.sort_key(t) for t in
            [event["_id"], *(f["_id"] for f in fragments), following["_id"]]]
    assert keys == sorted(keys) and len(set(keys)) == len(keys)


def test_many_fragments():
    event = update_event(9, 100)
    for i in range(5):
        event[f"f{i}"] = "q" * (9 * MIB)
    out = SplitLargeEvent().process([event])
    assert [f["splitEvent"]["fragment"] for f in out] == [1, 2, 3, 4, 5]
    assert {f["splitEvent"]["of"] for f in out} == {5}
    assert [resume_token.decode(f["_id"]).fragment_num for f in out] == [0, 1, 2, 3, 4]
    # every field exactly once
    names = [n for f in out for n in list(f)[2:]]
    assert sorted(names) == sorted(k for k in event if k != "_id")


# -- errors -------------------------------------------------------------------------------------


def test_a_field_too_large_for_a_fragment():
    event = update_event(10, MAX_CHANGE_EVENT_SIZE)
    token = event["_id"]
    limit = MAX_CHANGE_EVENT_SIZE - size(token)
    fields = sorted((element_size(k, v), k) for k, v in event.items() if k != "_id")
    # The first fragment takes the small fields; fullDocument does not fit with them and
    # starts the second fragment alone, which is still too large.
    first = fragment_base(_fragment_token(token, 0), 1) + sum(s for s, _ in fields[:-1])
    assert first <= limit
    second = fragment_base(_fragment_token(token, 1), 2) + fields[-1][0]
    with pytest.raises(MongoError) as info:
        SplitLargeEvent().process([event])
    assert info.value.code == 7182500
    assert info.value.errmsg == (
        f"Splitting change event failed: fragment size {second} is greater than maximum "
        f"allowed fragment size {limit}"
    )


def test_an_event_with_only_an_id():
    event = {"_id": {"_data": "82", "pad": "x" * MAX_CHANGE_EVENT_SIZE}}
    with pytest.raises(MongoError) as info:
        SplitLargeEvent().process([event])
    assert (info.value.code, info.value.errmsg) == (
        7182502, "Cannot split an empty event or an event containing solely '_id' field"
    )


# -- resuming from a fragment -------------------------------------------------------------------


def _three_fragment_event(ts: int = 11) -> dict[str, Any]:
    event = update_event(ts, 9 * MIB, before=9 * MIB)
    event["extra"] = "e" * (9 * MIB)
    return event


def test_resume_from_fragment_k_skips_the_fragments_before_it():
    event = _three_fragment_event()
    full = SplitLargeEvent().process([event])
    assert len(full) == 3
    following = update_event(12, 10)
    for k in range(3):
        stage = SplitLargeEvent(resume_after=full[k]["_id"])
        out = stage.process([event, following])
        assert [f["_id"] for f in out[:-1]] == [f["_id"] for f in full[k:]]
        assert out[-1] is following
        # Later events are not affected.
        assert len(stage.process([event])) == 3


def test_resume_token_may_be_given_decoded():
    event = _three_fragment_event()
    full = SplitLargeEvent().process([event])
    stage = SplitLargeEvent(resume_after=resume_token.decode(full[2]["_id"]))
    assert [f["splitEvent"]["fragment"] for f in stage.process([event])] == [3]


def test_resume_after_an_event_that_is_no_longer_large_is_280():
    large = _three_fragment_event()
    token = SplitLargeEvent().process([large])[1]["_id"]
    small = dict(large, fullDocumentBeforeChange=None, extra=None, fullDocument=None)
    with pytest.raises(MongoError) as info:
        SplitLargeEvent(resume_after=token).process([small])
    assert (info.value.code, info.value.errmsg) == (280, NOT_LARGE_ENOUGH_MESSAGE)


def test_resume_when_the_event_now_splits_into_fewer_fragments_is_280():
    large = _three_fragment_event()
    token = SplitLargeEvent().process([large])[2]["_id"]
    smaller = dict(large, extra="e")  # now two fragments
    assert len(SplitLargeEvent().process([smaller])) == 2
    with pytest.raises(MongoError) as info:
        SplitLargeEvent(resume_after=token).process([smaller])
    assert (info.value.code, info.value.errmsg) == (280, DIFFERENT_SPLIT_MESSAGE)


def test_resume_when_the_stream_is_past_the_token_splits_everything():
    large = _three_fragment_event(ts=13)
    token = SplitLargeEvent().process([large])[1]["_id"]
    later = _three_fragment_event(ts=14)
    assert len(SplitLargeEvent(resume_after=token).process([later])) == 3


def test_an_event_before_the_resume_point_is_an_internal_error():
    large = _three_fragment_event(ts=15)
    token = SplitLargeEvent().process([large])[1]["_id"]
    earlier = update_event(14, 10)
    with pytest.raises(MongoError) as info:
        SplitLargeEvent(resume_after=token).process([earlier])
    assert (info.value.code, info.value.errmsg) == (
        7182805, "Observed unexpected event before resume point"
    )


def test_a_non_fragment_token_changes_nothing():
    event = _three_fragment_event(ts=16)
    stage = SplitLargeEvent(resume_after=event["_id"])
    assert len(stage.process([event])) == 3
    hwm = ResumeTokenData.high_water_mark(Timestamp(1, 1)).to_document()
    assert len(SplitLargeEvent(resume_after=hwm).process([event])) == 3


# -- with user stages that touch _id ------------------------------------------------------------


def test_a_large_event_whose_id_a_stage_changed_is_split_by_its_token():
    event = _three_fragment_event(ts=17)
    users = UserStages([{"$set": {"_id": "changed"}}])
    staged, tokens = users.apply([event])
    assert staged[0]["_id"] == "changed"
    out = SplitLargeEvent().process(staged, tokens)
    assert [resume_token.decode(f["_id"]).fragment_num for f in out] == [0, 1, 2]


def test_a_small_event_whose_id_a_stage_changed_is_280_after_the_split_stage():
    event = update_event(18, 10)
    staged, tokens = UserStages([{"$set": {"_id": "changed"}}]).apply([event])
    with pytest.raises(MongoError) as info:
        SplitLargeEvent().process(staged, tokens)
    assert info.value.code == 280
    assert info.value.errmsg.startswith(ID_MODIFIED_MESSAGE + "Expected: { _id: { _data: ")
    assert info.value.errmsg.endswith(' but found: { _id: "changed" }')
