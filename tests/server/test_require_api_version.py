"""`setParameter: {requireApiVersion: true}` as mongod 8.0 enforces it
(initialize_api_parameters.cpp enforceRequireAPIVersion; jstests/noPassthrough/
require_api_version.js): a command sent without apiVersion is 498870; a getMore takes its
cursor's parameters and a command that continues a transaction the transaction's, so neither
needs one; a client declaring the Stable API (pymongo's server_api) sends it everywhere else."""

from __future__ import annotations

from collections.abc import Iterator

import pymongo
import pytest
from bson.int64 import Int64
from pymongo.errors import OperationFailure
from pymongo.server_api import ServerApi

from cdcserver.testing import EmbeddedServer

TEXT = "The apiVersion parameter is required, please configure your MongoClient's API version"


@pytest.fixture
def server() -> Iterator[EmbeddedServer]:
    s = EmbeddedServer()
    try:
        yield s
    finally:
        s.stop()


def _required(run) -> None:
    with pytest.raises(OperationFailure) as info:
        run()
    err = info.value
    assert (err.code, err.details["codeName"], err.details["errmsg"]) == (
        498870, "Location498870", TEXT)


def test_commands_without_api_version_are_refused(server) -> None:
    with server.client() as plain, server.client(server_api=ServerApi("1")) as versioned:
        plain.db.c.insert_many([{"_id": i} for i in range(5)])
        cursor = plain.db.command({"find": "c", "batchSize": 1})["cursor"]
        assert plain.admin.command("setParameter", 1, requireApiVersion=True)["was"] is False
        _required(lambda: plain.admin.command("ping"))
        _required(lambda: plain.db.c.find_one())
        _required(lambda: plain.admin.command("hello"))
        assert plain.admin.command("ping", apiVersion="1")["ok"] == 1.0
        # the Stable API client: every command carries apiVersion (its handshake too)
        assert versioned.admin.command("ping")["ok"] == 1.0
        versioned.db.c.insert_one({"_id": 5})
        assert versioned.db.c.count_documents({}) == 6
        assert [d["_id"] for d in versioned.db.c.find().sort("_id").batch_size(2)] == [
            0, 1, 2, 3, 4, 5]  # its getMores carry no apiVersion
        with versioned.db.c.watch() as stream:
            versioned.db.c.insert_one({"_id": 6})
            assert stream.next()["documentKey"] == {"_id": 6}
        # a getMore never needs it (its cursor's parameters)
        more = plain.db.command({"getMore": Int64(cursor["id"]), "collection": "c"})
        assert [d["_id"] for d in more["cursor"]["nextBatch"]] == [1, 2, 3, 4]
        # a handshake claiming an internal client is not checked
        assert plain.admin.command("hello", internalClient={"minWireVersion": 0,
                                                            "maxWireVersion": 25})["ok"] == 1.0
        assert versioned.admin.command("setParameter", 1, requireApiVersion=False)["was"] is True
        assert plain.admin.command("ping")["ok"] == 1.0


def test_transactions_need_it_on_their_first_command_only(server) -> None:
    with server.client(server_api=ServerApi("1")) as versioned:
        versioned.db.create_collection("t")
        versioned.admin.command("setParameter", 1, requireApiVersion=True)
        try:
            with versioned.start_session() as session, session.start_transaction():
                versioned.db.t.insert_one({"_id": 1}, session=session)  # apiVersion: the start
                versioned.db.t.insert_one({"_id": 2}, session=session)  # none: continuing
            assert versioned.db.t.count_documents({}) == 2
        finally:
            versioned.admin.command("setParameter", 1, requireApiVersion=False)


def test_the_fronts_own_commands_to_its_shards_are_internal() -> None:
    """The front's connection to a shard is an internal client (mongos authenticates as
    __system): the shard does not ask its commands for apiVersion. Set through the front,
    requireApiVersion lands on a shard, and shardCollection (whose commands to the shards the
    front sends itself) must still work."""
    from cdcserver.sharding.testing import ShardedServer

    with ShardedServer(2) as front, pymongo.MongoClient(
            front.uri, server_api=ServerApi("1")) as versioned:
        versioned.api_test.plain.insert_one({"_id": 1})
        versioned.admin.command("setParameter", 1, requireApiVersion=True)
        try:
            versioned.admin.command("shardCollection", "api_test.sharded", key={"_id": 1})
            versioned.api_test.sharded.insert_many([{"_id": i} for i in range(10)])
            versioned.admin.command("split", "api_test.sharded", middle={"_id": 5})
            assert versioned.api_test.sharded.count_documents({}) == 10
        finally:
            versioned.admin.command("setParameter", 1, requireApiVersion=False)
