"""`cdcserver replay`: every event is written, also past the 16 MiB batch budget."""

from __future__ import annotations

import bson
from bson.int64 import Int64
from bson.timestamp import Timestamp

from cdcserver.cli import replay_events


def test_replay_writes_events_beyond_one_reply_budget(tmp_path):
    path = tmp_path / "oplog.bson"
    uuid = bson.Binary(bytes(16), 4)
    path.write_bytes(b"".join(
        bson.encode({"op": "i", "ns": "db.c", "ui": uuid, "o": {"_id": i, "pad": "x" * 20_000},
                     "o2": {"_id": i}, "ts": Timestamp(1_800_000_000, i + 1), "t": Int64(1),
                     "v": Int64(2)})
        for i in range(1000)  # ~20 MB of events from one read of the oplog
    ))
    cmd = {"aggregate": "c", "pipeline": [{"$changeStream": {}}]}
    events = [e for batch, _ in replay_events([str(path)], cmd, "db") for e in batch]
    assert [e["documentKey"]["_id"] for e in events] == list(range(1000))
