"""`setParameter` as a command, and the `dbstats` spelling of `dbStats`, as mongod 8.0 answers.

parameters.cpp CmdSet (admin only): every name after the first field is checked before any is
set, generic arguments skipped: 72 InvalidOptions "attempted to set unrecognized parameter
[<name>], use help:true to see options " (trailing space included), 20 IllegalOperation "not
allowed to change [<name>] at runtime"; then they are set in name order and the reply's `was`
is the first one's old value; nothing to set is 72 "no option found to set, use help:true to
see options ". A value the parameter refuses is its own error (2 BadValue "Invalid value for
parameter <name>: <element>"). `dbStats` is registered with the alias `dbstats`.
"""

from __future__ import annotations

import pytest
from bson.son import SON
from pymongo.errors import OperationFailure

HELP = ", use help:true to see options "


def _error(db, cmd) -> tuple[int, str, str]:
    with pytest.raises(OperationFailure) as info:
        db.command(cmd)
    return info.value.code, info.value.details["codeName"], info.value.details["errmsg"]


def test_unknown_parameter(client) -> None:
    assert _error(client.admin, {"setParameter": 1, "noSuchParameter": 1}) == (
        72, "InvalidOptions", f"attempted to set unrecognized parameter [noSuchParameter]{HELP}")


def test_nothing_to_set(client) -> None:
    assert _error(client.admin, SON([("setParameter", 1), ("comment", "x")])) == (
        72, "InvalidOptions", f"no option found to set{HELP}")


def test_startup_only_parameter(client) -> None:
    assert _error(client.admin, {"setParameter": 1, "maxBSONDepth": 10}) == (
        20, "IllegalOperation", "not allowed to change [maxBSONDepth] at runtime")


def test_names_are_all_checked_before_any_is_set(client) -> None:
    before = client.admin.command("getParameter", 1, cursorTimeoutMillis=1)
    cmd = SON([("setParameter", 1), ("cursorTimeoutMillis", 1234), ("noSuchParameter", 1)])
    assert _error(client.admin, cmd)[0] == 72
    after = client.admin.command("getParameter", 1, cursorTimeoutMillis=1)
    assert after["cursorTimeoutMillis"] == before["cursorTimeoutMillis"]


def test_set_and_read_back(client) -> None:
    old = client.admin.command("getParameter", 1, cursorTimeoutMillis=1)["cursorTimeoutMillis"]
    try:
        reply = client.admin.command(SON([("setParameter", 1), ("ttlMonitorSleepSecs", 30),
                                          ("cursorTimeoutMillis", 90000)]))
        # set in name order: `was` is cursorTimeoutMillis's old value
        assert reply["was"] == old
        got = client.admin.command("getParameter", 1, cursorTimeoutMillis=1,
                                   ttlMonitorSleepSecs=1)
        assert (got["cursorTimeoutMillis"], got["ttlMonitorSleepSecs"]) == (90000, 30)
    finally:
        client.admin.command("setParameter", 1, cursorTimeoutMillis=old)


def test_bad_value(client) -> None:
    assert _error(client.admin, {"setParameter": 1, "cursorTimeoutMillis": "soon"}) == (
        2, "BadValue",
        'Invalid value for parameter cursorTimeoutMillis: cursorTimeoutMillis: "soon"')


def test_admin_only(client) -> None:
    assert _error(client.test, {"setParameter": 1, "cursorTimeoutMillis": 1000}) == (
        13, "Unauthorized", "setParameter may only be run against the admin database.")


def test_dbstats_alias(client) -> None:
    client.stats_alias.c.insert_one({"a": 1})
    try:
        lower = client.stats_alias.command("dbstats")
        upper = client.stats_alias.command("dbStats")
        assert (lower["db"], lower["collections"], lower["objects"]) == ("stats_alias", 1, 1)
        assert set(lower) == set(upper)
    finally:
        client.drop_database("stats_alias")
