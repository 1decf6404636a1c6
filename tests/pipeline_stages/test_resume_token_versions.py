"""Token versions as mongod 7.0/8.0 chooses them, and the order of `_data` across versions."""

from __future__ import annotations

from bson.timestamp import Timestamp

from pipeline_stages import resume_token as rt

UUID = bytes.fromhex("ab1154acacd849a48c61756d70d3b21f")


def event(ts: Timestamp, version: int) -> dict:
    return rt.ResumeTokenData.for_event(
        ts, "insert", uuid=UUID, document_key={"_id": 1}, version=version
    ).to_document()


def test_new_streams_emit_v2_events_and_high_water_marks():
    assert rt.version_for_event(Timestamp(5, 1), None) == 2
    assert event(Timestamp(5, 1), 2)["_data"][18:28] == "2B042C0100"
    hwm = rt.ResumeTokenData.high_water_mark(Timestamp(1666277036, 2)).to_document()
    assert hwm == {"_data": "8263515EAC000000022B0429296E1404"}  # the manual's PBRT


def test_resumed_v1_stream_keeps_v1_until_it_passes_the_token_time():
    v1 = rt.decode({"_data": "82612E8513000000012B022C0100296E5A1004A5093ABB38FE4B9EA67F01BB1A96D8"
                             "12463C5F6964003C5F5F5F78000004"})
    assert v1.version == 1
    at = v1.cluster_time
    assert rt.version_for_event(at, v1) == 1
    assert rt.version_for_event(Timestamp(at.time, at.inc - 1), v1) == 1
    assert rt.version_for_event(Timestamp(at.time, at.inc + 1), v1) == 2
    assert rt.version_for_event(Timestamp(at.time + 1, 0), v1) == 2


def test_v1_classic_event_uses_the_bare_document_key_and_v2_the_pair():
    v1 = rt.decode(event(Timestamp(5, 1), 1))
    v2 = rt.decode(event(Timestamp(5, 1), 2))
    assert v1.event_identifier_document() == {"_id": 1}
    assert v2.event_identifier_document() == {"operationType": "insert", "documentKey": {"_id": 1}}


def test_v1_expanded_events_use_the_operation_type_pair():
    data = rt.ResumeTokenData.for_event(
        Timestamp(5, 1), "create", uuid=UUID, operation_description={"idIndex": {"v": 2}},
        version=1,
    )
    ident = rt.decode(data.to_document()).event_identifier_document()
    assert ident == {"operationType": "create", "operationDescription": {"idIndex": {"v": 2}}}


def test_v2_drop_database_has_a_null_uuid_and_the_bare_operation_type():
    data = rt.ResumeTokenData.for_event(Timestamp(7, 3), "dropDatabase")
    token = data.to_document()["_data"]
    assert token == "82000000070000000" "32B042C0100296E14463C6F7065726174696F6E54797065003C" \
        "64726F7044617461626173650000" "04"
    assert rt.decode({"_data": token}) == data


def test_version_sorts_before_token_type_across_versions():
    # A v1 event token at T sorts before a v2 high-water mark at T (reference §3 caveat):
    # the reason mongod never mixes versions at one clusterTime.
    ts = Timestamp(9, 9)
    v1_event = event(ts, 1)
    v2_hwm = rt.ResumeTokenData.high_water_mark(ts).to_document()
    assert rt.sort_key(v1_event) < rt.sort_key(v2_hwm)


def test_sort_key_normalises_lower_case_client_tokens():
    a = event(Timestamp(5, 1), 2)
    assert rt.sort_key({"_data": a["_data"].lower()}) == rt.sort_key(a)


def test_the_per_event_fast_path_encodes_like_the_token_data():
    import bson
    from bson.int64 import Int64
    from bson.objectid import ObjectId

    keys = [
        {"_id": 1}, {"_id": "x\x00y"}, {"_id": Int64(5)}, {"_id": 1.5, "sk": {"a": [1, 2]}},
        # the concatenation fast path's shapes, and near misses that take the general one
        {"_id": -(1 << 31)}, {"_id": 0}, {"_id": 300}, {"_id": ObjectId()}, {"_id": ""},
        {"_id": "é\u00ff"}, {"_id": 1, "x": 2}, {"_id": ObjectId(), "sk": 1}, {"id": 1},
        {"_id": "ab", "c": "d"},
    ]
    for key in keys:
        for txn in (0, 3, (1 << 30) + 1):
            for op in ("insert", "update", "replace", "delete"):
                ts = Timestamp(1_700_000_000, txn + 1)
                raw = bson.encode(key)
                expected = rt.ResumeTokenData.for_event(
                    ts, op, uuid=UUID, document_key=raw, txn_op_index=txn
                ).to_document()
                assert rt.event_token(ts, op, UUID, raw, txn) == expected
