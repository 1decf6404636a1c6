"""An inserted document is encoded once (issue 30): the bytes stored are the entry's `o`, and
the forms normalize() changes (tz-aware or sub-millisecond datetimes, empty Timestamps) are
still changed where the insert path now skips it for documents that cannot hold them."""

from __future__ import annotations

import datetime

import bson
from bson.raw_bson import RawBSONDocument
from bson.son import SON
from bson.timestamp import Timestamp

from cdcserver.testing import EmbeddedServer


def _inserted_o(server: EmbeddedServer, _id: object) -> bytes:
    """The raw `o` of the insert entry of `_id`."""
    for raw in server.call(server.store.oplog_entries):
        entry = RawBSONDocument(raw)
        if entry["op"] == "i" and entry["o"]["_id"] == _id:
            return bytes(entry["o"].raw)
    raise AssertionError(f"no insert of {_id!r}")


def test_entry_o_is_the_stored_document(cdcserver_embedded: EmbeddedServer) -> None:
    server = cdcserver_embedded
    with server.client() as client:
        coll = client.enc.c
        docs = [{"_id": i, "s": f"v{i}", "n": {"x": [i, 1.5]}} for i in range(5)]
        coll.insert_many(docs)
        for d in docs:
            stored = server.call(lambda d=d: server.store.get("enc", "c").records)
            (doc,) = [v for v in stored.values() if v["_id"] == d["_id"]]
            assert _inserted_o(server, d["_id"]) == bson.encode(doc) == bson.encode(d)


def test_id_moved_first_in_document_and_entry(cdcserver_embedded: EmbeddedServer) -> None:
    server = cdcserver_embedded
    with server.client() as client:
        coll = client.enc.c
        # a RawBSONDocument is sent as it is: `_id` second, as no driver reorders it
        coll.insert_one(RawBSONDocument(bson.encode(SON([("a", 1), ("_id", 7)]))))
        assert list(coll.find_one({"_id": 7})) == ["_id", "a"]
        assert list(bson.decode(_inserted_o(server, 7))) == ["_id", "a"]


def test_dates_and_empty_timestamps_still_normalized(cdcserver_embedded: EmbeddedServer) -> None:
    server = cdcserver_embedded
    tz = datetime.timezone(datetime.timedelta(hours=2))
    with server.client(tz_aware=True) as client:
        coll = client.enc.c
        coll.insert_many([
            {"_id": 1, "d": datetime.datetime(2024, 5, 1, 12, 0, 0, 123456, tzinfo=tz)},
            {"_id": 2, "t": Timestamp(0, 0), "in": {"t": Timestamp(0, 0)}},
            {"_id": 3, "zeros": bson.Int64(0), "f": 0.0},  # eight zero bytes, no timestamp
        ])
        d = coll.find_one({"_id": 1})["d"]
        assert d == datetime.datetime(2024, 5, 1, 10, 0, 0, 123000, tzinfo=datetime.UTC)
        two = coll.find_one({"_id": 2})
        assert two["t"] != Timestamp(0, 0) and two["in"]["t"] != Timestamp(0, 0)
        assert coll.find_one({"_id": 3}) == {"_id": 3, "zeros": 0, "f": 0.0}
        # the stored dates are naive UTC, as the engine compares them
        stored = server.call(lambda: list(server.store.get("enc", "c").records.values()))
        assert stored[0]["d"].tzinfo is None
        for doc in stored:
            assert _inserted_o(server, doc["_id"]) == bson.encode(doc)
