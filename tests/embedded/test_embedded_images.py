"""Pre- and post-images end to end through pymongo's `watch()`: every `fullDocumentBeforeChange`
mode (off / whenAvailable / required) with every `fullDocument` mode (default / updateLookup /
whenAvailable / required), on a collection with `changeStreamPreAndPostImages` and on one
without, and mongod's NoMatchingDocument (47) errors, message included, when a required image
is missing."""

from __future__ import annotations

import asyncio

import pytest
from bson.timestamp import Timestamp
from pymongo import AsyncMongoClient, errors

from cdcserver.testing import EmbeddedServer

DB = "img"
PRE_MSG = (
    "Change stream was configured to require a pre-image for all update, delete and replace "
    "events, but the pre-image was not found for event: "
)
POST_MSG = (
    "Change stream was configured to require a post-image for all update events, but the "
    "post-image was not found for event: "
)
BEFORE_MODES = ["off", "whenAvailable", "required"]
FULL_MODES = ["default", "updateLookup", "whenAvailable", "required"]
OPS = ["insert", "update", "replace", "delete"]


class World:
    """The same writes on a collection with pre- and post-images (`on`) and one without
    (`off`); streams read them afterwards from `start`."""

    def __init__(self, server: EmbeddedServer) -> None:
        self.server = server
        client = server.client()
        db = client[DB]
        db.create_collection("on", changeStreamPreAndPostImages={"enabled": True})
        db.create_collection("off")
        self.start: Timestamp = server.entries()[-1]["ts"]
        for name in ("on", "off"):
            coll = db[name]
            coll.insert_one({"_id": 1, "a": 1})
            coll.update_one({"_id": 1}, {"$set": {"a": 2}})
            coll.replace_one({"_id": 1}, {"b": 1})
            coll.delete_one({"_id": 1})
        client.close()
        # The ts of each write, by (collection, op).
        self.ts: dict[tuple[str, str], Timestamp] = {}
        kinds = {"i": "insert", "d": "delete"}
        for entry in server.entries():
            if entry.get("ns", "").startswith(f"{DB}.") and entry["op"] in "iud":
                coll = entry["ns"].split(".", 1)[1]
                kind = kinds.get(entry["op"]) or (
                    "update" if entry["o"].get("$v") == 2 else "replace"
                )
                self.ts[(coll, kind)] = entry["ts"]


@pytest.fixture(scope="module")
def world(server):
    return World(server)


@pytest.fixture(scope="module")
def client(server):
    c = server.client()
    yield c
    c.close()


def _watch_options(before: str, full: str) -> dict:
    options = {"max_await_time_ms": 50}
    if before != "off":
        options["full_document_before_change"] = before
    if full != "default":
        options["full_document"] = full
    return options


def _read(client, world: World, coll: str, before: str, full: str, n: int = 4) -> list[dict]:
    with client[DB][coll].watch(start_at_operation_time=world.start,
                                **_watch_options(before, full)) as stream:
        events: list[dict] = []
        while len(events) < n:
            event = stream.try_next()
            if event is not None:
                events.append(event)
        return events


def _expected(coll: str, before: str, full: str) -> list[dict] | tuple[str, str]:
    """The four events mongod gives, or (message prefix, failing op) for an error."""
    images = coll == "on"
    pre = {"update": {"_id": 1, "a": 1}, "replace": {"_id": 1, "a": 2},
           "delete": {"_id": 1, "b": 1}}
    if before == "required" and not images:
        return PRE_MSG, "update"  # the pre-image stage runs before the post-image stage
    if full == "required" and not images:
        return POST_MSG, "update"
    events = []
    for op in OPS:
        event: dict = {"operationType": op}
        if op == "insert":
            event["fullDocument"] = {"_id": 1, "a": 1}
        elif op == "replace":
            event["fullDocument"] = {"_id": 1, "b": 1}
        elif op == "update":
            if full == "updateLookup":
                event["fullDocument"] = None  # read after the delete: the document is gone
            elif full in ("whenAvailable", "required"):
                event["fullDocument"] = {"_id": 1, "a": 2} if images else None
        if op != "insert" and before != "off":
            event["fullDocumentBeforeChange"] = pre[op] if images else None
        events.append(event)
    return events


ORDER = {
    "insert": ["_id", "operationType", "clusterTime", "wallTime", "fullDocument", "ns",
               "documentKey"],
    "update": ["_id", "operationType", "clusterTime", "wallTime", "fullDocument", "ns",
               "documentKey", "updateDescription", "fullDocumentBeforeChange"],
    "replace": ["_id", "operationType", "clusterTime", "wallTime", "fullDocument", "ns",
                "documentKey", "fullDocumentBeforeChange"],
    "delete": ["_id", "operationType", "clusterTime", "wallTime", "ns", "documentKey",
               "fullDocumentBeforeChange"],
}


@pytest.mark.parametrize("coll", ["on", "off"])
@pytest.mark.parametrize("full", FULL_MODES)
@pytest.mark.parametrize("before", BEFORE_MODES)
def test_image_modes(client, world, coll, before, full):
    expected = _expected(coll, before, full)
    if isinstance(expected, tuple):
        prefix, op = expected
        with pytest.raises(errors.OperationFailure) as info:
            _read(client, world, coll, before, full)
        ts = world.ts[(coll, op)]
        assert info.value.code == 47
        assert info.value.details["codeName"] == "NoMatchingDocument"
        assert info.value.details["errmsg"] == prefix + (
            f'{{operationType: "{op}", ns: {{db: "{DB}", coll: "{coll}"}}, '
            f"clusterTime: Timestamp({ts.time}, {ts.inc})}}"
        )
        assert "ResumableChangeStreamError" not in info.value.details.get("errorLabels", [])
        return
    events = _read(client, world, coll, before, full)
    for event, want in zip(events, expected, strict=True):
        op = want["operationType"]
        assert event["operationType"] == op
        assert event["clusterTime"] == world.ts[(coll, op)]
        for name in ("fullDocument", "fullDocumentBeforeChange"):
            if name in want:
                assert event[name] == want[name], (op, name)
            else:
                assert name not in event, (op, name)
        assert list(event) == [k for k in ORDER[op] if k in event]


def test_update_lookup_reads_the_current_document(client):
    db = client[DB]
    coll = db.lookup
    coll.insert_one({"_id": 1, "a": 1})
    with coll.watch(full_document="updateLookup", max_await_time_ms=50) as stream:
        coll.update_one({"_id": 1}, {"$set": {"a": 2}})
        coll.update_one({"_id": 1}, {"$set": {"a": 3}})
        events = [stream.next(), stream.next()]
    # Both read the document as it is now, not as it was after each update.
    assert [e["fullDocument"] for e in events] == [{"_id": 1, "a": 3}] * 2
    db.lookup.drop()
    db.create_collection("lookup")
    db.lookup.insert_one({"_id": 1, "a": "new generation"})
    with coll.watch(start_at_operation_time=events[0]["clusterTime"],
                    full_document="updateLookup", max_await_time_ms=50) as stream:
        first = stream.next()
    # Another collection generation (UUID) under the same name: no document.
    assert first["operationType"] == "update" and first["fullDocument"] is None


def test_images_enabled_later_only_for_later_writes(client, server):
    db = client[DB]
    coll = db.later
    coll.insert_one({"_id": 1, "a": 1})
    start = server.entries()[-1]["ts"]
    coll.update_one({"_id": 1}, {"$set": {"a": 2}})  # no pre-image recorded
    db.command("collMod", "later", changeStreamPreAndPostImages={"enabled": True})
    coll.update_one({"_id": 1}, {"$set": {"a": 3}})
    with coll.watch(start_at_operation_time=start, full_document_before_change="whenAvailable",
                    full_document="whenAvailable", max_await_time_ms=50) as stream:
        insert, first, second = stream.next(), stream.next(), stream.next()
    assert insert["operationType"] == "insert" and "fullDocumentBeforeChange" not in insert
    assert first["fullDocumentBeforeChange"] is None and first["fullDocument"] is None
    assert second["fullDocumentBeforeChange"] == {"_id": 1, "a": 2}
    assert second["fullDocument"] == {"_id": 1, "a": 3}
    with pytest.raises(errors.OperationFailure) as info:
        with coll.watch(start_at_operation_time=start, full_document="required",
                        max_await_time_ms=50) as stream:
            stream.next()
    assert info.value.code == 47 and info.value.details["errmsg"].startswith(POST_MSG)


def test_required_pre_image_error_on_get_more_closes_the_stream(client, server):
    """A stream already open fails when a write without a pre-image arrives."""
    coll = client[DB].late_error
    coll.insert_one({"_id": 1})
    with coll.watch(full_document_before_change="required", max_await_time_ms=50) as stream:
        assert stream.try_next() is None  # open, idle
        coll.delete_one({"_id": 1})
        with pytest.raises(errors.OperationFailure) as info:
            while stream.try_next() is None:
                pass
        assert info.value.code == 47
        ts = server.entries()[-1]["ts"]
        assert info.value.details["errmsg"] == PRE_MSG + (
            f'{{operationType: "delete", ns: {{db: "{DB}", coll: "late_error"}}, '
            f"clusterTime: Timestamp({ts.time}, {ts.inc})}}"
        )
        assert not stream.alive
    assert server.cursor_ids() == set()


def test_transaction_event_error_names_its_txn_number(client, server):
    coll = client[DB].txn_error
    coll.insert_one({"_id": 1})
    start = server.entries()[-1]["ts"]
    with client.start_session() as session:
        session.with_transaction(lambda s: coll.update_one({"_id": 1}, {"$set": {"a": 1}},
                                                           session=s))
        txn_number = server.entries()[-1]["txnNumber"]
    ts = server.entries()[-1]["ts"]
    with pytest.raises(errors.OperationFailure) as info:
        with coll.watch(start_at_operation_time=start, full_document_before_change="required",
                        max_await_time_ms=50) as stream:
            stream.next()
    assert info.value.details["errmsg"] == PRE_MSG + (
        f'{{operationType: "update", ns: {{db: "{DB}", coll: "txn_error"}}, '
        f"clusterTime: Timestamp({ts.time}, {ts.inc}), txnNumber: {txn_number}}}"
    )


def test_async_client_images(server, world):
    async def main():
        client = AsyncMongoClient(server.direct_uri)
        try:
            coll = client[DB]["on"]
            async with await coll.watch(start_at_operation_time=world.start,
                                        full_document="required",
                                        full_document_before_change="required",
                                        max_await_time_ms=50) as stream:
                events = []
                while len(events) < 4:
                    event = await stream.try_next()
                    if event is not None:
                        events.append(event)
            with pytest.raises(errors.OperationFailure) as info:
                async with await client[DB]["off"].watch(
                    start_at_operation_time=world.start, full_document="required",
                    max_await_time_ms=50,
                ) as stream:
                    await stream.next()
            return events, info.value.code
        finally:
            await client.close()

    events, code = asyncio.run(main())
    assert [e["operationType"] for e in events] == OPS
    assert events[1]["fullDocument"] == {"_id": 1, "a": 2}
    assert events[1]["fullDocumentBeforeChange"] == {"_id": 1, "a": 1}
    assert events[3]["fullDocumentBeforeChange"] == {"_id": 1, "b": 1}
    assert code == 47


def test_pre_images_are_readable_as_config_system_preimages(client, server, world):
    """As on mongod, other change-stream servers (a cdcserver with this one as upstream) read
    pre-images from `config.system.preimages`."""
    from pipeline_stages.image_source import pre_image_id

    coll = client.config["system.preimages"]
    on = server.store.get(DB, "on")
    docs = [d for d in coll.find() if d["_id"]["nsUUID"] == on.ui]
    assert [list(d) for d in docs] == [["_id", "operationTime", "preImage"]] * 3
    assert [list(d["_id"]) for d in docs] == [["nsUUID", "ts", "applyOpsIndex"]] * 3
    assert [d["preImage"] for d in docs] == [
        {"_id": 1, "a": 1}, {"_id": 1, "a": 2}, {"_id": 1, "b": 1},
    ]
    assert [d["_id"]["ts"] for d in docs] == [world.ts[("on", op)] for op in OPS[1:]]
    wanted = [pre_image_id(on.ui, world.ts[("on", "delete")]),
              pre_image_id(on.ui, world.ts[("on", "insert")])]  # no pre-image for an insert
    found = list(coll.find({"_id": {"$in": wanted}}))
    assert [d["preImage"] for d in found] == [{"_id": 1, "b": 1}]
    assert coll.find_one({"_id": wanted[0]})["preImage"] == {"_id": 1, "b": 1}
    off = server.store.get(DB, "off")
    assert coll.find_one({"_id.nsUUID": off.ui}) is None
