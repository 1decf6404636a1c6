"""A two-shard embedded cluster per test module (`cluster`, in this process) and a pymongo
client of its front (`client`); a module that needs its own declares fixtures of these names."""

from __future__ import annotations

from collections.abc import Iterator

import pymongo
import pytest

from cdcserver.sharding.testing import ShardedServer


@pytest.fixture(scope="module")
def cluster() -> Iterator[ShardedServer]:
    with ShardedServer(2) as server:
        yield server


@pytest.fixture(scope="module")
def client(cluster: ShardedServer) -> Iterator[pymongo.MongoClient]:
    with pymongo.MongoClient(cluster.uri) as c:
        yield c
