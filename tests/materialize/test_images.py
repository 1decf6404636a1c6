"""Images from the copy: a materialized namespace's `fullDocument: whenAvailable | required`
and `fullDocumentBeforeChange` come from the sidecar's copy at the event's own time, whether
or not the upstream collection has `changeStreamPreAndPostImages`.

A (cdcserver's embedded store) has two collections given the same writes: `shop.on` with
pre- and post-images enabled, `shop.off` without. A's own streams are the reference: on
`shop.on` its images, on `shop.off` null images. Sidecar B materializes `shop.*` and answers:
on `shop.on` A's events byte for byte, and on `shop.off` A's `shop.off` events byte for byte
except that each image is the one A gave for the same write on `shop.on` — what mongod would
give had the collection had images on. The writes: `$v: 2` diffs (fields, nested fields,
arrays), replacements, deletes, transactions, findAndModify, and DDL between them (rename,
collMod), documents cloned by the initial sync included.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import bson
import pytest
from bson.raw_bson import RawBSONDocument
from pymongo import MongoClient, errors

from cdcserver.sources.mongo_common import next_ts
from tests.materialize.support import MaterializedSidecar, raw_client
from tests.server.test_upstream import drain_until, latest_ts, watch
from tests.support.embedded_support import EmbeddedServer

IMAGES = {"full_document": "whenAvailable", "full_document_before_change": "whenAvailable"}
REQUIRED = {"full_document": "required", "full_document_before_change": "required"}


def before_sync(ca: MongoClient) -> None:
    shop = ca.shop
    shop.create_collection("on", changeStreamPreAndPostImages={"enabled": True})
    shop.create_collection("off")
    for name in ("on", "off"):
        shop[name].insert_many([
            {"_id": i, "n": i, "tags": ["a", "b"], "sub": {"x": 1, "y": [1, 2, 3]}}
            for i in range(6)
        ])


def writes(ca: MongoClient, on: str, off: str, tag: str) -> None:
    """The same writes to both collections, one after the other."""
    shop = ca.shop
    for name in (on, off):
        c = shop[name]
        c.update_one({"_id": 0}, {"$set": {"n": 100, "sub.x": 2}, "$push": {"tags": "c"}})
        c.update_one({"_id": 0}, {"$unset": {"sub.y": ""}, "$set": {"tags.0": "z"}})
        c.update_one({"_id": 1}, {"$pop": {"tags": 1}, "$inc": {"n": 1}})
        c.update_one({"_id": 1}, {"$set": {"sub.y.1": 20, "new": {"deep": [1]}}})
        c.replace_one({"_id": 2}, {"replaced": True, "n": 2.5})
        c.update_one({"_id": 2}, {"$set": {"replaced": False}})
        c.delete_one({"_id": 3})
        c.insert_one({"_id": "s" + tag, "v": 1})
        c.update_one({"_id": "s" + tag}, {"$set": {"v": 2}})
        c.find_one_and_update({"_id": 4}, {"$set": {"fam": 1}})
        c.find_one_and_delete({"_id": 5})
    for name in (on, off):
        c = shop[name]
        with ca.start_session() as session:
            session.with_transaction(lambda s, c=c: (
                c.update_one({"_id": 0}, {"$set": {"t": 1}}, session=s),
                c.update_one({"_id": 0}, {"$set": {"t": 2}}, session=s),
                c.delete_one({"_id": "s" + tag}, session=s),
                c.insert_one({"_id": "t" + tag}, session=s),
                c.update_one({"_id": "t" + tag}, {"$set": {"in_txn": True}}, session=s),
            ))
        c.update_many({}, {"$inc": {"all": 1}})


def after_ddl(ca: MongoClient) -> None:
    shop = ca.shop
    shop.on.rename("on2")
    shop.off.rename("off2")
    for name in ("on2", "off2"):
        ca.shop.command("collMod", name, validationLevel="moderate")
    writes(ca, "on2", "off2", "2")


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    a = EmbeddedServer()
    b: MaterializedSidecar | None = None
    try:
        ca = raw_client(a.uri)
        before_sync(ca)
        b = MaterializedSidecar(a.uri, str(tmp_path_factory.mktemp("b")), ["shop.*"])
        b.wait_applied(latest_ts(a))
        t0 = next_ts(latest_ts(a))  # the first write after the sync
        writes(ca, "on", "off", "1")
        after_ddl(ca)
        ca.sentinel.s.insert_one({"_id": "end"})
        end = latest_ts(a)
        b.wait_applied(end)
        yield {"a": a, "b": b, "ca": ca, "t0": t0, "end": end}
        ca.close()
    finally:
        if b is not None:
            b.stop()
        a.stop()


def events(uri: str, world: dict[str, Any], options: dict[str, Any]) -> list[Any]:
    with raw_client(uri) as client:
        with watch(client, "shop", {**options, "start_at_operation_time": world["t0"]}) as s:
            return drain_until(s, world["end"])


def series(evs: list[Any], names: tuple[str, ...]) -> list[Any]:
    return [e for e in evs if e["ns"]["coll"] in names]


def with_images_of(event: RawBSONDocument, donor: RawBSONDocument) -> bytes:
    """`event` with the image fields `donor` (the same write on the other collection) has."""
    fields = dict(event.items())
    for name in ("fullDocumentBeforeChange", "fullDocument"):
        if name in fields and (name != "fullDocument" or event["operationType"] == "update"):
            fields[name] = donor[name]
    # Element by element: bson.encode would move a top-level `_id` first (a transaction's
    # events start with txnNumber and lsid).
    body = b"".join(bson.encode({k: v})[4:-1] for k, v in fields.items())
    return (len(body) + 5).to_bytes(4, "little") + body + b"\x00"


def test_images_on_an_enabled_collection_are_the_upstreams(world):
    on = ("on", "on2")
    from_a = series(events(world["a"].uri, world, IMAGES), on)
    from_b = series(events(world["b"].direct_uri, world, IMAGES), on)
    assert any(e.get("fullDocumentBeforeChange") is not None for e in from_a)
    assert [e.raw for e in from_b] == [e.raw for e in from_a]


@pytest.mark.parametrize("options", [
    IMAGES,
    {"full_document": "whenAvailable"},  # the post-image alone: its pre-image looked up
    {"full_document_before_change": "required"},
], ids=["both", "post-image", "pre-image-required"])
def test_images_on_a_disabled_collection_come_from_the_copy(world, options):
    b = world["b"]
    served = b.call(lambda: b.materializer.images_served)
    queries = b.call(lambda: b.source.images.queries)
    a_options = {k: "whenAvailable" for k in options}  # A has none to require
    a_events = events(world["a"].uri, world, a_options)
    a_on, a_off = series(a_events, ("on", "on2")), series(a_events, ("off", "off2"))
    b_off = series(events(b.direct_uri, world, options), ("off", "off2"))
    assert len(a_on) == len(a_off) == len(b_off)
    image = ("fullDocumentBeforeChange" if "full_document_before_change" in options
             else "fullDocument")
    assert all(e.get(image) is None for e in a_off if e["operationType"] in (
        "update", "delete")), "A has no images"
    with_images = [e for e in a_on if e.get(image) is not None
                   and e["operationType"] in ("update", "delete", "replace")]
    assert len(with_images) >= 20
    expected = [with_images_of(off, on) for off, on in zip(a_off, a_on)]
    assert [e.raw for e in b_off] == expected
    assert b.call(lambda: b.materializer.images_served) - served >= len(with_images)
    assert b.call(lambda: b.source.images.queries) == queries, "nothing asked of A"


def test_required_images_on_a_disabled_collection(world):
    """`required`: A fails the stream (no pre-image); B answers every event from the copy."""
    with pytest.raises(errors.OperationFailure) as failed:
        events(world["a"].uri, world, REQUIRED)
    assert failed.value.code == 47
    from_b = series(events(world["b"].direct_uri, world, REQUIRED), ("off", "off2"))
    updates = [e for e in from_b if e["operationType"] == "update"]
    assert updates and all(e["fullDocument"] is not None for e in updates)


def test_update_lookup_is_the_current_document(world):
    """`updateLookup` keeps mongod's meaning: the document now, not at the event's time."""
    b = world["b"]
    opts = {"full_document": "updateLookup"}
    from_a = series(events(world["a"].uri, world, opts), ("off", "off2"))
    from_b = series(events(b.direct_uri, world, opts), ("off", "off2"))
    assert [e.raw for e in from_b] == [e.raw for e in from_a]
    # (an update on shop.off, renamed since, looks up nothing: null, as in mongod)
    first = next(e for e in from_b if e["operationType"] == "update"
                 and e["ns"]["coll"] == "off2")
    now = world["ca"].shop.off2.find_one({"_id": first["documentKey"]["_id"]})
    assert now is not None and first["fullDocument"] == now
    with_images = series(events(b.direct_uri, world, IMAGES), ("off2",))
    at_its_time = next(e for e in with_images if e["_id"] == first["_id"])
    assert at_its_time["fullDocument"] != now  # the document as that update left it


def test_the_copy_equals_the_upstream(world):
    b, ca = world["b"], world["ca"]
    from tests.materialize.support import sorted_raw

    for name in ("on2", "off2"):
        assert b.documents("shop", name) == sorted_raw(ca, "shop", name)
    assert b.documents("shop", "off") == []  # renamed away


def test_a_copy_behind_the_event_is_a_resumable_error_not_a_null_image(tmp_path):
    """The copy stalled (its apply loop held) behind an update: the image stage gets
    NetworkTimeout (89, resumable: the driver resumes) rather than a null image; once the copy
    catches up, the same stream position gives the image."""
    a = EmbeddedServer()
    b = None
    try:
        ca = raw_client(a.uri)
        ca.shop.off.insert_one({"_id": 1, "v": 1})
        b = MaterializedSidecar(a.uri, str(tmp_path / "b"), ["shop.*"], lookup_timeout_ms=300)
        b.wait_applied(latest_ts(a))
        m = b.materializer
        b.call(lambda: setattr(m, "_apply_available", lambda: False))  # held
        start = next_ts(latest_ts(a))
        ca.shop.off.update_one({"_id": 1}, {"$set": {"v": 2}})
        cmd = {"aggregate": "off", "cursor": {}, "maxTimeMS": 2000,
               "pipeline": [{"$changeStream": {"startAtOperationTime": start,
                                               "fullDocumentBeforeChange": "required"}}]}
        with MongoClient(b.direct_uri) as cb:
            with pytest.raises(errors.OperationFailure) as behind:
                reply = cb.shop.command(cmd)
                cb.shop.command("getMore", reply["cursor"]["id"], collection="off",
                                maxTimeMS=2000)
            assert behind.value.code == 89
            b.call(lambda: m.__dict__.pop("_apply_available"))  # released
            b.wait_applied(latest_ts(a))
            reply = cb.shop.command(cmd)
            batch = reply["cursor"]["firstBatch"] or cb.shop.command(
                "getMore", reply["cursor"]["id"], collection="off")["cursor"]["nextBatch"]
            assert batch[0]["fullDocumentBeforeChange"] == {"_id": 1, "v": 1}
    finally:
        if b is not None:
            b.stop()
        a.stop()
