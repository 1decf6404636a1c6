"""Chunk migrations, movePrimary and resharding as crash-safe protocols, as mongod runs them.

mongod records each step of a data move on the config server before it takes the next
(the migration coordinator's `config.migrationCoordinators` and the donor's
`config.rangeDeletions`, `MovePrimaryCoordinator`'s document, resharding's
`config.reshardingOperations`), so that after a crash at any moment its recovery finishes or
undoes the move: every document exists once, on the shard the routing table names, and the
next move works. Here one record in the catalog (`ShardingCatalog.operations`, written in the
same atomic save as the chunk map it changes) stands for those documents:

- a migration: recorded, the recipient clones the range, the chunk's move and the record's
  `committed` are saved together, the donor's copy is deleted (mongod's range deleter), the
  record is dropped. Recovery deletes, on both shards, the range's documents the catalog does
  not give that shard: the recipient's clone before the commit, the donor's after.
- movePrimary: the same, for a database's unsharded collections and its primary shard.
- reshardCollection: the documents are cloned into `<db>.system.resharding.<uuid>` (a sharded
  collection of its own with the new key, as mongod's temporary resharding collection), the
  commit replaces the collection's catalog entry with it, each shard then drops the old
  collection and renames the new one over it. Before the commit recovery drops the clones
  (the collection is as it was); after, it finishes the renames.

Every write here is a migration's (`fromMigrate: true`): change streams see none of them.
The functions are synchronous: nothing else runs on the event loop between a step's writes
(the front holds new routed operations of the namespace while one runs: `PlacementHolds`).
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
from collections import Counter
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any

from bson.binary import Binary
from bson.int64 import Int64
from bson.objectid import ObjectId

from cdcserver.embedded.store import Collection
from cdcserver.sharding.catalog import ShardingCatalog, _key_bytes
from cdcserver.sharding.shard_store import ShardStore
from pipeline_stages.value_string import value_string

Stores = Mapping[str, ShardStore]
# A collection on a shard, created like the one on the database's primary (same UUID,
# options and indexes) when it does not exist there yet.
EnsureCollection = Callable[[str, str, str], Collection]

MIGRATION = "migration"
MOVE_PRIMARY = "movePrimary"
RESHARD = "reshardCollection"
MOVE_COLLECTION = "moveCollection"
UNSHARD_COLLECTION = "unshardCollection"
BALANCER_MOVE_COLLECTION = "balancerMoveCollection"  # off a draining shard


def _range(record: Mapping[str, Any]) -> dict[str, Any]:
    return {"min": record["min"], "max": record["max"]}


def _delete_unowned(catalog: ShardingCatalog, stores: Stores, shard: str, ns: str,
                    bounds: Mapping[str, Any]) -> int:
    """Delete the documents of `ns` in `bounds` on `shard` that the catalog gives another
    shard (the range deleter, for a range the shard does not own)."""
    store = stores.get(shard)
    db, coll = ns.split(".", 1)
    c = store.get(db, coll) if store is not None else None
    if store is None or c is None or not catalog.is_sharded(ns):
        return 0
    orphans = [doc for doc in store.documents(c).values()
               if catalog.in_chunk(ns, bounds, doc) and catalog.shard_for(ns, doc) != shard]
    # In shard key order, as mongod's range deleter finds them (an index scan over the shard
    # key; equal keys in record order, which the stable sort keeps).
    orphans.sort(key=lambda doc: _key_bytes(catalog.key_values(ns, doc)))
    if orphans:
        with store.migrating(), store.batch():
            for doc in orphans:
                store.delete_document(c, doc)
    return len(orphans)


# -- moveChunk / moveRange / the balancer --------------------------------------------------------

def migrate(catalog: ShardingCatalog, stores: Stores, ns: str, chunk: dict[str, Any], to: str,
            ensure: EnsureCollection) -> None:
    """Move `chunk` of `ns` to shard `to`: clone, commit, delete the donor's copy."""
    donor = chunk["shard"]
    if donor == to:
        return
    db, coll = ns.split(".", 1)
    record = catalog.begin_operation({
        "op": MIGRATION, "ns": ns, "min": dict(chunk["min"]), "max": dict(chunk["max"]),
        "donor": donor, "recipient": to, "committed": False,
    })
    recipient = stores[to]
    # Leftovers of an earlier move of this range that recovery has not seen (none normally):
    # the clone must not meet them (E11000).
    _delete_unowned(catalog, stores, to, ns, chunk)
    source = stores[donor].get(db, coll)
    target = ensure(to, db, coll)
    if not any(c["shard"] == to for c in catalog.chunks.get(ns, [])):
        _note_first_chunk_coming(recipient, ns, donor, to, source)
    docs = [] if source is None else [
        copy.deepcopy(d) for d in stores[donor].documents(source).values()
        if catalog.in_chunk(ns, chunk, d)
    ]
    with recipient.migrating(), recipient.batch():
        for doc in docs:
            recipient.insert_document(target, doc)
    record["committed"] = True
    catalog.move(ns, chunk, to)  # one save: the chunk's new owner and the record's commit
    if not any(c["shard"] == donor for c in catalog.chunks.get(ns, [])):
        _note_last_chunk_moved(stores[donor], ns, donor, source)
    _delete_unowned(catalog, stores, donor, ns, chunk)
    catalog.end_operation(record)


def _note_first_chunk_coming(store: ShardStore, ns: str, donor: str, recipient: str,
                             c: Collection | None) -> None:
    """The recipient's no-op before it clones its first chunk of `ns` (mongod's
    notifyChangeStreamsOnRecipientFirstChunk): a router opens a cursor on the shard when it
    reads it; streams that are not merged by a router never show it."""
    with store.batch():
        store.append_oplog("n", ns, {"msg": f"Migrating chunk from shard {donor} to shard "
                                            f"{recipient} with no chunks for this collection"},
                           ui=c.ui if c is not None else None,
                           o2={"migrateChunkToNewShard": ns, "fromShardId": donor,
                               "toShardId": recipient})


def _note_last_chunk_moved(store: ShardStore, ns: str, donor: str, c: Collection | None
                           ) -> None:
    """The donor's no-op once the commit left it no chunk of `ns` (mongod's
    notifyChangeStreamsOnDonorLastChunk): not a migration's write (no fromMigrate), shown as
    `migrateLastChunkFromShard` to streams with showSystemEvents and showExpandedEvents."""
    with store.batch():
        store.append_oplog("n", ns, {"msg": f"Migrate the last chunk for {ns} off shard {donor}"},
                           ui=c.ui if c is not None else None,
                           o2={"migrateLastChunkFromShard": ns, "shardId": donor})


def _recover_migration(catalog: ShardingCatalog, stores: Stores, record: Mapping[str, Any]
                       ) -> None:
    bounds = _range(record)
    for shard in (record["donor"], record["recipient"]):
        _delete_unowned(catalog, stores, shard, record["ns"], bounds)


# -- movePrimary -----------------------------------------------------------------------------------

def move_primary(catalog: ShardingCatalog, stores: Stores, db: str, to: str, colls: list[str],
                 ensure: EnsureCollection) -> None:
    """Clone `db`'s unsharded collections `colls` to `to`, make it the primary, drop them
    on the old primary."""
    donor = catalog.primary(db)
    if donor is None or donor == to:
        return
    record = catalog.begin_operation({
        "op": MOVE_PRIMARY, "db": db, "donor": donor, "recipient": to, "colls": list(colls),
        "committed": False,
    })
    old, new = stores[donor], stores[to]
    for coll in colls:
        source = old.get(db, coll)
        if source is None:
            continue
        target = ensure(to, db, coll)
        docs = [copy.deepcopy(d) for d in old.documents(source).values()]
        with new.migrating(), new.batch():
            for doc in docs:
                new.insert_document(target, doc)
    record["committed"] = True
    catalog.set_primary(db, to)  # one save, with the record's commit
    _drop_collections(old, db, colls)
    catalog.end_operation(record)


def _drop_collections(store: ShardStore | None, db: str, colls: list[str]) -> None:
    if store is None:
        return
    for coll in colls:
        if store.get(db, coll) is not None:
            with store.migrating(), store.batch():
                store.drop_collection(db, coll)


def _recover_move_primary(catalog: ShardingCatalog, stores: Stores, record: Mapping[str, Any]
                          ) -> None:
    # Before the commit the clones on the recipient go; after it, the originals.
    loser = record["donor"] if record["committed"] else record["recipient"]
    _drop_collections(stores.get(loser), record["db"], list(record["colls"]))


# -- reshardCollection -----------------------------------------------------------------------------

def temporary_namespace(db: str, old_uuid: bytes) -> str:
    """mongod's temporary resharding collection: `<db>.system.resharding.<old UUID>`."""
    import uuid as uuid_module

    return f"{db}.system.resharding.{uuid_module.UUID(bytes=old_uuid)}"


def reshard(catalog: ShardingCatalog, stores: Stores, ns: str, key: dict[str, Any], unique: bool,
            new_uuid: bytes, primary: str, options: dict[str, Any],
            indexes: list[dict[str, Any]], *, provenance: str = RESHARD,
            to: str | None = None, details: Mapping[str, Any] | None = None,
            zones: list[dict[str, Any]] | None = None,
            layout: list[tuple[dict[str, Any], dict[str, Any], str]] | None = None) -> None:
    """Reshard `ns` under `key`: clone every document into the temporary collection (owned
    by its shard under the new key), commit, then swap it in on every shard; the primary
    shard's swap writes the `reshardCollection` no-op
    (notifyChangeStreamsOnReshardCollectionComplete) with it, so the event is there once.

    moveCollection and unshardCollection are this too (their `provenance`), under `{_id: 1}`
    into one chunk on shard `to`: the collection becomes a tracked unsharded one
    (`unsplittable`) whose documents are on `to` alone. `details`: the request's
    `numInitialChunks` / `collation`, which the no-op repeats. `zones`: the collection's
    zone ranges under the new key ({tag, min, max}; its old ones go at the commit), `layout`
    the new chunks they make."""
    db, coll = ns.split(".", 1)
    source = _holder(catalog, stores, ns, primary)
    old_uuid = bytes(source.uuid) if source is not None else new_uuid
    temp = temporary_namespace(db, old_uuid)
    temp_coll = temp.split(".", 1)[1]
    record = catalog.begin_operation({
        "op": RESHARD, "ns": ns, "temp": temp, "uuid": Binary(new_uuid, 4),
        "oldUuid": Binary(old_uuid, 4), "key": dict(key),
        "oldKey": catalog.key_pattern(ns) or {"_id": 1},
        "unique": unique, "primary": primary, "provenance": provenance, "to": to,
        "details": dict(details or {}), "committed": False,
    })
    if to is None:
        catalog.shard_collection(temp, key, unique, new_uuid, primary, layout=layout)
    else:
        catalog.shard_collection(temp, key, unique, new_uuid, to, unsplittable=True)
    # The database's primary keeps a copy (empty when it owns no chunk), as of every
    # sharded collection: the front's DDL of the collection reaches it first.
    owners = {primary, *(c["shard"] for c in catalog.chunks[temp])}
    targets: dict[str, Collection] = {}
    for name in sorted(owners):
        store = stores[name]
        with store.migrating(), store.batch():
            c = store.create_collection(db, temp_coll, options, uuid=new_uuid)
            if indexes:
                store.create_indexes(c, indexes)
        targets[name] = c
    by_shard: dict[str, list[Any]] = {}
    for name in catalog.shard_names:
        store = stores[name]
        original = store.get(db, coll)
        if original is None:
            continue
        for doc in store.documents(original).values():
            by_shard.setdefault(catalog.shard_for(temp, doc), []).append(copy.deepcopy(doc))
    for name, owned in by_shard.items():
        store = stores[name]
        with store.migrating(), store.batch():
            for doc in owned:
                store.insert_document(targets[name], doc)
    record["committed"] = True
    # The zone ranges of the new key replace the old key's, in the commit's save.
    catalog.tags = [t for t in catalog.tags if t["ns"] != ns] + [
        {"_id": ObjectId(), "ns": ns, "min": z["min"], "max": z["max"], "tag": z["tag"]}
        for z in zones or []]
    catalog.rename_collection(temp, ns)  # one save: the new key, chunks and UUID, committed
    _swap_in(catalog, stores, record)
    catalog.end_operation(record)


def _swap_in(catalog: ShardingCatalog, stores: Stores, record: Mapping[str, Any]) -> None:
    """Every shard drops the collection it had under the old key and renames the clone over
    it (the clone keeps its UUID: the collection's new one)."""
    ns = record["ns"]
    db, coll = ns.split(".", 1)
    temp_coll = record["temp"].split(".", 1)[1]
    new_uuid = bytes(record["uuid"])
    for name, store in stores.items():
        old = store.get(db, coll)
        clone = store.get(db, temp_coll)
        if clone is None and (old is None or bytes(old.uuid) == new_uuid):
            continue  # swapped before the crash (or never a part of it)
        with store.batch():
            with store.migrating():
                if old is not None and bytes(old.uuid) != new_uuid:
                    store.drop_collection(db, coll)
                if clone is not None:
                    store.rename_collection(clone, db, coll, False)
            # Written by a shard that receives a clone (so its swap is pending until then).
            if name == (record.get("to") or record["primary"]):
                store.append_oplog("n", ns, {"msg": f"Reshard collection {ns} with shard key "
                                                    f"{bson_string(record['key'])}"},
                                   ui=record["oldUuid"], o2=_resharded_o2(catalog, record))


def _resharded_o2(catalog: ShardingCatalog, record: Mapping[str, Any]) -> dict[str, Any]:
    """The `reshardCollection` no-op's o2 (its event's operationDescription)."""
    provenance = record.get("provenance", RESHARD)
    o2: dict[str, Any] = {
        "reshardCollection": record["ns"], "reshardUUID": record["uuid"],
        "shardKey": record["key"], "oldShardKey": record["oldKey"],
        "unique": record["unique"],
    }
    details = record.get("details") or {}
    if provenance != RESHARD:  # one chunk, on the shard it was moved to
        o2["numInitialChunks"] = Int64(1)
    elif "numInitialChunks" in details:
        o2["numInitialChunks"] = Int64(details["numInitialChunks"])
    if "collation" in details:
        o2["collation"] = details["collation"]
    o2["provenance"] = provenance
    zones = catalog.zone_ranges(record["ns"])  # the collection's, after the commit
    if zones:
        o2["zones"] = [{"zone": t["tag"], "min": t["min"], "max": t["max"]} for t in zones]
    return o2


def bson_string(doc: Mapping[str, Any]) -> str:
    """BSONObj::toString: `{ a: 1, b: "x" }` (`{}` when empty)."""
    if not doc:
        return "{}"
    return "{ " + ", ".join(f"{k}: {value_string(v)}" for k, v in doc.items()) + " }"


def _holder(catalog: ShardingCatalog, stores: Stores, ns: str, primary: str
            ) -> Collection | None:
    """The collection as the shard that holds it has it: the primary's, unless the catalog
    places it (a tracked one) on shards that all lack it there."""
    db, coll = ns.split(".", 1)
    names = [primary] + sorted({c["shard"] for c in catalog.chunks.get(ns, [])} - {primary})
    for name in names:
        store = stores.get(name)
        c = store.get(db, coll) if store is not None else None
        if c is not None:
            return c
    return None


def _recover_reshard(catalog: ShardingCatalog, stores: Stores, record: Mapping[str, Any]
                     ) -> None:
    if record["committed"]:
        _swap_in(catalog, stores, record)
        return
    db, temp_coll = record["temp"].split(".", 1)
    for store in stores.values():
        _drop_collections(store, db, [temp_coll])
    catalog.drop_collection(record["temp"])


_RECOVER = {
    MIGRATION: _recover_migration,
    MOVE_PRIMARY: _recover_move_primary,
    RESHARD: _recover_reshard,
}


def recover(catalog: ShardingCatalog, stores: Stores) -> int:
    """Finish or undo every move a crash interrupted (at startup, before anything is served).
    Returns how many there were."""
    pending = list(catalog.operations)
    for record in pending:
        _RECOVER[record["op"]](catalog, stores, record)
        catalog.end_operation(record)
    return len(pending)


# -- the front's side: routed operations wait for a move's commit ------------------------------

class PlacementHolds:
    """Routed operations of a namespace against its moves, as shard versioning and the
    migration critical section keep them apart on mongod: an operation that targets shards
    from the routing table holds the namespace while it runs (its reads and writes of every
    shard see one placement: a broadcast find sees each document once); a move waits for
    the operations holding its namespace to end, and operations arriving meanwhile wait for
    the move (the critical section)."""

    def __init__(self) -> None:
        self._holding: Counter[str] = Counter()
        self._moving: dict[str, asyncio.Event] = {}
        self._released: dict[str, asyncio.Event] = {}

    @contextlib.asynccontextmanager
    async def routing(self, ns: str) -> AsyncIterator[None]:
        while (moving := self._moving.get(ns)) is not None:
            await moving.wait()
        self._holding[ns] += 1
        try:
            yield
        finally:
            self._holding[ns] -= 1
            if not self._holding[ns]:
                del self._holding[ns]
                released = self._released.pop(ns, None)
                if released is not None:
                    released.set()

    @contextlib.asynccontextmanager
    async def critical_section(self, ns: str) -> AsyncIterator[None]:
        while (moving := self._moving.get(ns)) is not None:  # one move of a namespace at once
            await moving.wait()
        done = self._moving[ns] = asyncio.Event()
        try:
            while self._holding.get(ns):
                released = self._released.setdefault(ns, asyncio.Event())
                await released.wait()
            yield
        finally:
            del self._moving[ns]
            done.set()
