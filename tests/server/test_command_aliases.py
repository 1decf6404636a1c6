"""Commands mongod registers under an alias too (Command(name, oldName)): `collstats` is
`collStats` (src/mongo/db/commands/dbcommands_d.cpp CollectionStats, and mongos's
cluster_collection_stats_cmd), as `dbstats` is `dbStats`."""

from __future__ import annotations

import pytest
from pymongo.errors import OperationFailure

from cdcserver.sharding.testing import ShardedServer
from cdcserver.testing import EmbeddedServer


def _without_times(reply: dict) -> dict:
    return {k: v for k, v in reply.items() if k not in ("$clusterTime", "operationTime")}


def test_collstats_is_collstats():
    with EmbeddedServer() as s, s.client() as c:
        c.test.sized.insert_many([{"_id": i, "x": "y" * i} for i in range(20)])
        lower = c.test.command("collstats", "sized")
        upper = c.test.command("collStats", "sized")
        assert _without_times(lower) == _without_times(upper)
        assert lower["ns"] == "test.sized" and lower["count"] == 20
        listed = c.admin.command("listCommands")["commands"]
        assert listed["collstats"]["apiVersions"] == ["1"]


def test_collstats_through_the_front():
    with ShardedServer(2) as cluster:
        import pymongo

        with pymongo.MongoClient(cluster.uri) as c:
            c.test.sized.insert_many([{"_id": i} for i in range(5)])
            stats = c.test.command("collstats", "sized")
            assert stats["ns"] == "test.sized" and stats["count"] == 5


def test_collstats_needs_the_coll_stats_action():
    """One command in mongod: the alias needs collStats on the collection, as collStats."""
    import pymongo

    from cdcserver import auth
    from cdcserver.config import AuthConfig, Config, RoleConfig, UserConfig

    reader = UserConfig(user="reader", db="admin", roles=[RoleConfig(role="read", db="shop")],
                        scram_sha_256=auth.derive_credentials(auth.SCRAM_SHA_256, "reader",
                                                              "pw", iterations=4096))
    config = Config(auth=AuthConfig(enabled=True, users=[reader]))
    with EmbeddedServer(config=config) as s, pymongo.MongoClient(
            s.direct_uri, username="reader", password="pw") as c:
        assert c.shop.command("collstats", "c")["ns"] == "shop.c"
        with pytest.raises(OperationFailure) as err:
            c.other.command("collstats", "c")
        assert err.value.code == 13
