"""Recorded oplogs in relaxed Extended JSON (mongoexport's and mongosh's default).

Relaxed JSON writes a NumberLong as a plain number, so `txnNumber`, `t`, `v` read back as
int32: the file is read with the types mongod gives those fields, and serves the same events
as the same oplog in BSON. A file whose entries have a field of a type mongod never writes is
refused when `serve` starts, naming the file, the line and the fix, never at `watch()`.
"""

from __future__ import annotations

import pathlib

import bson
import pytest
from bson import json_util
from bson.raw_bson import RawBSONDocument
from pymongo import MongoClient

from cdcserver.testing import EmbeddedServer, SubprocessServer, read_oplog, write_oplog


def _record(tmp_path: pathlib.Path) -> list[RawBSONDocument]:
    """A real oplog: plain writes, retryable writes (txnNumber) and a transaction."""
    server = EmbeddedServer()
    try:
        client: MongoClient = MongoClient(server.uri, retryWrites=True)
        coll = client.shop.orders
        coll.insert_one({"_id": 1, "n": 1})
        with client.start_session() as session:
            coll.insert_one({"_id": 2, "n": 2}, session=session)  # retryable: lsid, txnNumber
            coll.update_one({"_id": 2}, {"$inc": {"n": 1}}, session=session)
            with session.start_transaction():
                coll.insert_one({"_id": 3}, session=session)
                coll.delete_one({"_id": 1}, session=session)
        client.close()
        return read_oplog(server)
    finally:
        server.stop()


def _relaxed(entries: list[RawBSONDocument], path: pathlib.Path) -> pathlib.Path:
    with open(path, "w") as f:
        for raw in entries:
            doc = bson.decode(raw.raw)
            f.write(json_util.dumps(doc, json_options=json_util.RELAXED_JSON_OPTIONS) + "\n")
    return path


def _events(server: SubprocessServer, start) -> list[bytes]:
    client: MongoClient = MongoClient(server.uri, document_class=RawBSONDocument)
    try:
        out = []
        with client.watch(start_at_operation_time=start, max_await_time_ms=200) as stream:
            while (event := stream.try_next()) is not None:
                out.append(event.raw)
        return out
    finally:
        client.close()


def test_relaxed_export_serves_the_bson_events(tmp_path: pathlib.Path) -> None:
    entries = _record(tmp_path)
    relaxed = _relaxed(entries, tmp_path / "relaxed.jsonl")
    assert '"txnNumber": 1,' in relaxed.read_text()  # a plain number, as mongoexport writes it
    bson_file = write_oplog(tmp_path / "oplog.bson", entries)
    start = entries[0]["ts"]
    by_format = {}
    for name, path in (("bson", bson_file), ("relaxed", relaxed)):
        server = SubprocessServer([path], follow=False)
        try:
            by_format[name] = _events(server, start)
        finally:
            server.stop()
    assert len(by_format["bson"]) >= 5
    assert by_format["relaxed"] == by_format["bson"]


def test_a_bad_field_type_is_refused_at_start(tmp_path: pathlib.Path) -> None:
    entries = _record(tmp_path)
    lines = _relaxed(entries, tmp_path / "ok.jsonl").read_text().splitlines()
    # A transaction's applyOps: the entry whose txnNumber the change-stream stages check.
    n = next(i for i, line in enumerate(lines) if '"txnNumber"' in line and "applyOps" in line)
    doc = json_util.loads(lines[n])
    doc["txnNumber"] = "one"
    lines[n] = json_util.dumps(doc)
    bad = tmp_path / "bad.jsonl"
    bad.write_text("\n".join(lines) + "\n")
    with pytest.raises(RuntimeError) as refused:
        SubprocessServer([bad], follow=False).stop()
    message = str(refused.value)
    assert f"{bad}:{n + 1}: field txnNumber should be long, found: string" in message
