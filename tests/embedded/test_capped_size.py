"""A capped collection's `size` as mongod 8.0 keeps it: CollectionOptions::parse rounds it up to
a multiple of 256, so listCollections' options and collStats' maxSize show the rounded size,
and a second create with the size as first given is the same collection (no 48). The oplog's
create entry keeps the size the command gave: mongod's ddl_create_event.js expects the create
event of `size: 1000` to say 1000 ("the options specified on the original user command")."""

from __future__ import annotations

import pytest


@pytest.fixture
def db(client):
    client.drop_database("capped_size")
    yield client.capped_size
    client.drop_database("capped_size")


def _options(db, name: str) -> dict:
    return next(db.list_collections(filter={"name": name}))["options"]


@pytest.mark.parametrize(("given", "kept"), [(1000, 1024), (1, 256), (256, 256), (4097, 4352),
                                             (1000.9, 1024)])
def test_size_rounded_up_to_256(db, given, kept) -> None:
    db.create_collection("c", capped=True, size=given)
    assert _options(db, "c") == {"capped": True, "size": kept}
    assert db.command("collStats", "c")["maxSize"] == kept


def test_same_create_again_is_the_same_collection(db) -> None:
    db.create_collection("c", capped=True, size=1000)
    assert db.command({"create": "c", "capped": True, "size": 1000})["ok"] == 1.0


def test_create_entry_has_the_size_as_given(server, db) -> None:
    db.create_collection("logged", capped=True, size=5000, max=10)
    entry = next(e for e in reversed(server.entries())
                 if e.get("op") == "c" and e["o"].get("create") == "logged")
    assert (entry["o"]["capped"], entry["o"]["size"], entry["o"]["max"]) == (True, 5000, 10)
    info = db.list_collections(filter={"name": "logged"}).next()
    assert info["options"]["size"] == 5120
