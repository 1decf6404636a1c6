"""One cdcserver (embedded store, in memory, a free 127.0.0.1 port) for the specification tests
(and one answering as MongoDB 9.0 for the change-stream files), and pymongo clients that
rediscover it at once after a network error."""

from __future__ import annotations

from collections.abc import Iterator

import pymongo
import pytest
from unified_runner import Deployment, fast_heartbeats

from cdcserver.testing import ThreadServer


def _embedded_log():
    from cdcserver.embedded.store import Store
    from cdcserver.sources.embedded import EmbeddedOplog

    return EmbeddedOplog(Store(None), noop_interval_s=0)


@pytest.fixture(scope="session")
def spec_server() -> Iterator[ThreadServer]:
    with ThreadServer(make_log=_embedded_log, follow=False) as server:
        yield server


@pytest.fixture(scope="session")
def spec_server_9_0() -> Iterator[ThreadServer]:
    """The same server answering as MongoDB 9.0 (`[server] compatibility = "9.0"`)."""
    from cdcserver.config import Config, ServerConfig

    config = Config(server=ServerConfig(compatibility="9.0"))
    with ThreadServer(make_log=_embedded_log, follow=False, config=config) as server:
        yield server


@pytest.fixture(scope="session")
def spec_internal_client(spec_server: ThreadServer) -> Iterator[pymongo.MongoClient]:
    with pymongo.MongoClient(spec_server.uri) as client:
        yield client


@pytest.fixture(scope="session")
def deployment(spec_server: ThreadServer, spec_internal_client: pymongo.MongoClient) -> Deployment:
    return Deployment.discover(spec_server.uri, spec_internal_client)


@pytest.fixture
def heartbeats() -> Iterator[None]:
    """pymongo's heartbeat floor lowered while a test runs (its clients use 50 ms)."""
    with fast_heartbeats():
        yield
