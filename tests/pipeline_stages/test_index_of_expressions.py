"""`$indexOfCP` / `$indexOfBytes` index errors in mongod's words, its missing space included
(the 40096 texts as mongod's expression code writes them: "$indexOfCPrequires ...")."""

from __future__ import annotations

import pytest
from pymongo.errors import OperationFailure

from cdcserver.testing import EmbeddedServer


@pytest.mark.parametrize("op", ["$indexOfCP", "$indexOfBytes"])
def test_a_starting_index_that_is_not_integral(op):
    with EmbeddedServer() as server:
        coll = server.client().t.c
        coll.insert_one({"item": "foobar foobar"})
        with pytest.raises(OperationFailure) as info:
            coll.aggregate([{"$project": {"v": {op: ["$item", "bar", "hello"]}}}]).to_list()
    assert info.value.code == 40096
    assert info.value.details["errmsg"].endswith(
        f'{op}requires an integral starting index, found a value of type: string, with value: '
        '"hello"')
