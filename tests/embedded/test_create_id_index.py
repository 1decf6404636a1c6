"""`create` with an `idIndex`, as mongod 8.0 keeps and logs it: the _id index is built from the
spec given (listCollections' `idIndex` shows its version), it is never a collection option, and
the create oplog entry carries it only for index versions >= 2 (makeCreateCollCmdObj: "Include
the full _id index spec in the oplog for index versions >= 2"), so a `v: 1` spec is left out of
the entry and of the change stream's `create` event."""

from __future__ import annotations

from bson.son import SON


def _create_entry(server, name: str) -> dict:
    return next(e for e in reversed(server.entries())
                if e.get("op") == "c" and e["o"].get("create") == name)


def _info(db, name: str) -> dict:
    return next(db.list_collections(filter={"name": name}))


def test_v1_id_index_left_out_of_the_entry(server, client) -> None:
    db = client.id_index_v
    db.drop_collection("v1")
    spec = SON([("v", 1), ("key", {"_id": 1}), ("name", "_id_")])
    db.command(SON([("create", "v1"), ("idIndex", spec)]))
    info = _info(db, "v1")
    assert info["options"] == {}
    assert info["idIndex"] == {"v": 1, "key": {"_id": 1}, "name": "_id_"}
    assert _create_entry(server, "v1")["o"] == {"create": "v1"}
    db.drop_collection("v1")


def test_v2_id_index_in_the_entry(server, client) -> None:
    db = client.id_index_v
    db.drop_collection("v2")
    spec = SON([("v", 2), ("key", {"_id": 1}), ("name", "_id_")])
    db.command(SON([("create", "v2"), ("idIndex", spec)]))
    assert _create_entry(server, "v2")["o"] == {
        "create": "v2", "idIndex": {"v": 2, "key": {"_id": 1}, "name": "_id_"}}
    db.drop_collection("v2")


def test_create_event_of_a_v1_id_index(client) -> None:
    db = client.id_index_v
    db.drop_collection("ev")
    with db.watch(show_expanded_events=True, max_await_time_ms=50) as stream:
        db.command(SON([("create", "ev"), ("idIndex", SON([("v", 1), ("key", {"_id": 1}),
                                                              ("name", "_id_")]))]))
        event = stream.next()
    assert event["operationType"] == "create"
    assert "idIndex" not in event.get("operationDescription", {})
    db.drop_collection("ev")
