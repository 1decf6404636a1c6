"""`cdcserver replay`: every event is written, also past the 16 MiB batch budget."""

from __future__ import annotations

import bson
import pytest
from bson.int64 import Int64
from bson.timestamp import Timestamp

from cdcserver.cli import replay_events
from pipeline_stages.errors import MongoError


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


def _sample_events(options: dict) -> list:
    from cdcserver.cli import sample_oplog_path

    cmd = {"aggregate": "orders", "pipeline": [{"$changeStream": options}]}
    return [e for batch, _ in replay_events([sample_oplog_path()], cmd, "shop") for e in batch]


def test_what_an_offline_replay_can_and_cannot_look_up():
    """docs/replay.md: inserts and replaces carry their document (it is in the
    oplog); updateLookup finds no current document offline (null, as mongod for a document
    deleted since); pre-/post-images are absent, or 47 NoMatchingDocument when required."""
    events = _sample_events({"fullDocument": "updateLookup"})
    by_type: dict[str, list] = {}
    for e in events:
        by_type.setdefault(e["operationType"], []).append(e)
    assert all(e["fullDocument"]["_id"] == e["documentKey"]["_id"]
               for kind in ("insert", "replace") for e in by_type[kind])
    assert len(by_type["update"]) == 2
    assert all("fullDocument" in e and e["fullDocument"] is None for e in by_type["update"])
    events = _sample_events({"fullDocumentBeforeChange": "whenAvailable"})
    updates = [e for e in events if e["operationType"] in ("update", "replace", "delete")]
    assert updates and all(e.get("fullDocumentBeforeChange") is None for e in updates)
    for options in ({"fullDocumentBeforeChange": "required"}, {"fullDocument": "required"}):
        with pytest.raises(MongoError) as error:
            _sample_events(options)
        assert (error.value.code, error.value.code_name) == (47, "NoMatchingDocument")


def test_replay_writes_the_events_before_a_corrupt_line(tmp_path):
    """A JSON oplog whose line 10 of 19 is corrupt: the 9 events before it are written, then
    the command fails naming the file and the line (exit 1)."""
    import json
    import subprocess
    import sys

    from bson import json_util

    uuid = bson.Binary(bytes(16), 4)
    lines = [json_util.dumps(
        {"op": "i", "ns": "db.c", "ui": uuid, "o": {"_id": i}, "o2": {"_id": i},
         "ts": Timestamp(1_800_000_000, i + 1), "t": Int64(1), "v": Int64(2)},
        json_options=json_util.CANONICAL_JSON_OPTIONS) for i in range(19)]
    lines[9] = lines[9][:25]  # cut in the middle: not JSON
    path = tmp_path / "oplog.jsonl"
    path.write_text("\n".join(lines) + "\n")
    done = subprocess.run(
        [sys.executable, "-m", "cdcserver.cli", "replay", "--oplog", str(path), "--ns", "db.c"],
        capture_output=True, text=True, timeout=120,
    )
    assert done.returncode == 1, done.stderr
    assert f"{path}:10: invalid JSON" in done.stderr
    written = [json.loads(line) for line in done.stdout.splitlines()]
    assert [e["documentKey"]["_id"]["$numberInt"] for e in written] == [str(i) for i in range(9)]
