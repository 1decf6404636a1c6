"""A command naming a collection with a NUL character fails as a whole on mongod 8.0: the
NamespaceString is built while the command is parsed, and refuses it (73 InvalidNamespace
"namespaces cannot have embedded null characters"), so an insert never gets to a write error
(cdcserver answered ok: 1 with a per-document writeError). PyMongo refuses such a name itself,
so the commands are sent as documents.
"""

from __future__ import annotations

import pytest
from pymongo.errors import OperationFailure

NUL_NAME = "a\x00b"


@pytest.mark.parametrize("cmd", [
    {"insert": NUL_NAME, "documents": [{"_id": 1}]},
    {"insert": NUL_NAME, "documents": [{"_id": 1}], "ordered": False},
    {"update": NUL_NAME, "updates": [{"q": {}, "u": {"$set": {"x": 1}}, "upsert": True}]},
    {"delete": NUL_NAME, "deletes": [{"q": {}, "limit": 0}]},
    {"find": NUL_NAME},
])
def test_whole_command_fails(client, cmd) -> None:
    db = client.nul_names
    with pytest.raises(OperationFailure) as info:
        db.command(cmd)
    err = info.value
    assert (err.code, err.details["codeName"], err.details["errmsg"]) == (
        73, "InvalidNamespace", "namespaces cannot have embedded null characters")
    assert "writeErrors" not in err.details
    assert "a" not in db.list_collection_names()


def test_nothing_was_logged(server, client) -> None:
    db = client.nul_names
    before = len(server.entries())
    with pytest.raises(OperationFailure):
        db.command({"insert": NUL_NAME, "documents": [{"_id": 1}]})
    assert len(server.entries()) == before
