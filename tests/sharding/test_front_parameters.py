"""The front's own server parameters (cdcserver/sharding/router/parameters.py): mongos
answers getParameter and setParameter with its own parameter set, and a shard keeps its own."""

from __future__ import annotations

import pymongo
import pytest
from pymongo.errors import OperationFailure


def _shard(cluster, i: int = 0) -> pymongo.MongoClient:
    return pymongo.MongoClient(cluster.shard_uris[i], directConnection=True)


def test_get_parameter_lists_mongos_parameters(client):
    every = client.admin.command("getParameter", "*")
    for name in ("transactionLifetimeLimitSeconds", "ttlMonitorEnabled", "ttlMonitorSleepSecs"):
        assert name not in every  # mongod's, not mongos's
    assert {"authenticationMechanisms", "cursorTimeoutMillis", "maxBSONDepth",
            "requireApiVersion"} <= set(every)
    with pytest.raises(OperationFailure) as err:
        client.admin.command("getParameter", 1, ttlMonitorEnabled=1)
    assert err.value.code == 72
    assert err.value.details["errmsg"] == "no option found to get"


def test_set_parameter_sets_the_fronts_own(cluster, client):
    before = client.admin.command("getParameter", 1, cursorTimeoutMillis=1)["cursorTimeoutMillis"]
    try:
        was = client.admin.command("setParameter", 1, cursorTimeoutMillis=123456)
        assert was["was"] == before
        assert client.admin.command("getParameter", 1, cursorTimeoutMillis=1)[
            "cursorTimeoutMillis"] == 123456
        for i in range(len(cluster.shard_uris)):
            with _shard(cluster, i) as shard:
                assert shard.admin.command("getParameter", 1, cursorTimeoutMillis=1)[
                    "cursorTimeoutMillis"] == before
    finally:
        client.admin.command("setParameter", 1, cursorTimeoutMillis=before)


def test_set_parameter_refuses_mongod_only_parameters(cluster, client):
    with pytest.raises(OperationFailure) as err:
        client.admin.command("setParameter", 1, ttlMonitorEnabled=False)
    assert err.value.code == 72
    assert err.value.details["errmsg"] == (
        "attempted to set unrecognized parameter [ttlMonitorEnabled], use help:true to see "
        "options ")
    with _shard(cluster) as shard:
        assert shard.admin.command("getParameter", 1, ttlMonitorEnabled=1)[
            "ttlMonitorEnabled"] is True
