"""Fixtures for the translated jstests: a fresh in-memory cdcserver (a single-node replica-set
primary, as the jstests' `db` is) per test, and a pymongo client to it."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))  # for `import cst`


@pytest.fixture
def client(cdcserver_embedded: Any) -> Iterator[Any]:
    with cdcserver_embedded.client() as c:
        yield c
