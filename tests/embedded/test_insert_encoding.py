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
            {"_id": 4, "n": {"a": [1, {"d": datetime.datetime(2024, 1, 2, tzinfo=tz)}]},
             "same": {"x": [1, 2]}, "s": "\t"},
        ])
        d = coll.find_one({"_id": 1})["d"]
        assert d == datetime.datetime(2024, 5, 1, 10, 0, 0, 123000, tzinfo=datetime.UTC)
        two = coll.find_one({"_id": 2})
        assert two["t"] != Timestamp(0, 0) and two["in"]["t"] != Timestamp(0, 0)
        assert coll.find_one({"_id": 3}) == {"_id": 3, "zeros": 0, "f": 0.0}
        # the stored dates are naive UTC, as the engine compares them, nested ones too
        stored = server.call(lambda: list(server.store.get("enc", "c").records.values()))
        assert stored[0]["d"].tzinfo is None
        assert stored[3]["n"]["a"][1]["d"] == datetime.datetime(2024, 1, 1, 22)
        assert coll.count_documents({"n.a.d": {"$lt": datetime.datetime(2024, 1, 1, 23)}}) == 1
        for doc in stored:
            assert _inserted_o(server, doc["_id"]) == bson.encode(doc)


def test_entries_spliced_as_encoding_them_whole(cdcserver_embedded: EmbeddedServer) -> None:
    """An insert's entry is built from its head's bytes (kept while the namespace and session
    are the same), the document's and its tail's: byte for byte what encoding it whole gives,
    across sessions, namespaces and commands that interleave."""
    server = cdcserver_embedded
    with server.client() as retryable, server.client(retryWrites=False) as plain:
        for round_ in range(2):
            for tag, client in (("", retryable), ("p", plain)):
                for name in ("a", "b"):
                    client.enc[name].insert_many(
                        [{"_id": f"{tag}{round_}{name}{i}", "n": i} for i in range(3)])
                    client.enc[name].insert_one({"_id": f"{tag}{round_}{name}-one"})
            with retryable.start_session() as s:
                retryable.enc.a.insert_many([{"_id": f"{round_}s{i}"} for i in range(2)],
                                            session=s)
    inserts = [bson.decode(raw) for raw in server.call(server.store.oplog_entries)
               if bson.decode(raw)["op"] == "i"]
    assert len(inserts) == 2 * (2 * 2 * 4 + 2)
    for raw in server.call(server.store.oplog_entries):
        assert bson.encode(bson.decode(raw)) == raw
    orders = {tuple(e) for e in inserts}
    assert orders == {
        ("lsid", "txnNumber", "op", "ns", "ui", "o", "o2", "stmtId", "ts", "t", "v", "wall",
         "prevOpTime"),
        ("op", "ns", "ui", "o", "o2", "ts", "t", "v", "wall"),
    }
    by_id = {e["o"]["_id"]: e for e in inserts}
    assert by_id["0a1"]["ns"] == "enc.a" and by_id["0b1"]["ns"] == "enc.b"
    assert "lsid" not in by_id["p0a1"] and by_id["p1b1"]["ns"] == "enc.b"
    assert by_id["0a1"]["stmtId"] == 1 and by_id["0a1"]["txnNumber"] != by_id["1a1"][
        "txnNumber"]


_IDS = [7, -2**40, 2.5, "k", "", bson.ObjectId(), True, None, bson.Int64(9),
        datetime.datetime(2024, 1, 2, 3, 4, 5, 6000), Timestamp(5, 6),
        bson.Decimal128("1.5"), {"a": 1, "b": [1]}, bson.Binary(b"\x00\x01", 4),
        bson.Binary(b"xy", 0), bson.MinKey(), bson.regex.Regex("a", "i")]


def test_insert_tail_packed_as_encoded() -> None:
    """An insert entry's fields after `o`, packed, are what bson.encode gives for them, for
    every `_id` type (those it cannot copy from `o` fall back: None), with and without a
    session, a statement id and a previous write."""
    from cdcserver.embedded.oplog_writer import NULL_OP_TIME, _insert_tail

    ts, prev = Timestamp(1_700_000_000, 42), Timestamp(1_699_999_999, 7)
    wall = datetime.datetime(2024, 5, 1, 12, 0, 0, 123000)
    wall_ms = 1714564800123
    copied = 0
    for _id in _IDS:
        o_raw = bson.encode({"_id": _id, "x": 1})
        for in_session, stmt_id, prev_ts in ((False, None, None), (True, 0, None),
                                             (True, 3, prev), (True, None, prev)):
            tail: dict[str, object] = {"o2": {"_id": _id}}
            if in_session and stmt_id is not None:
                tail["stmtId"] = stmt_id
            tail.update(ts=ts, t=bson.Int64(1), v=bson.Int64(2), wall=wall)
            if in_session:
                tail["prevOpTime"] = (dict(NULL_OP_TIME) if prev_ts is None
                                      else {"ts": prev_ts, "t": bson.Int64(1)})
            packed = _insert_tail(o_raw, in_session, stmt_id, ts, wall_ms, prev_ts)
            if packed is not None:
                copied += 1
                assert packed == bson.encode(tail), (_id, in_session, stmt_id)
    assert copied == 4 * (len(_IDS) - 2)  # all but MinKey's and the regex's are copied


def test_insert_entries_of_every_id_type(cdcserver_embedded: EmbeddedServer) -> None:
    """Through the server: each insert entry's o2 is its document's `_id`, and the entry is
    byte for byte its own encoding, in and out of a session."""
    server = cdcserver_embedded
    with server.client() as retryable, server.client(retryWrites=False) as plain:
        retryable.enc.ids.insert_many([{"_id": i, "n": 1} for i in _IDS[:9]])
        plain.enc.ids.insert_many([{"_id": i, "n": 2} for i in _IDS[9:-1]])  # no regex _id
    entries = [bson.decode(raw) for raw in server.call(server.store.oplog_entries)]
    inserts = [e for e in entries if e["op"] == "i" and e["ns"] == "enc.ids"]
    assert len(inserts) == len(_IDS) - 1
    for raw in server.call(server.store.oplog_entries):
        assert bson.encode(bson.decode(raw)) == raw
    prev = None
    for e in inserts[:9]:
        assert e["o2"] == {"_id": e["o"]["_id"]}
        assert e["prevOpTime"]["ts"] == (Timestamp(0, 0) if prev is None else prev)
        prev = e["ts"]
    assert [e["stmtId"] for e in inserts[:9]] == list(range(9))
    assert all("stmtId" not in e and "prevOpTime" not in e for e in inserts[9:])
    assert [e["o2"]["_id"] for e in inserts] == [e["o"]["_id"] for e in inserts]
