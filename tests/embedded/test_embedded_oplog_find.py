"""`find` on `local.oplog.rs` as mongod answers it: filters on `ts`, natural order both ways,
limit / skip / projection / batches, and tailable + awaitData cursors (pymongo's
`CursorType.TAILABLE_AWAIT`), so other oplog tailers can use cdcserver as their upstream."""

from __future__ import annotations

import asyncio
import threading

import bson
import pytest
from bson.timestamp import Timestamp
from pymongo import AsyncMongoClient, CursorType, MongoClient, errors

from cdcserver.testing import EmbeddedServer, write_oplog


def _oplog(client):
    return client.local["oplog.rs"]


def _last_ts(client) -> Timestamp:
    return _oplog(client).find_one({}, sort=[("$natural", -1)])["ts"]


def test_find_returns_the_stored_entries_in_natural_order(server, client):
    client.of.c.insert_many([{"_id": i} for i in range(3)])
    found = list(_oplog(client).find())
    assert found == server.entries()
    assert [e["ts"] for e in found] == sorted(e["ts"] for e in found)
    assert found[0]["o"] == {"msg": "initiating set"}


def test_filters_on_ts_and_other_fields(client):
    start = _last_ts(client)
    client.of.f.insert_many([{"_id": i} for i in range(4)])
    client.of.f.delete_one({"_id": 0})
    oplog = _oplog(client)
    after = list(oplog.find({"ts": {"$gt": start}}))
    assert [e["op"] for e in after] == ["c", "i", "i", "i", "i", "d"]
    ts = [e["ts"] for e in after]
    assert [e["ts"] for e in oplog.find({"ts": {"$gte": ts[2]}})] == ts[2:]
    assert [e["ts"] for e in oplog.find({"ts": {"$gt": ts[1], "$lte": ts[3]}})] == ts[2:4]
    assert [e["ts"] for e in oplog.find({"ts": ts[4]})] == [ts[4]]
    assert [e["ts"] for e in oplog.find({"$and": [{"ts": {"$gt": start}}, {"ts": {"$lt": ts[1]}}]})
            ] == ts[:1]
    inserts = list(oplog.find({"ts": {"$gt": start}, "op": "i", "ns": "of.f"}))
    assert [e["o"]["_id"] for e in inserts] == [0, 1, 2, 3]
    assert [e["o"] for e in oplog.find({"ts": {"$gt": start}, "o._id": {"$in": [2, 3]}})] == [
        {"_id": 2}, {"_id": 3},
    ]
    assert list(oplog.find({"ts": {"$gt": start}, "ns": {"$regex": r"^of\.nothing"}})) == []
    assert list(oplog.find({"ts": "not a timestamp"})) == []


def test_reverse_natural_order_limit_skip_projection(client):
    start = _last_ts(client)
    client.of.r.insert_many([{"_id": i} for i in range(5)])
    oplog = _oplog(client)
    last = oplog.find().sort("$natural", -1).limit(1).next()
    assert last["o"] == {"_id": 4}
    newest_first = list(oplog.find({"ts": {"$gt": start}, "op": "i"}).sort("$natural", -1))
    assert [e["o"]["_id"] for e in newest_first] == [4, 3, 2, 1, 0]
    assert [e["o"]["_id"] for e in oplog.find({"ts": {"$gt": start}, "op": "i"}).sort("ts", -1)
            .skip(1).limit(2)] == [3, 2]
    assert [e["o"]["_id"] for e in oplog.find({"ts": {"$gt": start}, "op": "i"}).hint(
        [("$natural", -1)]).limit(1)] == [4]
    projected = list(oplog.find({"ts": {"$gt": start}, "op": "i"}, {"o": 1, "_id": 0}).limit(2))
    assert projected == [{"o": {"_id": 0}}, {"o": {"_id": 1}}]


def test_batches_and_get_more(client):
    start = _last_ts(client)
    client.of.b.insert_many([{"_id": i} for i in range(250)])
    reply = client.local.command({"find": "oplog.rs", "filter": {"ts": {"$gt": start}},
                                  "batchSize": 100})
    assert len(reply["cursor"]["firstBatch"]) == 100 and reply["cursor"]["id"] != 0
    assert reply["cursor"]["ns"] == "local.oplog.rs"
    rest = list(_oplog(client).find({"ts": {"$gt": start}}).batch_size(7))
    assert len(rest) == 251  # the create and 250 inserts
    limited = client.local.command({"find": "oplog.rs", "filter": {"ts": {"$gt": start}},
                                    "limit": 3})
    assert len(limited["cursor"]["firstBatch"]) == 3 and limited["cursor"]["id"] == 0
    single = client.local.command({"find": "oplog.rs", "filter": {"ts": {"$gt": start}},
                                   "batchSize": 2, "singleBatch": True})
    assert single["cursor"]["id"] == 0


def _tail(cursor, n):
    """What a tailer does: iterate, and ask again while the cursor is alive."""
    got = []
    while cursor.alive and len(got) < n:
        for doc in cursor:
            got.append(doc)
            if len(got) == n:
                break
    return got


def test_tailable_await_data_cursor_sees_new_entries(client):
    start = _last_ts(client)
    cursor = _oplog(client).find(
        {"ts": {"$gt": start}}, cursor_type=CursorType.TAILABLE_AWAIT,
        oplog_replay=True,  # what older tailers send (ignored since 4.4, as here)
        no_cursor_timeout=True,
    ).max_await_time_ms(5000)
    assert list(cursor) == []  # nothing yet; the cursor stays open at the end of the oplog
    assert cursor.alive

    def write():
        client.of.t.insert_one({"_id": 1})
        client.of.t.update_one({"_id": 1}, {"$set": {"a": 1}})

    writer = threading.Timer(0.05, write)  # while the getMore waits
    writer.start()
    got = _tail(cursor, 3)
    writer.join()
    assert [e["op"] for e in got] == ["c", "i", "u"]
    assert got[2]["o"] == {"$v": 2, "diff": {"i": {"a": 1}}}
    assert cursor.alive
    client.of.t.delete_one({"_id": 1})
    [delete] = _tail(cursor, 1)
    assert delete["op"] == "d" and delete["ts"] > got[-1]["ts"]
    cursor.close()


def test_await_data_get_more_times_out_with_an_empty_batch(client):
    start = _last_ts(client)
    reply = client.local.command({"find": "oplog.rs", "filter": {"ts": {"$gt": start}},
                                  "tailable": True, "awaitData": True})
    cid = reply["cursor"]["id"]
    assert reply["cursor"]["firstBatch"] == [] and cid != 0
    more = client.local.command({"getMore": cid, "collection": "oplog.rs", "maxTimeMS": 20})
    assert more["cursor"] == {"nextBatch": [], "id": cid, "ns": "local.oplog.rs"}
    client.of.w.insert_one({"_id": 1})
    more = client.local.command({"getMore": cid, "collection": "oplog.rs", "maxTimeMS": 20})
    assert [e["op"] for e in more["cursor"]["nextBatch"]] == ["c", "i"]
    client.local.command({"killCursors": "oplog.rs", "cursors": [cid]})
    with pytest.raises(errors.OperationFailure) as info:
        client.local.command({"getMore": cid, "collection": "oplog.rs"})
    assert info.value.code == 43


def test_tailable_without_await_data_answers_at_once(client):
    start = _last_ts(client)
    cursor = _oplog(client).find({"ts": {"$gt": start}}, cursor_type=CursorType.TAILABLE)
    assert list(cursor) == [] and cursor.alive
    client.of.nt.insert_one({"_id": 1})
    assert [e["op"] for e in cursor] == ["c", "i"]
    assert cursor.alive
    cursor.close()


def test_tailable_with_a_filter_skips_what_does_not_match(client):
    start = _last_ts(client)
    cursor = _oplog(client).find(
        {"ts": {"$gt": start}, "op": "d"}, cursor_type=CursorType.TAILABLE_AWAIT
    ).max_await_time_ms(50)
    client.of.fd.insert_many([{"_id": i} for i in range(3)])
    assert list(cursor) == []
    client.of.fd.delete_many({})
    got = _tail(cursor, 3)
    assert [e["o"] for e in got] == [{"_id": 0}, {"_id": 1}, {"_id": 2}]
    cursor.close()


def test_option_errors(client):
    def fails(cmd, code, message, db="local"):
        with pytest.raises(errors.OperationFailure) as info:
            client[db].command(cmd)
        assert (info.value.code, info.value.details["errmsg"]) == (code, message)

    fails({"find": "oplog.rs", "awaitData": True}, 9,
          "Cannot set 'awaitData' without also setting 'tailable'")
    fails({"find": "oplog.rs", "tailable": True, "sort": {"$natural": -1}}, 2,
          "cannot use tailable option with a sort other than {$natural: 1}")
    fails({"find": "oplog.rs", "tailable": True, "singleBatch": True}, 2,
          "cannot use tailable option with the 'singleBatch' option")
    fails({"find": "oplog.rs", "sort": {"$natural": 2}}, 2,
          "$natural sort cannot be set to a value other than -1 or 1.")
    client.of.plain.insert_one({})
    fails({"find": "plain", "tailable": True}, 2,
          "error processing query: ns=of.plainTree: $and\nSort: {}\nProj: {}\n tailable cursor "
          "requested on non capped collection", db="of")
    with pytest.raises(errors.OperationFailure) as info:
        list(client.of.plain.find(cursor_type=CursorType.TAILABLE))
    assert info.value.code == 2


def test_capped_position_lost():
    with EmbeddedServer(oplog_size_bytes=4000) as s, s.client() as client:
        client.cap.c.insert_one({"_id": 0})
        session = client.start_session()  # the raw cursor's, for its getMore
        reply = client.local.command({"find": "oplog.rs", "tailable": True, "awaitData": True},
                                     session=session)
        cid = reply["cursor"]["id"]
        cursor = client.local["oplog.rs"].find(
            {}, cursor_type=CursorType.TAILABLE_AWAIT
        ).max_await_time_ms(10)
        assert len(list(cursor)) == len(reply["cursor"]["firstBatch"]) and cursor.alive
        for i in range(1, 100):  # the oplog wraps past the cursors' positions
            client.cap.c.insert_one({"_id": i, "pad": "x" * 100})
        with pytest.raises(errors.OperationFailure) as info:
            client.local.command({"getMore": cid, "collection": "oplog.rs", "maxTimeMS": 10},
                                 session=session)
        session.end_session()
        assert info.value.code == 136
        assert info.value.details["codeName"] == "CappedPositionLost"
        assert info.value.details["errmsg"].startswith(
            "CollectionScan died due to position in capped collection being deleted. Last seen "
            "record id: RecordId("
        )
        # pymongo takes it as the end of a tailable cursor (the capped collection rolled over).
        assert list(cursor) == [] and not cursor.alive


def test_a_recorded_oplog_is_readable_too(cdcserver_factory, tmp_path, server, client):
    client.rec.c.insert_many([{"_id": i} for i in range(3)])
    path = write_oplog(tmp_path / "oplog.bson", server.entries())
    served = cdcserver_factory(path)
    with MongoClient(served.direct_uri) as other:
        assert list(other.local["oplog.rs"].find()) == server.entries()
        last = other.local["oplog.rs"].find_one({}, sort=[("$natural", -1)])
        assert last["o"] == {"_id": 2}


def test_async_client_tails(server):
    async def main():
        client = AsyncMongoClient(server.direct_uri)
        try:
            oplog = client.local["oplog.rs"]
            last = await oplog.find_one({}, sort=[("$natural", -1)])
            cursor = oplog.find({"ts": {"$gt": last["ts"]}},
                                cursor_type=CursorType.TAILABLE_AWAIT).max_await_time_ms(5000)
            got = [e async for e in cursor]
            assert got == []
            waiting = asyncio.ensure_future(cursor.next())
            await asyncio.sleep(0.05)
            await client.asy.c.insert_one({"_id": 1})
            first = await waiting
            second = await cursor.next()
            await cursor.close()
            return [first["op"], second["op"]], second["o"]
        finally:
            await client.close()

    ops, o = asyncio.run(main())
    assert ops == ["c", "i"] and o == {"_id": 1}


def test_entries_are_sent_as_stored(server, client):
    client.raw.c.insert_one({"_id": 1, "d": {"b": 1, "a": 2}})
    from bson.codec_options import CodecOptions
    from bson.raw_bson import RawBSONDocument

    raw_oplog = client.get_database(
        "local", codec_options=CodecOptions(document_class=RawBSONDocument)
    )["oplog.rs"]
    sent = [e.raw for e in raw_oplog.find()]
    assert sent == [bytes(r) for r in server.store.oplog_entries()]
    assert bson.decode(sent[-1])["o"] == {"_id": 1, "d": {"b": 1, "a": 2}}


def test_count_aggregate_and_list_collections(server, client):
    start = _last_ts(client)
    client.of.agg.insert_many([{"_id": i, "k": i % 2} for i in range(6)])
    oplog = _oplog(client)
    assert oplog.estimated_document_count() == len(server.entries())
    assert oplog.count_documents({"ts": {"$gt": start}}) == 7
    assert oplog.count_documents({"ts": {"$gt": start}, "op": "i", "o.k": 1}) == 3
    assert client.local.command({"count": "oplog.rs", "query": {"ts": {"$gt": start}},
                                 "limit": 2})["n"] == 2
    grouped = list(oplog.aggregate([
        {"$match": {"ts": {"$gt": start}}},
        {"$group": {"_id": "$op", "n": {"$sum": 1}}},
        {"$sort": {"_id": 1}},
    ]))
    assert grouped == [{"_id": "c", "n": 1}, {"_id": "i", "n": 6}]
    assert [e["o"] for e in oplog.aggregate([{"$match": {"ts": {"$gt": start}, "op": "i"}},
                                             {"$limit": 2}])] == [{"_id": 0, "k": 0},
                                                                  {"_id": 1, "k": 1}]
    [info] = client.local.list_collections(filter={"name": "oplog.rs"})
    assert info["options"]["capped"] is True and info["type"] == "collection"
    assert "oplog.rs" in client.local.list_collection_names()
