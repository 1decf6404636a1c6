"""Crash test: a `cdcserver serve --data-dir` process is killed with SIGKILL in the middle of a
stream of acknowledged writes (default write concern, and `j: true`). After a restart every
acknowledged write and its oplog entry are there, the data and the oplog agree, and a change
stream consumer that resumes from the last token it got receives the rest exactly once."""

from __future__ import annotations

import threading

import pytest
from pymongo import MongoClient, WriteConcern, errors

from cdcserver.testing import SubprocessServer, read_oplog

ACKED_BEFORE_KILL = 60  # writes acknowledged before the kill (the kill lands during more)
HANG_GUARD_S = 30.0  # a guard against hanging, never a performance expectation


def _key(event_or_entry) -> tuple:
    if "operationType" in event_or_entry:
        e = event_or_entry
        op = {"insert": "i", "update": "u", "delete": "d", "replace": "u"}[e["operationType"]]
        ns = f"{e['ns']['db']}.{e['ns']['coll']}"
        return op, ns, e["documentKey"]["_id"]
    e = event_or_entry
    doc_id = e["o2"]["_id"] if e["op"] == "u" else e["o"]["_id"]
    return e["op"], e["ns"], doc_id


class Writer(threading.Thread):
    """Writes until the server dies: insert (w:1, the default), insert (j:true), $inc."""

    def __init__(self, uri: str) -> None:
        super().__init__(daemon=True)
        self.client = MongoClient(uri, serverSelectionTimeoutMS=1000, retryWrites=True)
        self.acked: list[tuple[str, int]] = []
        self.attempted: list[tuple[str, int]] = []
        self.enough = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        db = self.client.crash
        journaled = db.get_collection("j", write_concern=WriteConcern(w=1, j=True))
        try:
            for i in range(1_000_000):
                for kind in ("w1", "j", "inc"):
                    self.attempted.append((kind, i))
                    if kind == "w1":
                        db.w1.insert_one({"_id": i, "pad": "x" * 64})
                    elif kind == "j":
                        journaled.insert_one({"_id": i})
                    else:
                        db.counter.update_one({"_id": 0}, {"$inc": {"n": 1}}, upsert=True)
                    self.acked.append((kind, i))
                if len(self.acked) >= ACKED_BEFORE_KILL * 3:
                    self.enough.set()
        except errors.PyMongoError as exc:  # the server was killed
            self.error = exc
        finally:
            self.enough.set()
            self.client.close()


class Consumer(threading.Thread):
    """A change stream on the database, reading until the server dies."""

    def __init__(self, uri: str) -> None:
        super().__init__(daemon=True)
        self.client = MongoClient(uri, serverSelectionTimeoutMS=1000)
        self.events: list[dict] = []
        self.opened = threading.Event()
        self.some = threading.Event()

    def run(self) -> None:
        try:
            with self.client.crash.watch(max_await_time_ms=20) as stream:
                self.opened.set()
                while True:
                    event = stream.try_next()
                    if event is not None:
                        self.events.append(event)
                        if len(self.events) >= 10:
                            self.some.set()
        except errors.PyMongoError:
            pass
        finally:
            self.opened.set()
            self.some.set()
            self.client.close()


def test_sigkill_during_acknowledged_writes(tmp_path):
    data_dir = tmp_path / "data"
    server = SubprocessServer(data_dir=data_dir)
    try:
        consumer = Consumer(server.uri)
        consumer.start()
        assert consumer.opened.wait(HANG_GUARD_S)
        writer = Writer(server.uri)
        writer.start()
        assert writer.enough.wait(HANG_GUARD_S) and consumer.some.wait(HANG_GUARD_S)
        assert writer.error is None  # still writing when the kill comes
        server.kill()  # SIGKILL
        writer.join(HANG_GUARD_S)
        consumer.join(HANG_GUARD_S)
        assert not writer.is_alive() and not consumer.is_alive()
    finally:
        server.stop()
    assert writer.error is not None
    acked, attempted = writer.acked, writer.attempted
    assert len(acked) >= ACKED_BEFORE_KILL * 3
    before = consumer.events
    assert before

    restarted = SubprocessServer(data_dir=data_dir)
    try:
        with MongoClient(restarted.uri, serverSelectionTimeoutMS=5000) as client:
            db = client.crash
            entries = [e for e in read_oplog(client) if e["ns"].startswith("crash.")]
            crud = [e for e in entries if e["op"] in ("i", "u", "d")]

            # Every acknowledged write is there; nothing that was not attempted is.
            for kind in ("w1", "j"):
                ids = [d["_id"] for d in db[kind].find()]
                acked_ids = [i for k, i in acked if k == kind]
                attempted_ids = [i for k, i in attempted if k == kind]
                assert ids[: len(acked_ids)] == acked_ids
                assert ids == attempted_ids[: len(ids)]
                # ... and each has its oplog entry: the data and the oplog agree.
                assert [e["o"]["_id"] for e in crud if e["ns"] == f"crash.{kind}"] == ids
            counter = db.counter.find_one({"_id": 0})["n"]
            incs_acked = sum(1 for k, _ in acked if k == "inc")
            incs_tried = sum(1 for k, _ in attempted if k == "inc")
            assert incs_acked <= counter <= incs_tried
            assert len([e for e in crud if e["ns"] == "crash.counter"]) == counter

            # The consumer resumes from its last token: the rest, exactly once.
            expected = [_key(e) for e in crud]
            assert [_key(e) for e in before] == expected[: len(before)]
            after: list[dict] = []
            with db.watch(resume_after=before[-1]["_id"], max_await_time_ms=20) as stream:
                while len(before) + len(after) < len(expected):
                    event = stream.try_next()
                    if event is not None:
                        after.append(event)
                assert stream.try_next() is None  # nothing more, nothing twice
            assert [_key(e) for e in before + after] == expected
            tokens = [e["_id"]["_data"] for e in before + after]
            assert len(set(tokens)) == len(tokens) and tokens == sorted(tokens)

            # The restarted server goes on: its writes continue the same oplog.
            db.w1.insert_one({"_id": "after"})
            assert read_oplog(client)[-1]["ts"] > entries[-1]["ts"]
    finally:
        restarted.stop()


@pytest.mark.parametrize("synchronous", ["normal"])
def test_sigkill_with_relaxed_sqlite_sync_keeps_acknowledged_writes(tmp_path, synchronous):
    """`synchronous = "normal"` (WAL) still survives a process crash (only an OS crash can
    lose the last commits): acknowledged writes are in the WAL before the reply."""
    config = tmp_path / "c.toml"
    config.write_text(f'[store]\nsynchronous = "{synchronous}"\n')
    data_dir = tmp_path / "data"
    server = SubprocessServer(data_dir=data_dir, extra_args=["--config", str(config)])
    try:
        with MongoClient(server.uri, serverSelectionTimeoutMS=5000) as client:
            client.crash.c.insert_many([{"_id": i} for i in range(50)])
            client.crash.c.update_many({}, {"$set": {"ok": True}})
        server.kill()
    finally:
        server.stop()
    restarted = SubprocessServer(data_dir=data_dir)
    try:
        with MongoClient(restarted.uri, serverSelectionTimeoutMS=5000) as client:
            assert client.crash.c.count_documents({"ok": True}) == 50
            assert len([e for e in read_oplog(client) if e["ns"] == "crash.c"]) == 100
    finally:
        restarted.stop()


def test_retryable_writes_stay_at_most_once_across_a_restart(tmp_path):
    """A statement retried after a restart (same lsid + txnNumber) is not applied again: its
    result comes from its oplog entry, as mongod's comes via config.transactions."""
    import asyncio
    import types
    import uuid

    from bson.binary import Binary
    from bson.int64 import Int64

    from cdcserver.commands import writes as crud  # the write commands (writes.py)
    from cdcserver.embedded.store import Store

    lsid = {"id": Binary(uuid.uuid4().bytes, 4)}

    def run(store, handler, cmd):
        cmd = {**cmd, "lsid": lsid, "$db": "r"}
        return asyncio.run(handler(types.SimpleNamespace(store=store), None, cmd, "r"))

    insert = {"insert": "c", "documents": [{"_id": 1}, {"_id": 2}], "txnNumber": Int64(1)}
    update = {"update": "c", "updates": [
        {"q": {"_id": 1}, "u": {"$inc": {"n": 1}}},
        {"q": {"_id": 9}, "u": {"$set": {"x": 1}}, "upsert": True},
    ], "txnNumber": Int64(2)}
    delete = {"delete": "c", "deletes": [{"q": {"_id": 2}, "limit": 1}], "txnNumber": Int64(3)}
    fam = {"findAndModify": "c", "query": {"_id": 1}, "update": {"$inc": {"n": 1}},
           "txnNumber": Int64(4)}
    data = str(tmp_path / "data")

    def twice(handler, cmd):
        """Run, restart, retry: (first reply, retried reply, whether the oplog grew)."""
        store = Store(data)
        try:
            first = run(store, handler, cmd)
            entries = store.oplog_entries()
        finally:
            store.close()
        store = Store(data)
        try:
            retried = run(store, handler, cmd)
            return first, retried, store.oplog_entries() != entries
        finally:
            store.close()

    first, retried, grew = twice(crud.insert, insert)
    assert first["n"] == retried["n"] == 2 and not grew
    first, retried, grew = twice(crud.update, update)
    assert (retried["n"], retried["nModified"]) == (first["n"], first["nModified"]) == (2, 1)
    assert retried["upserted"] == first["upserted"] == [{"index": 1, "_id": 9}]
    assert not grew
    first, retried, grew = twice(crud.delete, delete)
    assert first["n"] == retried["n"] == 1 and not grew
    first, retried, grew = twice(crud.find_and_modify, fam)  # from config.image_collection
    assert retried == first and not grew
    store = Store(data)
    try:
        c = store.get("r", "c")
        assert list(store.documents(c).values()) == [{"_id": 1, "n": 2}, {"_id": 9, "x": 1}]
        with pytest.raises(crud.MongoError) as info:  # an older txnNumber
            run(store, crud.insert, {**insert, "txnNumber": Int64(3)})
        assert info.value.code == 225
        before = len(store.oplog_entries())
        newer = run(store, crud.insert, {**insert, "documents": [{"_id": 3}],
                                         "txnNumber": Int64(5)})
        assert newer["n"] == 1 and len(store.oplog_entries()) == before + 1
    finally:
        store.close()


KILL_ROUNDS = 10  # SIGKILLs while with_transaction runs (commits included)


class TransactionalCounter(threading.Thread):
    """Increments a counter with pymongo's `with_transaction` until told to stop, counting the
    calls that returned: each must have been applied exactly once, across kills and restarts
    (a commit whose reply the kill lost is retried by pymongo and must answer ok, not run the
    transaction again)."""

    def __init__(self, uri: str) -> None:
        super().__init__(daemon=True)
        self.client = MongoClient(uri, serverSelectionTimeoutMS=int(HANG_GUARD_S * 1000))
        self.succeeded = 0
        self.failures: list[BaseException] = []
        self.done = threading.Event()
        self.progress = threading.Condition()

    def run(self) -> None:
        coll = self.client.crash.txn_counter

        def increment(session) -> None:
            coll.update_one({"_id": 0}, {"$inc": {"n": 1}}, session=session)

        try:
            while not self.done.is_set():
                with self.client.start_session() as s:
                    try:
                        s.with_transaction(increment)
                    except errors.PyMongoError as exc:  # outcome unknown to the caller
                        self.failures.append(exc)
                        continue
                with self.progress:
                    self.succeeded += 1
                    self.progress.notify_all()
        finally:
            self.client.close()

    def wait_for(self, count: int) -> bool:
        with self.progress:
            return self.progress.wait_for(lambda: self.succeeded >= count, HANG_GUARD_S)


def test_sigkill_while_with_transaction_commits(tmp_path):
    """Issue 13 item 2: SIGKILL while pymongo's with_transaction commits, restart (same port,
    so the driver's retries reach it), many rounds: the counter equals the successful calls."""
    import random

    data_dir = tmp_path / "data"
    server = SubprocessServer(data_dir=data_dir)
    same_port = ["--port", str(server.port)]
    writer = None
    try:
        with MongoClient(server.uri, serverSelectionTimeoutMS=5000) as client:
            client.crash.txn_counter.insert_one({"_id": 0, "n": 0})
        writer = TransactionalCounter(server.uri)
        writer.start()
        for _ in range(KILL_ROUNDS):
            assert writer.wait_for(writer.succeeded + 3)  # it runs against this server
            threading.Event().wait(random.random() * 0.02)  # jitter: land anywhere in a call
            server.kill()  # SIGKILL
            server.stop()
            server = SubprocessServer(data_dir=data_dir, extra_args=same_port)
        assert writer.wait_for(writer.succeeded + 3)
        writer.done.set()
        writer.join(HANG_GUARD_S)
        assert not writer.is_alive()
        with MongoClient(server.uri, serverSelectionTimeoutMS=5000) as client:
            counter = client.crash.txn_counter.find_one({"_id": 0})["n"]
            commits = [e for e in read_oplog(client)
                       if e["op"] == "c" and "applyOps" in e["o"]]
    finally:
        if writer is not None:
            writer.done.set()
        server.stop()
    assert not writer.failures, writer.failures
    assert counter == writer.succeeded
    assert len(commits) == counter  # one applyOps per increment: none applied twice
