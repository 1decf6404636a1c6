"""Real tokens, made by MongoDB and collected by connectors: decode to the stated fields and
re-encode to identical bytes. Read from ../shared/ (reference §4 and corpus/resume_tokens/)."""

from __future__ import annotations

import base64
import json
import re
import uuid
from typing import Any

import pytest
from bson import json_util
from bson.binary import Binary
from bson.objectid import ObjectId
from bson.timestamp import Timestamp

from pipeline_stages import resume_token as rt


def _corpus(shared_dir) -> list[dict[str, Any]]:
    return json.loads((shared_dir / "corpus/resume_tokens/resume_tokens.json").read_text())[
        "tokens"
    ]


def _token_doc(entry: dict[str, Any]) -> dict[str, Any]:
    doc: dict[str, Any] = {"_data": entry["token_data"]}
    m = re.search(r"_typeBits \{\$binary: '([A-Za-z0-9+/=]+)'", entry["format"])
    if m:
        doc["_typeBits"] = Binary(base64.b64decode(m.group(1)), 0)
    return doc


def _loose_equal(stated: Any, ours: Any) -> bool:
    """Connectors print ObjectIds as hex strings and drop numeric types; compare like they do."""
    if isinstance(stated, dict) and len(stated) == 1 and next(iter(stated)).startswith("$"):
        stated = json_util.loads(json.dumps({"v": stated}))["v"]
    if isinstance(stated, dict):
        return (
            isinstance(ours, dict)
            and set(stated) == set(ours)  # sources print keys sorted; bytes pin the order
            and all(_loose_equal(stated[k], ours[k]) for k in stated)
        )
    if isinstance(stated, list):
        return (
            isinstance(ours, list)
            and len(stated) == len(ours)
            and all(_loose_equal(a, b) for a, b in zip(stated, ours))
        )
    if isinstance(ours, ObjectId):
        return str(stated) == str(ours)
    return stated == ours


def _stated_time(stated: dict[str, Any]) -> Timestamp | None:
    ts = stated.get("timestamp", stated.get("clusterTime"))
    if ts is None:
        return None
    ts = ts.get("$timestamp", ts)
    return Timestamp(ts["t"], ts["i"])


def _hex_entries(shared_dir):
    return [e for e in _corpus(shared_dir) if e["format"].startswith("hex string")]


def test_corpus_has_tokens(shared_dir):
    assert len(_hex_entries(shared_dir)) >= 15


def test_corpus_tokens_decode_to_stated_fields_and_reencode(shared_dir):
    checked = 0
    for entry in _hex_entries(shared_dir):
        doc = _token_doc(entry)
        if "tiny double" in entry["source"].get("locator", ""):
            doc = _restore_dropped_type_bits(entry, doc)
        data = rt.decode(doc)
        again = data.to_document()
        assert again["_data"] == doc["_data"].upper(), entry["source"]
        assert again.get("_typeBits") == doc.get("_typeBits"), entry["source"]
        ident = data.event_identifier_document()
        for stated in (entry.get("decoding_stated_by_source"), entry.get("our_decoding")):
            if not isinstance(stated, dict):
                continue
            if (ts := _stated_time(stated)) is not None:
                assert data.cluster_time == ts
            for key, attr in (
                ("version", "version"),
                ("tokenType", "token_type"),
                ("fromInvalidate", "from_invalidate"),
            ):
                if key in stated:
                    assert getattr(data, attr) == stated[key], (entry["source"], key)
            if "txnOpIndex" in stated:
                n = stated["txnOpIndex"]
                assert data.txn_op_index == int(n["$numberLong"] if isinstance(n, dict) else n)
            if "uuid" in stated:
                u = stated["uuid"]
                u = u.get("$uuid") if isinstance(u, dict) else u
                assert data.uuid == (None if u is None else uuid.UUID(u).bytes)
            for key in ("documentKey", "eventIdentifier"):
                if stated.get(key) is not None:
                    assert _loose_equal(stated[key], ident), (entry["source"], key, ident)
            checked += 1
    assert checked >= 15


def _restore_dropped_type_bits(entry: dict[str, Any], doc: dict[str, Any]) -> dict[str, Any]:
    """The "tiny double" token's source kept `_data` but dropped its `_typeBits` (its decoder
    ignores them). mongod refuses it like that: large numbers under int type bits are 50826.
    Encoding the stated fields (doubles) must give the same `_data` back, with the type bits
    the server sent."""
    with pytest.raises(rt.MongoError) as err:
        rt.decode(doc)
    assert err.value.code == 50826
    stated = entry["decoding_stated_by_source"]
    rebuilt = rt.ResumeTokenData.for_event(
        Timestamp(stated["timestamp"]["t"], stated["timestamp"]["i"]),
        "insert",
        uuid=uuid.UUID(stated["uuid"]).bytes,
        document_key=stated["documentKey"],
        version=stated["version"],
    ).to_document()
    assert rebuilt["_data"] == doc["_data"]
    assert "_typeBits" in rebuilt
    return rebuilt


def test_v36_bindata_tokens_are_refused_as_mongod_8_refuses_them(shared_dir):
    entries = [e for e in _corpus(shared_dir) if e["format"].startswith("BinData")]
    assert entries
    for entry in entries:
        doc = {"_data": Binary(bytes.fromhex(entry["token_data"]), 0)}
        with pytest.raises(rt.MongoError) as err:
            rt.decode(doc)
        assert err.value.code == 40647
        assert err.value.errmsg == (
            "Bad resume token: _data of missing or of wrong type. Expected string, got "
            f"{{_data: BinData(0, {entry['token_data'].upper()})}}"
        )


def test_debezium_vectors(shared_dir):
    path = shared_dir / "corpus/resume_tokens/debezium_resume_tokens.json"
    cases = json.loads(path.read_text())
    for case in cases:
        token = {"_data": case["token"]}
        if "tiny double" in case["test_name"]:
            stated = {"decoding_stated_by_source": case["document"]}
            token = _restore_dropped_type_bits(stated, token)
        data = rt.decode(token)
        assert data.to_document()["_data"] == case["token"]
        stated = case["document"]
        assert data.txn_op_index == stated["txnOpIndex"]
        if case.get("checkOnlyTxnOpIndex"):
            continue
        assert data.cluster_time == Timestamp(stated["timestamp"]["t"], stated["timestamp"]["i"])
        assert data.version == stated["version"]
        assert data.token_type == stated["tokenType"]
        if stated.get("documentKey") is not None:
            assert _loose_equal(stated["documentKey"], data.event_identifier_document())


# -- reference §4 ---------------------------------------------------------------------------------

_ROW = re.compile(r"^\| (\d+) \| (.*?) \| (.*?) \| (.*) \|$")


def _reference_rows(shared_dir):
    text = (shared_dir / "reference/resume_tokens.md").read_text()
    section = text[text.index("### 4.1") : text.index("### 4.2")]
    rows = []
    for line in section.splitlines():
        m = _ROW.match(line)
        if not m:
            continue
        tokens = [t for t in re.findall(r"`([0-9A-F]{16,})`", m.group(2))]
        bits = re.search(r"BinData\(0, `([A-Za-z0-9+/=]+)`\)", m.group(2))
        rows.append((int(m.group(1)), tokens, bits and bits.group(1), m.group(3)))
    # The secondary vectors listed as bullets under the table.
    for tok in re.findall(r"`(82[0-9A-F]{20,})`", section.split("secondary")[-1]):
        rows.append((0, [tok], None, ""))
    return rows


def test_reference_vectors(shared_dir):
    rows = _reference_rows(shared_dir)
    assert len(rows) >= 15
    for number, tokens, bits, meaning in rows:
        for tok in tokens:
            doc: dict[str, Any] = {"_data": tok}
            if bits:
                doc["_typeBits"] = Binary(base64.b64decode(bits), 0)
            data = rt.decode(doc)
            assert data.to_document() == doc, number
            if m := re.search(r"ts\((\d+), (\d+)\)", meaning):
                assert data.cluster_time == Timestamp(int(m.group(1)), int(m.group(2)))
            if m := re.match(r"v(\d)", meaning):
                assert data.version == int(m.group(1))
            if "HWM" in meaning:
                assert data.is_high_water_mark
            if m := re.search(r"txnOpIndex (\d+)", meaning):
                assert data.txn_op_index == int(m.group(1))
            if m := re.search(r"uuid ([0-9a-f-]{36})", meaning):
                assert data.uuid == uuid.UUID(m.group(1)).bytes
            if m := re.search(r'ObjectId\("([0-9a-f]{24})"\)', meaning):
                assert str(ObjectId(m.group(1))) in repr(data.event_identifier_document())


def test_reference_vector_12_typebits_make_the_key_doubles(shared_dir):
    data = rt.decode(
        {
            "_data": "82647A41A6000000012B022C0100296E5A10042409C0859BCF45ABBE0E0BD72AB40403"
            "46465F696400461E666F6F002B021E626172002B04000004",
            "_typeBits": Binary(base64.b64decode("gkAB"), 0),
        }
    )
    key = data.event_identifier_document()
    assert key == {"_id": {"foo": 1.0, "bar": 2.0}}
    assert all(type(v) is float for v in key["_id"].values())


def test_invalidate_sorts_right_after_its_drop():
    drop = "82669683C2000000052B042C0100296E5A1004413F85D5B4CF4680AA4D17641E9DF22D463C6F70657261" \
        "74696F6E54797065003C64726F70000004"
    inval = drop.replace("2C0100296E5A", "2C0100296F5A")
    d, i = rt.decode({"_data": drop}), rt.decode({"_data": inval})
    assert not d.from_invalidate and i.from_invalidate
    assert i.event_identifier_document() == {"operationType": "drop"}
    assert rt.sort_key({"_data": drop}) < rt.sort_key({"_data": inval})
