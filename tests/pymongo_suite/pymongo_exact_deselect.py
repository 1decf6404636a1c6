"""A pytest plugin for the run of PyMongo's tests (loaded there with `-p`): deselects exactly
the node ids in $CDCSERVER_PYMONGO_DESELECT (one a line). pytest's own --deselect takes
prefixes, and PyMongo's test names are prefixes of one another (`test_metadata` of
`test_metadata_append_is_bounded`)."""

from __future__ import annotations

import os

import pytest

ENV = "CDCSERVER_PYMONGO_DESELECT"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    wanted = set(filter(None, os.environ.get(ENV, "").splitlines()))
    if not wanted:
        return
    gone = [item for item in items if item.nodeid in wanted]
    if gone:
        config.hook.pytest_deselected(items=gone)
        items[:] = [item for item in items if item.nodeid not in wanted]
