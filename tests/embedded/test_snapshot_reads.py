"""Snapshot reads outside transactions (readConcern level "snapshot"), through pymongo's snapshot
sessions against the embedded store: the first read answers the time it read at
(`atClusterTime`), later reads of the session see the data of that time whatever was written
since; commands that cannot read at a snapshot refuse it (72 InvalidOptions)."""

from __future__ import annotations

import pytest
from bson.timestamp import Timestamp
from pymongo import errors, monitoring


class _Replies(monitoring.CommandListener):
    def __init__(self) -> None:
        self.replies: list[tuple[str, dict]] = []

    def started(self, event):  # noqa: D102
        pass

    def succeeded(self, event):  # noqa: D102
        self.replies.append((event.command_name, dict(event.reply)))

    def failed(self, event):  # noqa: D102
        pass


@pytest.fixture
def listener():
    return _Replies()


@pytest.fixture
def client(server, listener):
    c = server.client(event_listeners=[listener])
    c.drop_database("snap")
    c.snap.c.insert_many([{"_id": 1, "x": 11}, {"_id": 2, "x": 22}])
    yield c
    c.drop_database("snap")
    c.close()


def test_reads_of_a_snapshot_session_see_one_point_in_time(client, listener):
    coll = client.snap.c
    with client.start_session(snapshot=True) as session:
        assert coll.find_one({"_id": 1}, session=session) == {"_id": 1, "x": 11}
        coll.update_one({"_id": 1}, {"$inc": {"x": 1}})  # another session's write
        coll.insert_one({"_id": 3, "x": 33})
        assert coll.find_one({"_id": 1}, session=session)["x"] == 11
        assert coll.count_documents({}, session=session) == 2
        assert sorted(coll.distinct("x", session=session)) == [11, 22]
        assert [d["x"] for d in coll.aggregate([{"$sort": {"_id": 1}}], session=session)] == [
            11, 22]
    assert coll.find_one({"_id": 1})["x"] == 12  # outside the session: now
    finds = [r for name, r in listener.replies if name == "find" and "cursor" in r]
    first = finds[0]["cursor"]["atClusterTime"]
    assert isinstance(first, Timestamp)
    distinct = [r for name, r in listener.replies if name == "distinct"][0]
    assert distinct["atClusterTime"] == first  # every read of the session at one time


def test_a_time_no_longer_kept_is_snapshot_too_old(client):
    coll = client.snap.c
    ts = client.snap.command("ping")["operationTime"]
    coll.insert_one({"_id": 3})
    with pytest.raises(errors.OperationFailure) as info:
        client.snap.command("find", "c", readConcern={"level": "snapshot", "atClusterTime": ts})
    assert info.value.code == 239


@pytest.mark.parametrize("op", ["insert", "listCollections", "count"])
def test_commands_that_cannot_read_at_a_snapshot_refuse_it(client, op):
    cmd = {"insert": {"insert": "c", "documents": [{"_id": 9}]},
           "listCollections": {"listCollections": 1}, "count": {"count": "c"}}[op]
    with pytest.raises(errors.OperationFailure) as info:
        client.snap.command({**cmd, "readConcern": {"level": "snapshot"}})
    assert info.value.code == 72
    assert info.value.details["errmsg"].startswith(
        f'Command {op} does not support {{ readConcern: {{ level: "snapshot" }} }}')
    assert client.snap.c.count_documents({}) == 2


def test_linearizable_aggregate_with_out_is_refused(client):
    with pytest.raises(errors.OperationFailure) as info:
        client.snap.command("aggregate", "c", pipeline=[{"$out": "o"}], cursor={},
                            readConcern={"level": "linearizable"})
    assert info.value.code == 72
    assert info.value.details["errmsg"].endswith(
        ":: caused by :: $out cannot be used with a 'linearizable' read concern level")
    assert "o" not in client.snap.list_collection_names()


def test_an_aggregate_that_starts_a_transaction(client):
    # its pipeline reads again after its first scan: still the transaction it started
    with client.start_session() as session:
        with session.start_transaction():
            docs = list(client.snap.c.aggregate([{"$sort": {"_id": -1}}], session=session))
            client.snap.c.insert_one({"_id": 3}, session=session)
    assert [d["_id"] for d in docs] == [2, 1]
    assert client.snap.c.count_documents({}) == 3
