"""createUser / updateUser / dropUser / dropAllUsersFromDatabase through pymongo: mongod's
errors, and a user made this way authenticates over SCRAM."""

from __future__ import annotations

import pytest
from pymongo import MongoClient
from pymongo.errors import OperationFailure


def _code(db, cmd: dict) -> int:
    with pytest.raises(OperationFailure) as failure:
        db.command(cmd)
    return failure.value.code


def test_user_lifecycle_and_errors(server, client) -> None:
    db = client.users_db
    db.command("dropAllUsersFromDatabase", 1)
    assert _code(db, {"createUser": "p", "pwd": {}, "roles": []}) == 14
    assert _code(db, {"createUser": "p", "pwd": "pw", "roles": ["noSuchRole"]}) == 31
    db.command({"createUser": "app", "pwd": "secret", "roles": ["readWrite"]})
    assert _code(db, {"createUser": "app", "pwd": "pw", "roles": []}) == 51003
    assert _code(db, {"updateUser": "ghost", "pwd": "x"}) == 11
    db.command({"updateUser": "app", "roles": ["read"]})
    info = db.command("usersInfo", "app")["users"]
    assert [(u["user"], u["roles"]) for u in info] == [("app", [{"role": "read",
                                                                 "db": "users_db"}])]
    user_client = MongoClient("127.0.0.1",
                              port=server.port, directConnection=True, username="app",
                              password="secret", authSource="users_db")
    try:
        status = user_client.users_db.command("connectionStatus")["authInfo"]
        assert status["authenticatedUsers"] == [{"user": "app", "db": "users_db"}]
    finally:
        user_client.close()
    db.command("dropUser", "app")
    assert _code(db, {"dropUser": "app"}) == 11
    db.command({"createUser": "a", "pwd": "pw", "roles": []})
    db.command({"createUser": "b", "pwd": "pw", "roles": []})
    assert db.command("dropAllUsersFromDatabase", 1)["n"] == 2
