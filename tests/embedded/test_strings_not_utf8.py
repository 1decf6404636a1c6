"""Strings whose bytes are not UTF-8, stored and served as mongod serves them.

mongod validates a document's structure, not its strings' UTF-8: an application can store such
bytes and read them back unchanged, and its change streams carry them (the Node.js driver's
utf8_validation tests rely on it). A duplicate-key message quotes such a key as "0x<hex>" and cuts
a long key at 150 bytes, which may be inside a character (buildDupKeyErrorStatus,
BSONElement::toString). pymongo cannot encode such strings itself, so the documents go in as
RawBSONDocuments built byte by byte, and come back as RawBSONDocuments.
"""

from __future__ import annotations

import json
import pathlib
import shutil
import struct
import subprocess

import bson
import pytest
from bson import json_util
from bson.codec_options import CodecOptions
from bson.raw_bson import RawBSONDocument

from cdcserver.testing import EmbeddedServer

RAW = CodecOptions(document_class=RawBSONDocument, unicode_decode_error_handler="surrogateescape")
NOT_UTF8 = b"caf\xc3\x01\xc3\x01\xff"  # two broken sequences and a lone 0xFF
NODE = shutil.which("node")
NODE_DIR = pathlib.Path(__file__).parent.parent / "node"
CANONICAL = json_util.JSONOptions(json_mode=json_util.JSONMode.CANONICAL)


def raw_document(*elements: bytes) -> RawBSONDocument:
    body = b"".join(elements)
    return RawBSONDocument(struct.pack("<i", len(body) + 5) + body + b"\x00")


def string_element(name: bytes, data: bytes) -> bytes:
    return b"\x02" + name + b"\x00" + struct.pack("<i", len(data) + 1) + data + b"\x00"


def int_element(name: bytes, value: int) -> bytes:
    return b"\x10" + name + b"\x00" + struct.pack("<i", value)


def not_utf8_document(_id: int, data: bytes = NOT_UTF8) -> RawBSONDocument:
    return raw_document(int_element(b"_id", _id), string_element(b"s", data))


@pytest.fixture(params=["in-memory", "durable"])
def store_kind(request):
    return request.param


def test_stored_and_read_back_byte_for_byte(tmp_path, store_kind):
    data_dir = tmp_path if store_kind == "durable" else None
    doc = not_utf8_document(1)
    with EmbeddedServer(data_dir) as server:
        coll = server.client().get_database("t", codec_options=RAW).c
        coll.insert_one(doc)
        assert coll.find_one().raw == doc.raw
        # another field changed: the string's bytes stay as they were
        coll.update_one({"_id": 1}, {"$set": {"n": 1}})
        after = coll.find_one()
        assert after.raw.startswith(doc.raw[4:-1], 4) and NOT_UTF8 in after.raw
        expected = after.raw
    if data_dir is not None:  # and after a restart, from the data files
        with EmbeddedServer(data_dir) as server:
            assert server.client().get_database("t", codec_options=RAW).c.find_one().raw == expected


def test_aggregation_carries_the_bytes():
    with EmbeddedServer() as server:
        coll = server.client().get_database("t", codec_options=RAW).c
        coll.insert_one(not_utf8_document(1))
        out = list(coll.aggregate([{"$project": {"t": {"$concat": ["$s", "!"]}}}]))
        assert out[0].raw == raw_document(int_element(b"_id", 1),
                                          string_element(b"t", NOT_UTF8 + b"!")).raw


def test_a_regex_does_not_match_bytes_that_are_not_utf8():
    # mongod's PCRE checks the subject's UTF-8: the match fails, it is not an error.
    with EmbeddedServer() as server:
        coll = server.client().get_database("t", codec_options=RAW).c
        coll.insert_many([not_utf8_document(1), not_utf8_document(2, b"cafe")])
        for pattern in ("^caf", "^(c)a\\1?f"):  # RE2's and the fallback's
            found = [d["_id"] for d in coll.find({"s": {"$regex": pattern}})]
            assert found == [2], pattern


@pytest.mark.parametrize("pipeline", [[], [{"$match": {"operationType": {"$in": ["insert",
                                                                                  "update"]}}}]])
def test_change_events_carry_the_bytes_and_resume(pipeline):
    doc = not_utf8_document(1)
    with EmbeddedServer() as server:
        coll = server.client().get_database("t", codec_options=RAW).c
        with coll.watch(pipeline, full_document="updateLookup") as stream:
            coll.insert_one(doc)
            coll.update_one({"_id": 1}, {"$set": {"n": 1}})
            insert, update = stream.next(), stream.next()
        assert insert["operationType"] == "insert" and insert["fullDocument"].raw == doc.raw
        assert update["operationType"] == "update" and NOT_UTF8 in update["fullDocument"].raw
        with coll.watch(pipeline, resume_after=insert["_id"]) as resumed:
            assert resumed.next()["_id"] == update["_id"]


def test_a_unique_key_that_is_not_utf8_is_quoted_as_hex():
    with EmbeddedServer() as server:
        db = server.client().get_database("t", codec_options=RAW)
        db.c.create_index("s", unique=True)
        db.c.insert_one(not_utf8_document(1))
        reply = db.command("insert", "c", documents=[not_utf8_document(2)],
                           codec_options=RAW)
        error = reply["writeErrors"][0]
        assert error["code"] == 11000
        assert error["errmsg"] == (
            "E11000 duplicate key error collection: t.c index: s_1 dup key: "
            f'{{ s: "0x{NOT_UTF8.hex()}" }}')
        assert error["keyValue"].raw == raw_document(string_element(b"s", NOT_UTF8)).raw


def test_a_long_duplicate_key_is_cut_at_150_bytes_inside_a_character():
    key = "\U0001F92A" * 100  # four bytes each: 150 bytes end two bytes into the 38th
    with EmbeddedServer() as server:
        db = server.client().get_database("t", codec_options=RAW)
        db.c.insert_one({"_id": key})
        reply = db.command("insert", "c", documents=[{"_id": key}], codec_options=RAW)
        quoted = key.encode()[:150] + b'..." }'  # in the reply's own bytes
        assert quoted in reply["writeErrors"][0].raw
        # the keyValue keeps the whole key
        assert reply["writeErrors"][0]["keyValue"].raw == bson.encode({"_id": key})


@pytest.mark.skipif(NODE is None, reason="node is not installed: the Node.js driver test needs it")
def test_the_node_driver_reads_them_as_against_mongod(node_driver):
    """The Node.js driver's utf8_validation tests, against cdcserver: the duplicate-key reply
    holds invalid UTF-8 the driver replaces; documents read without validation, and with it
    the driver itself refuses them (BSONError)."""
    with EmbeddedServer() as server:
        server.client().get_database("t", codec_options=RAW).c.insert_one(not_utf8_document(1))
        config = {"uri": f"mongodb://{server.address}/?directConnection=true", "db": "t",
                  "coll": "c"}
        out = subprocess.run(
            [NODE, str(NODE_DIR / "utf8.mjs"), json_util.dumps(config, json_options=CANONICAL)],
            capture_output=True, text=True, timeout=60, cwd=NODE_DIR, check=True,
        ).stdout
    lines = [json.loads(line) for line in out.splitlines()]
    assert "error" not in lines[0], lines
    dup = lines[0]["dupKey"]
    assert dup["name"] == "MongoServerError" and "duplicate" in dup["message"].lower()
    assert "utf" not in dup["message"].lower() and "\ufffd" in dup["errmsg"]
    assert [d["_id"] for d in lines[1]["unvalidated"]] == [{"$numberInt": "1"}]
    assert lines[2]["validated"]["name"] == "BSONError"
    assert "Invalid UTF-8 string in BSON document" in lines[2]["validated"]["message"]
