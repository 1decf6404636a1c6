"""Fixtures for the translated jstests: a fresh in-memory cdcserver (a single-node replica-set
primary, as the jstests' `db` is) per test, and a pymongo client to it. Each test runs against
both release profiles (pipeline_stages/release.py): mongod 8.0, the default, and 9.0
(`[server] compatibility = "9.0"`), as mongod's suites run the same jstests on each branch."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # for `import cst`


@pytest.fixture(params=["8.0", "9.0"], ids=["mongod-8.0", "mongod-9.0"])
def client(request: pytest.FixtureRequest) -> Iterator[Any]:
    if request.param == "8.0":
        with request.getfixturevalue("cdcserver_embedded").client() as c:
            yield c
        return
    from cdcserver.config import Config, ServerConfig
    from cdcserver.testing import EmbeddedServer

    with EmbeddedServer(config=Config(server=ServerConfig(compatibility="9.0"))) as server:
        with server.client() as c:
            assert c.admin.command("hello")["maxWireVersion"] == 29  # the profile applies
            yield c
