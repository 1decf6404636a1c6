"""Pre- and post-image stages (reference oplog_to_events.md §7) over real transform output."""

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

from pipeline_stages.add_post_image import AddPostImage, strip_internal_fields
from pipeline_stages.add_pre_image import AddPreImage
from pipeline_stages.errors import MongoError
from pipeline_stages.image_source import ImageSource, MemoryImageSource, pre_image_id
from pipeline_stages.oplog_entry import decode_entry
from pipeline_stages.spec import ChangeStreamSpec
from pipeline_stages.transform import MISSING, ChangeStreamTransform

UUID_A = Binary(uuid.UUID("0123456789abcdef0123456789abcdef").bytes, 4)
UUID_B = Binary(uuid.UUID("fedcba9876543210fedcba9876543210").bytes, 4)
WALL = datetime.datetime(2024, 5, 1, 12, 0, 0)
LSID = {"id": Binary(uuid.UUID("11111111222233334444555555555555").bytes, 4), "uid": b"\x01" * 32}

PRE_MSG = (
    "Change stream was configured to require a pre-image for all update, delete and replace "
    "events, but the pre-image was not found for event: "
)
POST_MSG = (
    "Change stream was configured to require a post-image for all update events, but the "
    "post-image was not found for event: "
)


# -- building events --------------------------------------------------------------------------


def _entry(fields: dict[str, Any]):
    return decode_entry(bson.encode(fields))


def update_entry(ts, _id, diff, *, ns="test.c", ui=UUID_A, **extra):
    return _entry(
        {"op": "u", "ns": ns, "ui": ui, "o": {"$v": 2, "diff": diff}, "o2": {"_id": _id},
         "ts": ts, "t": Int64(1), "v": Int64(2), "wall": WALL, **extra}
    )


def replace_entry(ts, doc, *, ns="test.c", ui=UUID_A):
    return _entry(
        {"op": "u", "ns": ns, "ui": ui, "o": doc, "o2": {"_id": doc["_id"]},
         "ts": ts, "t": Int64(1), "v": Int64(2), "wall": WALL}
    )


def delete_entry(ts, _id, *, ns="test.c", ui=UUID_A):
    return _entry(
        {"op": "d", "ns": ns, "ui": ui, "o": {"_id": _id},
         "ts": ts, "t": Int64(1), "v": Int64(2), "wall": WALL}
    )


def insert_entry(ts, doc, *, ns="test.c", ui=UUID_A):
    return _entry(
        {"op": "i", "ns": ns, "ui": ui, "o": doc, "o2": {"_id": doc["_id"]},
         "ts": ts, "t": Int64(1), "v": Int64(2), "wall": WALL}
    )


def txn_update_entry(commit_ts, apply_ops_ts, apply_ops_index, txn_op_index, _id, diff):
    """An update as unwind_transaction emits it from a committed transaction."""
    return update_entry(
        commit_ts, _id, diff,
        txnOpIndex=Int64(txn_op_index), applyOpsIndex=Int64(apply_ops_index),
        applyOpsTs=apply_ops_ts, lsid=LSID, txnNumber=Int64(7),
    )


def make_spec(full_document="default", before="off", *, scope="collection", **kw):
    return ChangeStreamSpec(
        scope=scope, db="test", coll="c" if scope == "collection" else None,
        full_document=full_document, full_document_before_change=before, **kw,
    )


def events_for(spec, entries):
    transform = ChangeStreamTransform(spec)
    return [transform.transform(e) for e in entries]


def run_stages(spec, source, events):
    """The image part of the pipeline, in mongod's order."""
    if spec.full_document_before_change != "off":
        events = AddPreImage(spec, source).process(events)
    if spec.full_document != "default":
        events = AddPostImage(spec, source).process(events)
    else:
        for event in events:
            strip_internal_fields(event)
    return events


class CountingSource(MemoryImageSource):
    def __init__(self) -> None:
        super().__init__()
        self.pre_image_calls: list[list[Any]] = []
        self.lookup_calls: list[tuple[str, str, bytes | None, list[Any]]] = []

    def pre_images(self, ids):
        self.pre_image_calls.append(list(ids))
        return super().pre_images(ids)

    def current_documents(self, db, coll, uuid, keys):
        self.lookup_calls.append((db, coll, uuid, list(keys)))
        return super().current_documents(db, coll, uuid, keys)


def plain(value):
    """Compare documents regardless of RawBSONDocument/dict (order-sensitively)."""
    return bson.decode(bson.encode({"v": value}))["v"]


def assert_wire_ready(events):
    for event in events:
        assert "preImageId" not in event and "rawOplogUpdateSpec" not in event
        assert all(v is not MISSING for v in event.values())
        bson.encode(event)  # MISSING or other internals would not encode


T1, T2, T3, T4 = (Timestamp(1700000000, i) for i in (1, 2, 3, 4))


# -- fullDocumentBeforeChange -----------------------------------------------------------------


def test_pre_images_one_call_per_batch_and_appended_last():
    spec = make_spec(before="whenAvailable")
    source = CountingSource()
    source.add_pre_image(UUID_A, T1, 0, {"_id": 1, "a": 1})
    source.add_pre_image(UUID_A, T3, 0, {"_id": 3, "gone": True})
    events = events_for(spec, [
        update_entry(T1, 1, {"u": {"a": 2}}),
        replace_entry(T2, {"_id": 2, "b": 1}),  # no stored pre-image
        delete_entry(T3, 3),
        insert_entry(T4, {"_id": 4}),
    ])
    out = run_stages(spec, source, events)

    assert len(source.pre_image_calls) == 1
    assert [plain(i) for i in source.pre_image_calls[0]] == [
        {"nsUUID": UUID_A, "ts": T, "applyOpsIndex": 0} for T in (T1, T2, T3)
    ]
    assert [list(i) for i in source.pre_image_calls[0]] == [["nsUUID", "ts", "applyOpsIndex"]] * 3
    update, replace, delete, insert = out
    assert list(update) == [
        "_id", "operationType", "clusterTime", "wallTime", "ns", "documentKey",
        "updateDescription", "fullDocumentBeforeChange",
    ]
    assert list(replace) == [
        "_id", "operationType", "clusterTime", "wallTime", "fullDocument", "ns", "documentKey",
        "fullDocumentBeforeChange",
    ]
    assert list(delete) == [
        "_id", "operationType", "clusterTime", "wallTime", "ns", "documentKey",
        "fullDocumentBeforeChange",
    ]
    assert list(insert) == [
        "_id", "operationType", "clusterTime", "wallTime", "fullDocument", "ns", "documentKey",
    ]
    assert plain(update["fullDocumentBeforeChange"]) == {"_id": 1, "a": 1}
    assert replace["fullDocumentBeforeChange"] is None
    assert plain(delete["fullDocumentBeforeChange"]) == {"_id": 3, "gone": True}
    assert_wire_ready(out)


def test_pre_image_id_type_is_long_and_matches_stored_int32_index():
    # The _id lookup is by BSON equality: an index stored as int32 0 equals NumberLong(0).
    spec = make_spec(before="whenAvailable")
    source = CountingSource()
    source.add_pre_image_document(
        {"_id": {"nsUUID": UUID_A, "ts": T1, "applyOpsIndex": 0},
         "operationTime": WALL, "preImage": {"_id": 1, "x": "old"}}
    )
    [event] = events_for(spec, [delete_entry(T1, 1)])
    assert type(event["preImageId"]["applyOpsIndex"]) is Int64
    run_stages(spec, source, [event])
    assert plain(event["fullDocumentBeforeChange"]) == {"_id": 1, "x": "old"}


def test_pre_image_of_other_collection_or_time_is_not_used():
    spec = make_spec(before="whenAvailable")
    source = MemoryImageSource()
    source.add_pre_image(UUID_B, T1, 0, {"_id": 1, "other": "collection"})
    source.add_pre_image(UUID_A, T2, 0, {"_id": 1, "other": "time"})
    [event] = run_stages(spec, source, events_for(spec, [delete_entry(T1, 1)]))
    assert event["fullDocumentBeforeChange"] is None


def test_no_pre_image_call_when_batch_has_no_update_replace_delete():
    spec = make_spec(before="required")
    source = CountingSource()
    out = run_stages(spec, source, events_for(spec, [insert_entry(T1, {"_id": 1})]))
    assert source.pre_image_calls == []
    assert "fullDocumentBeforeChange" not in out[0]


def test_pre_image_required_missing_raises_47_for_first_event():
    spec = make_spec(before="required")
    source = MemoryImageSource()
    source.add_pre_image(UUID_A, T1, 0, {"_id": 1})
    events = events_for(spec, [
        update_entry(T1, 1, {"u": {"a": 2}}),
        delete_entry(T2, 2),
        replace_entry(T3, {"_id": 3}),
    ])
    with pytest.raises(MongoError) as info:
        AddPreImage(spec, source).process(events)
    err = info.value
    assert err.code == 47
    assert err.code_name == "NoMatchingDocument"
    assert err.errmsg == (
        PRE_MSG
        + '{operationType: "delete", ns: {db: "test", coll: "c"}, '
        "clusterTime: Timestamp(1700000000, 2)}"
    )


def test_pre_image_required_all_present():
    spec = make_spec(before="required")
    source = MemoryImageSource()
    source.add_pre_image(UUID_A, T1, 0, {"_id": 1, "v": 1})
    source.add_pre_image(UUID_A, T2, 0, {"_id": 1, "v": 2})
    out = AddPreImage(spec, source).process(events_for(spec, [
        update_entry(T1, 1, {"u": {"v": 2}}), delete_entry(T2, 1),
    ]))
    assert all("preImageId" not in e for e in out)  # dropped by the stage itself, as mongod does
    assert [plain(e["fullDocumentBeforeChange"]) for e in out] == [
        {"_id": 1, "v": 1}, {"_id": 1, "v": 2},
    ]
    assert_wire_ready(out)


# -- transactions -------------------------------------------------------------------------------


def test_transaction_pre_image_id_uses_apply_ops_ts_and_index():
    spec = make_spec(before="whenAvailable")
    source = CountingSource()
    apply_ops_ts = Timestamp(1700000000, 9)
    commit_ts = Timestamp(1700000005, 1)
    source.add_pre_image(UUID_A, apply_ops_ts, 1, {"_id": 5, "in": "applyOps"})
    source.add_pre_image(UUID_A, commit_ts, 0, {"_id": 5, "in": "commit entry"})  # decoy
    [event] = events_for(
        spec, [txn_update_entry(commit_ts, apply_ops_ts, 1, 3, 5, {"u": {"x": 1}})]
    )
    assert plain(event["preImageId"]) == {
        "nsUUID": UUID_A, "ts": apply_ops_ts, "applyOpsIndex": 1,
    }
    [event] = run_stages(spec, source, [event])
    assert plain(source.pre_image_calls[0][0])["ts"] == apply_ops_ts
    assert plain(event["fullDocumentBeforeChange"]) == {"_id": 5, "in": "applyOps"}
    assert list(event)[:3] == ["txnNumber", "lsid", "_id"]
    assert list(event)[-1] == "fullDocumentBeforeChange"
    assert_wire_ready([event])


def test_transaction_required_message_includes_txn_number():
    commit_ts = Timestamp(1700000005, 1)
    for spec, stage, message in (
        (make_spec(before="required"), AddPreImage, PRE_MSG),
        (make_spec("required"), AddPostImage, POST_MSG),
    ):
        events = events_for(spec, [
            txn_update_entry(commit_ts, Timestamp(1700000000, 9), 0, 0, 5, {"u": {"x": 1}})
        ])
        with pytest.raises(MongoError) as info:
            stage(spec, MemoryImageSource()).process(events)
        assert info.value.code == 47
        assert info.value.errmsg == message + (
            '{operationType: "update", ns: {db: "test", coll: "c"}, '
            "clusterTime: Timestamp(1700000005, 1), txnNumber: 7}"
        )


# -- fullDocument: whenAvailable / required ----------------------------------------------------


def test_post_image_applies_diff_in_full_document_slot():
    spec = make_spec("whenAvailable")
    source = CountingSource()
    source.add_pre_image(UUID_A, T1, 0, {"_id": 1, "a": 1, "b": {"c": 1}, "gone": 0})
    events = events_for(spec, [
        update_entry(T1, 1, {"d": {"gone": False}, "u": {"a": 2}, "i": {"new": "x"},
                              "sb": {"u": {"c": 5}}}),
        replace_entry(T2, {"_id": 2, "r": 1}),
        delete_entry(T3, 3),
    ])
    assert events[0]["fullDocument"] is MISSING
    update, replace, delete = run_stages(spec, source, events)

    assert len(source.pre_image_calls) == 1
    assert len(source.pre_image_calls[0]) == 1  # only the update needs its pre-image
    assert list(update) == [
        "_id", "operationType", "clusterTime", "wallTime", "fullDocument", "ns", "documentKey",
        "updateDescription",
    ]
    assert plain(update["fullDocument"]) == {"_id": 1, "a": 2, "b": {"c": 5}, "new": "x"}
    assert plain(replace["fullDocument"]) == {"_id": 2, "r": 1}
    assert "fullDocumentBeforeChange" not in replace and "fullDocument" not in delete
    assert_wire_ready([update, replace, delete])


def test_post_image_when_available_without_pre_image_is_null():
    spec = make_spec("whenAvailable")
    source = MemoryImageSource()
    [event] = run_stages(spec, source, events_for(spec, [update_entry(T1, 1, {"u": {"a": 2}})]))
    assert event["fullDocument"] is None
    assert list(event)[4] == "fullDocument"
    assert_wire_ready([event])


def test_post_image_reuses_fetched_pre_image():
    spec = make_spec("whenAvailable", "whenAvailable")
    source = CountingSource()
    source.add_pre_image(UUID_A, T1, 0, {"_id": 1, "a": 1})
    events = events_for(spec, [
        update_entry(T1, 1, {"u": {"a": 2}}),
        update_entry(T2, 2, {"u": {"a": 2}}),  # no pre-image
        delete_entry(T3, 1),
    ])
    first, second, delete = run_stages(spec, source, events)
    assert len(source.pre_image_calls) == 1  # the post-image stage asked for nothing
    assert list(first) == [
        "_id", "operationType", "clusterTime", "wallTime", "fullDocument", "ns", "documentKey",
        "updateDescription", "fullDocumentBeforeChange",
    ]
    assert plain(first["fullDocument"]) == {"_id": 1, "a": 2}
    assert plain(first["fullDocumentBeforeChange"]) == {"_id": 1, "a": 1}
    assert second["fullDocument"] is None and second["fullDocumentBeforeChange"] is None
    assert delete["fullDocumentBeforeChange"] is None
    assert_wire_ready([first, second, delete])


def test_post_image_uses_full_document_before_change_not_the_source():
    # If the pre-image stage already answered, its answer is the pre-image (even null).
    spec = make_spec("whenAvailable", "whenAvailable")
    source = CountingSource()
    source.add_pre_image(UUID_A, T1, 0, {"_id": 1, "a": 1})
    [event] = events_for(spec, [update_entry(T1, 1, {"u": {"a": 2}})])
    del event["preImageId"]
    event["fullDocumentBeforeChange"] = None
    AddPostImage(spec, source).process([event])
    assert source.pre_image_calls == []
    assert event["fullDocument"] is None


def test_post_image_required_missing_raises_47():
    spec = make_spec("required")
    source = MemoryImageSource()
    source.add_pre_image(UUID_A, T1, 0, {"_id": 1, "a": 1})
    events = events_for(spec, [
        update_entry(T1, 1, {"u": {"a": 2}}),
        update_entry(T2, 2, {"u": {"a": 2}}),
    ])
    with pytest.raises(MongoError) as info:
        AddPostImage(spec, source).process(events)
    assert info.value.code == 47
    assert info.value.code_name == "NoMatchingDocument"
    assert info.value.errmsg == POST_MSG + (
        '{operationType: "update", ns: {db: "test", coll: "c"}, '
        "clusterTime: Timestamp(1700000000, 2)}"
    )


def test_post_image_required_with_pre_image_present():
    spec = make_spec("required", "whenAvailable")
    source = MemoryImageSource()
    # as a live source returns it: raw BSON
    source.add_pre_image(UUID_A, T1, 0, RawBSONDocument(bson.encode({"_id": 1, "arr": [1, 2, 3]})))
    [event] = run_stages(spec, source, events_for(
        spec, [update_entry(T1, 1, {"sarr": {"a": True, "u1": 9}})]
    ))
    assert plain(event["fullDocument"]) == {"_id": 1, "arr": [1, 9, 3]}


def test_both_required_report_the_pre_image_first():
    spec = make_spec("required", "required")
    events = events_for(spec, [update_entry(T1, 1, {"u": {"a": 2}})])
    with pytest.raises(MongoError) as info:
        run_stages(spec, MemoryImageSource(), events)
    assert info.value.errmsg.startswith(PRE_MSG)


# -- fullDocument: updateLookup ----------------------------------------------------------------


def test_update_lookup_one_call_per_namespace():
    spec = make_spec("updateLookup", scope="database")
    source = CountingSource()
    source.create_collection("test", "a", UUID_A)
    source.create_collection("test", "b", UUID_B)
    source.put_document("test", "a", {"_id": 1, "now": "a1"})
    source.put_document("test", "a", {"_id": 3, "now": "a3"})
    source.put_document("test", "b", {"_id": 2, "now": "b2"})
    events = events_for(spec, [
        update_entry(T1, 1, {"u": {"x": 1}}, ns="test.a", ui=UUID_A),
        update_entry(T2, 2, {"u": {"x": 1}}, ns="test.b", ui=UUID_B),
        insert_entry(T3, {"_id": 9}, ns="test.a", ui=UUID_A),
        update_entry(T4, 3, {"u": {"x": 1}}, ns="test.a", ui=UUID_A),
    ])
    out = run_stages(spec, source, events)

    calls = [(db, coll, u, [plain(k) for k in keys]) for db, coll, u, keys in source.lookup_calls]
    assert calls == [
        ("test", "a", None, [{"_id": 1}, {"_id": 3}]),
        ("test", "b", None, [{"_id": 2}]),
    ]
    assert source.pre_image_calls == []
    assert [plain(e["fullDocument"]) for e in out] == [
        {"_id": 1, "now": "a1"}, {"_id": 2, "now": "b2"}, {"_id": 9}, {"_id": 3, "now": "a3"},
    ]
    assert list(out[0]) == [
        "_id", "operationType", "clusterTime", "wallTime", "fullDocument", "ns", "documentKey",
        "updateDescription",
    ]
    assert_wire_ready(out)


def test_update_lookup_deleted_document_is_null():
    spec = make_spec("updateLookup")
    source = MemoryImageSource()
    source.create_collection("test", "c", UUID_A)
    source.put_document("test", "c", {"_id": 1, "a": 2})
    source.delete_document("test", "c", 1)
    [event] = run_stages(spec, source, events_for(spec, [update_entry(T1, 1, {"u": {"a": 2}})]))
    assert "fullDocument" in event and event["fullDocument"] is None
    assert list(event)[4] == "fullDocument"
    assert_wire_ready([event])


def test_update_lookup_no_call_without_updates():
    spec = make_spec("updateLookup")
    source = CountingSource()
    out = run_stages(spec, source, events_for(spec, [
        replace_entry(T1, {"_id": 1, "r": 1}), delete_entry(T2, 1),
    ]))
    assert source.lookup_calls == []
    assert plain(out[0]["fullDocument"]) == {"_id": 1, "r": 1}
    assert "fullDocument" not in out[1]


def test_update_lookup_match_collection_uuid_recreated_collection():
    before = update_entry(T1, 1, {"u": {"a": 2}}, ui=UUID_A)  # on the dropped collection
    after = update_entry(T2, 1, {"u": {"a": 3}}, ui=UUID_B)  # on the re-created one
    source = CountingSource()
    source.create_collection("test", "c", UUID_A)
    source.put_document("test", "c", {"_id": 1, "a": 2})
    source.drop_collection("test", "c")
    source.create_collection("test", "c", UUID_B)
    source.put_document("test", "c", {"_id": 1, "a": 3})

    spec = make_spec("updateLookup", match_collection_uuid_for_update_lookup=True)
    old, new = run_stages(spec, source, events_for(spec, [before, after]))
    assert old["fullDocument"] is None
    assert plain(new["fullDocument"]) == {"_id": 1, "a": 3}
    assert [(c[2], len(c[3])) for c in source.lookup_calls] == [
        (bytes(UUID_A), 1), (bytes(UUID_B), 1),
    ]

    # Without the flag the namespace alone decides: both find the current document.
    source.lookup_calls.clear()
    spec = make_spec("updateLookup")
    old, new = run_stages(spec, source, events_for(spec, [before, after]))
    assert plain(old["fullDocument"]) == plain(new["fullDocument"]) == {"_id": 1, "a": 3}
    assert [(c[2], len(c[3])) for c in source.lookup_calls] == [(None, 2)]


def test_update_lookup_matches_whole_document_key():
    spec = make_spec("updateLookup")
    source = MemoryImageSource()
    source.create_collection("test", "c", UUID_A)
    source.put_document("test", "c", {"_id": 1, "sk": "moved", "v": 1})
    e = _entry({"op": "u", "ns": "test.c", "ui": UUID_A, "o": {"$v": 2, "diff": {"u": {"v": 1}}},
                "o2": {"sk": "orig", "_id": 1}, "ts": T1, "wall": WALL})
    [event] = run_stages(spec, source, events_for(spec, [e]))
    assert event["fullDocument"] is None  # same _id, different shard key value


# -- strip_internal_fields ---------------------------------------------------------------------


def test_strip_internal_fields():
    spec = make_spec("whenAvailable", "whenAvailable")
    [event] = events_for(spec, [update_entry(T1, 1, {"u": {"a": 2}})])
    assert {"preImageId", "rawOplogUpdateSpec", "fullDocument"} <= set(event)
    strip_internal_fields(event)
    assert list(event) == [
        "_id", "operationType", "clusterTime", "wallTime", "ns", "documentKey",
        "updateDescription",
    ]
    spec = make_spec("updateLookup")
    [event] = events_for(spec, [update_entry(T1, 1, {"u": {"a": 2}})])
    event["fullDocument"] = None  # a filled slot stays, even null
    strip_internal_fields(event)
    assert "fullDocument" in event


def test_pre_image_stage_alone_leaves_no_internals():
    spec = make_spec(before="whenAvailable")
    out = run_stages(spec, MemoryImageSource(), events_for(spec, [
        update_entry(T1, 1, {"u": {"a": 2}}), delete_entry(T2, 1),
    ]))
    assert_wire_ready(out)


# -- MemoryImageSource --------------------------------------------------------------------------


def test_memory_source_is_an_image_source():
    assert isinstance(MemoryImageSource(), ImageSource)


def test_memory_source_document_key_bson_equality():
    source = MemoryImageSource()
    source.create_collection("db", "c", UUID_A)
    source.put_document("db", "c", {"_id": Int64(5), "v": "long"})
    source.put_document("db", "c", {"_id": {"a": 1, "b": 2}, "v": "doc"})
    source.put_document("db", "c", {"_id": 7, "a": {"b": 2}, "v": "nested"})
    source.put_document("db", "c", {"_id": 8, "v": "no sk"})
    source.put_document("db", "c", {"_id": "x", "v": "string"})
    keys = [
        {"_id": 5.0},  # numbers compare by value
        {"_id": {"a": 1, "b": 2}},
        {"_id": {"b": 2, "a": 1}},  # field order matters in embedded documents
        {"a.b": 2, "_id": 7},  # dotted shard key
        {"a.b": 3, "_id": 7},
        {"sk": None, "_id": 8},  # null matches a missing field
        {"_id": "X"},  # simple collation: case-sensitive
        {"_id": RawBSONDocument(bson.encode({"a": 1, "b": 2}))},
    ]
    found = source.current_documents("db", "c", None, keys)
    assert [None if d is None else d["v"] for d in found] == [
        "long", "doc", None, "nested", None, "no sk", None, "doc",
    ]
    assert source.current_documents("db", "c", bytes(UUID_A), [{"_id": 5}])[0]["v"] == "long"
    assert source.current_documents("db", "c", bytes(UUID_B), [{"_id": 5}]) == [None]
    assert source.current_documents("db", "missing", None, [{"_id": 5}, {"_id": 6}]) == [
        None, None,
    ]


def test_memory_source_ambiguous_key_is_fatal():
    source = MemoryImageSource()
    source.put_document("db", "c", {"_id": 1, "sk": 1})
    source.put_document("db", "c", {"_id": 2, "sk": 1})
    with pytest.raises(MongoError) as info:
        source.current_documents("db", "c", None, [{"sk": 1}])
    assert info.value.code == 280
    assert info.value.errmsg == (
        "found more than one document with document key {sk: 1} "
        "[{_id: 1, sk: 1}, {_id: 2, sk: 1}]"
    )


def test_memory_source_pre_images():
    source = MemoryImageSource(
        [{"_id": pre_image_id(UUID_A, T1, 0), "operationTime": WALL, "preImage": {"_id": 1}}]
    )
    source.add_pre_image(uuid.UUID(bytes=bytes(UUID_B)), T1, 2, {"_id": 2})
    ids = [
        {"nsUUID": UUID_A, "ts": T1, "applyOpsIndex": Int64(0)},
        {"nsUUID": bytes(UUID_A), "ts": T1, "applyOpsIndex": 0},  # raw UUID bytes
        {"nsUUID": UUID_B, "ts": T1, "applyOpsIndex": Int64(2)},
        {"nsUUID": UUID_B, "ts": T1, "applyOpsIndex": Int64(1)},
        {"ts": T1, "nsUUID": UUID_A, "applyOpsIndex": Int64(0)},  # other field order
    ]
    assert [plain(i) for i in source.pre_images(ids)] == [
        {"_id": 1}, {"_id": 1}, {"_id": 2}, None, None,
    ]
    assert source.remove_pre_image(ids[0])
    assert source.pre_images(ids[:1]) == [None]
    with pytest.raises(ValueError):
        source.add_pre_image_document({"_id": pre_image_id(UUID_A, T2)})
