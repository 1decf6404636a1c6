"""Strings that are not UTF-8 through the `--shards` front: routed by a shard key that holds
them, stored on the shards, read back and streamed byte for byte (as mongos and its shards keep
them; tests/embedded/test_strings_not_utf8.py has the single-server cases)."""

from __future__ import annotations

from bson.codec_options import CodecOptions
from bson.raw_bson import RawBSONDocument

from tests.embedded.test_strings_not_utf8 import (
    NOT_UTF8,
    int_element,
    raw_document,
    string_element,
)

RAW = CodecOptions(document_class=RawBSONDocument, unicode_decode_error_handler="surrogateescape")


def test_routed_stored_and_streamed_byte_for_byte(client):
    client.admin.command("shardCollection", "u8.c", key={"s": 1})
    coll = client.get_database("u8", codec_options=RAW).c
    docs = [raw_document(int_element(b"_id", i), string_element(b"s", NOT_UTF8 + bytes([i])))
            for i in range(1, 4)]
    with coll.watch(full_document="updateLookup") as stream:
        coll.insert_many(docs)
        coll.update_many({}, {"$set": {"n": 1}})
        events = [stream.next() for _ in range(6)]
    assert sorted(d.raw for d in coll.find({}, {"n": 0})) == sorted(d.raw for d in docs)
    inserted = sorted(e["fullDocument"].raw for e in events if e["operationType"] == "insert")
    assert inserted == sorted(d.raw for d in docs)
    updated = [e["fullDocument"].raw for e in events if e["operationType"] == "update"]
    assert len(updated) == 3 and all(NOT_UTF8 in raw for raw in updated)
