"""Fixtures for the translated `jstests/sharding/` files: the embedded sharded cluster
(`serve --shards 2` in this process: a mongos front over two single-node replica-set shards,
as the jstests' `ShardingTest({shards: 2, rs: {nodes: 1}})`), a fresh one per test."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pymongo
import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # for `import sharding_util`

from sharding_util import ShardingTest  # noqa: E402

from cdcserver.sharding.testing import ShardedServer  # noqa: E402


@pytest.fixture
def st() -> Iterator[ShardingTest]:
    with ShardedServer(2) as server, pymongo.MongoClient(server.uri) as s:
        test = ShardingTest(server, s)
        try:
            yield test
        finally:
            test.close()


@pytest.fixture
def st3() -> Iterator[ShardingTest]:
    """`ShardingTest({shards: 3})`."""
    with ShardedServer(3) as server, pymongo.MongoClient(server.uri) as s:
        test = ShardingTest(server, s)
        try:
            yield test
        finally:
            test.close()
