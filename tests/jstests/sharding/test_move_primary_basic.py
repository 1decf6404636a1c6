"""Translated from mongodb/mongo `jstests/sharding/move_primary_basic.js` @
04008276cc81cd234f042f25b3a65bca76a033ce: `movePrimary` runs only against `admin` (13
Unauthorized elsewhere); it fails for `config`, `local`, `admin`, invalid database names, and an
unknown, empty or missing `to`; it moves the primary (`config.databases`) and succeeds again when
`to` is already the primary. The jstest runs twice, with and without the 4.0-era `forTest` flag;
8.0 has no such flag, so it runs once."""

from __future__ import annotations

import pytest
from pymongo.errors import OperationFailure


def _fails(s, command: dict) -> None:
    with pytest.raises(OperationFailure):
        s.admin.command(command)


def test_move_primary_basic(st):
    s = st.s
    s.admin.command({"enableSharding": "db", "primaryShard": st.shard0})
    assert st.primary_shard("db") == st.shard0

    with pytest.raises(OperationFailure) as err:
        s.test.command({"movePrimary": "db", "to": st.shard0})
    assert err.value.code == 13, err.value.details

    for name in ("config", "local", "admin", "a.b", ""):
        _fails(s, {"movePrimary": name, "to": st.shard0})
    _fails(s, {"movePrimary": "db", "to": "Unknown"})
    _fails(s, {"movePrimary": "db", "to": ""})
    _fails(s, {"movePrimary": "db"})

    assert st.primary_shard("db") == st.shard0
    s.admin.command({"movePrimary": "db", "to": st.shard1})
    assert st.primary_shard("db") == st.shard1
    s.admin.command({"movePrimary": "db", "to": st.shard1})
    assert st.primary_shard("db") == st.shard1
