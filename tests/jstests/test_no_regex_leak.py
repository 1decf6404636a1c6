"""Translated from mongodb/mongo `jstests/change_streams/no_regex_leak.js` @
3e0ff89ff121d04bdb697eefb2e90cdb91f9ce9e: regex control characters in a watched namespace do
not make a stream see another namespace's events (SERVER-41164)."""

from __future__ import annotations

from typing import Any

import pytest
from cst import ChangeStreamTest

CASES = [
    ("has_no_pipe", "coll", "has_a_|pipe", "coll"),
    ("starssss", "coll", "stars*", "coll"),
    ("has_[two]_brackets", "coll", "has_t_brackets", "coll"),
    ("test", "dotted.collection", "testadotted", "collection"),
    ("carat", "coll", "hasa^carat", "coll"),
    ("db1", "coll", "db1", "col*"),
]


@pytest.mark.parametrize("case", CASES, ids=[f"{c[2]}.{c[3]}" for c in CASES])
def test_no_leak(client: Any, case: tuple[str, str, str, str]) -> None:
    db_unrelated, coll_unrelated, db_problematic, coll_problematic = case
    unrelated = client[db_unrelated]
    cst_unrelated = ChangeStreamTest(unrelated)
    unrelated.drop_collection(coll_unrelated)
    unrelated.create_collection(coll_unrelated)
    watch_unrelated = cst_unrelated.start_watching_changes([{"$changeStream": {}}],
                                                           coll_unrelated)
    problematic = client[db_problematic]
    cst_problematic = ChangeStreamTest(problematic)
    problematic.drop_collection(coll_problematic)
    problematic.create_collection(coll_problematic)
    watch_problematic = cst_problematic.start_watching_changes([{"$changeStream": {}}],
                                                               coll_problematic)

    unrelated[coll_unrelated].insert_one({"_id": 2})
    cst_unrelated.assert_next_changes_equal(watch_unrelated, [{
        "documentKey": {"_id": 2}, "fullDocument": {"_id": 2},
        "ns": {"db": db_unrelated, "coll": coll_unrelated}, "operationType": "insert"}])
    cst_problematic.assert_no_change(watch_problematic)

    problematic[coll_problematic].insert_one({"_id": 3})
    cst_problematic.assert_next_changes_equal(watch_problematic, [{
        "documentKey": {"_id": 3}, "fullDocument": {"_id": 3},
        "ns": {"db": db_problematic, "coll": coll_problematic}, "operationType": "insert"}])
    cst_unrelated.assert_no_change(watch_unrelated)
    cst_unrelated.clean_up()
    cst_problematic.clean_up()
