"""A full disk: the data directory on a small tmpfs, filled until SQLite refuses the writes.

Every write that failed (OutOfDiskSpace, 14031) is invisible to `find`, absent from the oplog
and from every change stream, and its retry runs again (never 11000); reads, change streams
and `serverStatus` keep being served; once space is freed writes succeed without a restart,
and after a restart the acknowledged writes are all there and the failed ones are not.
"""

from __future__ import annotations

import contextlib
import pathlib
from collections.abc import Iterator

import pytest
from pymongo import MongoClient, errors

from cdcserver.testing import SubprocessServer
from tests.support.small_disk import ballast, small_tmpfs

TMPFS_BYTES = 12 * 1024 * 1024
PAD = "x" * 16_000  # each document ~16 KB: the disk fills after a few dozen
FAILED_WANTED = 6  # failed inserts to collect before space is freed


@pytest.fixture
def small_disk(tmp_path: pathlib.Path) -> Iterator[pathlib.Path]:
    with small_tmpfs(tmp_path / "disk", TMPFS_BYTES) as mount:
        yield mount


def _ballast(mount: pathlib.Path, free_left: int) -> pathlib.Path:
    return ballast(mount, free_left)


def _oplog_ids(client: MongoClient) -> set[int]:
    return {e["o"]["_id"] for e in client.local["oplog.rs"].find({"ns": "full.c", "op": "i"})}


def test_failed_writes_leave_nothing_and_writes_resume(small_disk: pathlib.Path) -> None:
    data = small_disk / "data"
    server = SubprocessServer(data_dir=data)
    try:
        client: MongoClient = MongoClient(server.uri, retryWrites=True)
        coll = client.full.c
        coll.insert_one({"_id": -1})  # the collection exists before the disk fills
        stream = coll.watch()
        ballast = _ballast(small_disk, 600 * 1024)
        acked: list[int] = []
        failed: list[int] = []
        i = 0
        while len(failed) < FAILED_WANTED:
            assert i < 2000, "the disk never filled"
            try:
                coll.insert_one({"_id": i, "pad": PAD})
                acked.append(i)
            except errors.OperationFailure as exc:
                assert exc.code == 14031, exc.details
                assert exc.details["codeName"] == "OutOfDiskSpace"
                failed.append(i)
            i += 1
        # A retry of a failed insert, still full: the same error, never "duplicate key".
        with pytest.raises(errors.OperationFailure) as retried:
            coll.insert_one({"_id": failed[0], "pad": PAD})
        assert retried.value.code == 14031

        # Reads, the oplog and serverStatus are still served; nothing failed is visible.
        found = {d["_id"] for d in coll.find({}, {"_id": 1})}
        assert found == {-1, *acked}
        assert not set(failed) & _oplog_ids(client)
        assert client.admin.command("serverStatus")["ok"] == 1

        ballast.unlink()  # space returns
        coll.insert_one({"_id": "after"})
        for doc_id in failed:  # each failed insert, run again: it is written now
            coll.insert_one({"_id": doc_id, "pad": "retried"})
        seen: list[object] = []
        while len(seen) < len(acked) + 1 + len(failed):
            event = stream.next()
            seen.append(event["documentKey"]["_id"])
        # every acknowledged insert once, in order; the failed ones only from their retry
        assert seen == [*acked, "after", *failed]
        stream.close()
        client.close()
    finally:
        server.stop()

    restarted = SubprocessServer(data_dir=data)
    try:
        client = MongoClient(restarted.uri)
        docs = {d["_id"]: d.get("pad") for d in client.full.c.find()}
        assert set(docs) == {-1, "after", *acked, *failed}
        assert all(docs[f] == "retried" for f in failed)
        ids = _oplog_ids(client)
        assert {*acked, *failed} <= ids
        client.close()
    finally:
        restarted.stop()


def test_failed_transaction_commit_is_aborted(small_disk: pathlib.Path) -> None:
    """A transaction whose commit SQLite refuses: 14031, none of its writes visible; the
    session's next transaction runs."""
    server = SubprocessServer(data_dir=small_disk / "data")
    try:
        client: MongoClient = MongoClient(server.uri)
        coll = client.full.t
        coll.insert_one({"_id": "first"})
        ballast = _ballast(small_disk, 200 * 1024)
        with client.start_session() as session:
            failure = None
            for attempt in range(200):
                try:
                    with session.start_transaction():
                        for k in range(8):
                            coll.insert_one({"_id": f"{attempt}-{k}", "pad": PAD},
                                            session=session)
                except errors.OperationFailure as exc:
                    failure = exc
                    break
            assert failure is not None and failure.code == 14031, failure
            failed_attempt = attempt
            present = {d["_id"] for d in coll.find()}
            assert not {f"{failed_attempt}-{k}" for k in range(8)} & present
            ballast.unlink()
            with session.start_transaction():
                coll.insert_one({"_id": "next"}, session=session)
        assert coll.find_one({"_id": "next"}) is not None
        client.close()
    finally:
        with contextlib.suppress(Exception):
            server.stop()
