"""A change-stream getMore without batchSize returns what there is, up to a 16 MiB reply.

mongod's getMore has no default batch size (getmore_cmd.cpp: the batch ends at the 16 MiB
reply budget or when the oplog scan reaches its end); only the initial aggregate defaults to
101. Checked through pymongo against the embedded server.
"""

from __future__ import annotations

from typing import Any

from bson.codec_options import CodecOptions
from bson.raw_bson import RawBSONDocument

from cdcserver.testing import EmbeddedServer

RAW = CodecOptions(document_class=RawBSONDocument)
MAX_BATCH_BYTES = 16 * 1024 * 1024


def _open(db: Any) -> int:
    reply = db.command(
        "aggregate", "c", pipeline=[{"$changeStream": {}}], cursor={"batchSize": 0}
    )
    assert reply["cursor"]["firstBatch"] == []
    return reply["cursor"]["id"]


def _get_more(db: Any, cursor_id: int, **extra: Any) -> RawBSONDocument:
    return db.command(
        "getMore", cursor_id, collection="c", maxTimeMS=10, codec_options=RAW, **extra
    )


def test_small_backlog_comes_back_in_one_get_more() -> None:
    with EmbeddedServer() as server, server.client() as client:
        db = client.t
        cursor_id = _open(db)
        db.c.insert_many([{"_id": i} for i in range(500)])
        batch = _get_more(db, cursor_id)["cursor"]["nextBatch"]
        assert [e["documentKey"]["_id"] for e in batch] == list(range(500))
        # with a batchSize the batch has that many
        cursor_id = _open(db)
        db.c.insert_many([{"_id": 1000 + i} for i in range(150)])
        batch = _get_more(db, cursor_id, batchSize=120)["cursor"]["nextBatch"]
        assert [e["documentKey"]["_id"] for e in batch] == [1000 + i for i in range(120)]
        batch = _get_more(db, cursor_id)["cursor"]["nextBatch"]
        assert [e["documentKey"]["_id"] for e in batch] == [1120 + i for i in range(30)]


def test_backlog_over_16_mib_comes_back_in_replies_within_the_budget() -> None:
    with EmbeddedServer(oplog_size_bytes=1 << 30) as server, server.client() as client:
        db = client.t
        cursor_id = _open(db)
        n = 40
        payload = "x" * (1 << 20)  # 40 events of ~1 MiB: ~40 MiB
        for i in range(0, n, 5):
            db.c.insert_many([{"_id": j, "p": payload} for j in range(i, i + 5)])
        ids: list[int] = []
        tokens: list[str] = []
        sizes: list[int] = []
        while len(ids) < n:
            cursor = _get_more(db, cursor_id)["cursor"]
            batch = cursor["nextBatch"]
            assert batch, "a getMore came back empty with events still to return"
            sizes.append(len(batch))
            assert sum(len(e.raw) for e in batch) <= MAX_BATCH_BYTES
            ids += [e["documentKey"]["_id"] for e in batch]
            tokens += [e["_id"]["_data"] for e in batch]
            # the post-batch token is the last event's while events remain
            assert cursor["postBatchResumeToken"]["_data"] == batch[-1]["_id"]["_data"]
        assert ids == list(range(n))  # none lost, none repeated, in order
        assert tokens == sorted(tokens) and len(set(tokens)) == n
        assert len(sizes) >= 3 and max(sizes) > 10  # several replies, each holding many events
        # then nothing more
        assert _get_more(db, cursor_id)["cursor"]["nextBatch"] == []
