"""DDL commands of the embedded store: create, drop, renameCollection, dropDatabase,
createIndexes, dropIndexes, listIndexes, collMod, listCollections, listDatabases."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from bson.binary import Binary
from bson.int64 import Int64

from cdcserver.commands import oplog_find
from cdcserver.commands.crud import coll_arg, cursor_first_batch, get_store
from cdcserver.commands.registry import COMMANDS, command
from cdcserver.embedded import engine
from cdcserver.embedded.store import ID_INDEX, Collection, Store, bson_string, ordered_options
from pipeline_stages.errors import MongoError
from pipeline_stages.value_string import type_name

# Options `create` accepts and stores (others are refused as unknown fields).
_CREATE_OPTIONS = {
    "capped", "size", "max", "autoIndexId", "changeStreamPreAndPostImages", "storageEngine",
    "indexOptionDefaults", "validator", "validationLevel", "validationAction", "collation",
    "expireAfterSeconds", "clusteredIndex", "temp",
}
# Generic command arguments drivers add (not options).
_GENERIC = {
    "$db", "lsid", "txnNumber", "writeConcern", "readConcern", "$clusterTime", "comment",
    "maxTimeMS", "$readPreference", "apiVersion", "apiStrict", "apiDeprecationErrors",
    "autocommit", "startTransaction", "stmtId", "$audit", "$client",
}


def _ns_not_found(ns: str) -> MongoError:
    return MongoError(26, f"ns does not exist: {ns}")


# ---------------------------------------------------------------------------------------------
# create / drop / rename / dropDatabase


def _check_pre_post(value: Any) -> None:
    if not isinstance(value, Mapping) or not isinstance(value.get("enabled"), bool):
        raise MongoError(
            40414,
            "BSON field 'changeStreamPreAndPostImages.enabled' is missing but a required field",
        )


@command("create")
async def create(server, conn, cmd, db):
    store = get_store(server)
    coll = coll_arg(cmd, "create")
    options: dict[str, Any] = {}
    for k, v in cmd.items():
        if k == "create" or k in _GENERIC:
            continue
        if k in ("viewOn", "pipeline", "timeseries", "encryptedFields"):
            raise MongoError(2, f"'{k}' (views, time series, queryable encryption) is not "
                             "supported by cdcserver's embedded store yet")
        if k not in _CREATE_OPTIONS:
            raise MongoError(40415, f"BSON field 'create.{k}' is an unknown field.")
        if k == "changeStreamPreAndPostImages":
            _check_pre_post(v)
            v = {"enabled": v["enabled"]}
        options[k] = v
    with store.batch():
        existing = store.get(db, coll)
        if existing is not None:
            if ordered_options(options) == existing.options:
                return {}
            raise MongoError(48, f"Collection {db}.{coll} already exists.")
        store.create_collection(db, coll, options)
    return {}


@command("drop")
async def drop(server, conn, cmd, db):
    store = get_store(server)
    coll = coll_arg(cmd, "drop")
    with store.batch():
        c = store.drop_collection(db, coll)
    if c is None:
        return {}
    return {"nIndexesWas": len(c.indexes), "ns": f"{db}.{coll}"}


@command("dropDatabase")
async def drop_database(server, conn, cmd, db):
    store = get_store(server)
    if db in ("admin", "config", "local"):
        raise MongoError(20, f"Cannot drop '{db}' database while replication is active")
    with store.batch():
        dropped = store.drop_database(db)
    return {"dropped": db} if dropped else {}


@command("renameCollection")
async def rename_collection(server, conn, cmd, db):
    store = get_store(server)
    if db != "admin":
        raise MongoError(13, "renameCollection may only be run against the admin database.")
    source, target = cmd.get("renameCollection"), cmd.get("to")
    for name, value in (("renameCollection", source), ("to", target)):
        if not isinstance(value, str):
            raise MongoError(
                14, f"BSON field 'renameCollection.{name}' is the wrong type "
                f"'{type_name(value)}', expected type 'string'",
            )
    src_db, _, src_coll = source.partition(".")
    to_db, _, to_coll = target.partition(".")
    if not src_coll:
        raise MongoError(73, f"Invalid source namespace: {source}")
    if not to_coll:
        raise MongoError(73, f"Invalid target namespace: {target}")
    drop_target = cmd.get("dropTarget") is True
    with store.batch():
        src = store.get(src_db, src_coll)
        if src is None:
            raise MongoError(26, f"Source collection {source} does not exist")
        if source == target:
            raise MongoError(20, "Can't rename a collection to itself")
        if store.get(to_db, to_coll) is not None and not drop_target:
            raise MongoError(48, "Target namespace exists")
        store.rename_collection(src, to_db, to_coll, drop_target)
    return {}


# ---------------------------------------------------------------------------------------------
# Indexes


def index_name(key: Mapping[str, Any]) -> str:
    return "_".join(f"{k}_{v}" for k, v in key.items())


def _spec_string(spec: Mapping[str, Any]) -> str:
    return bson_string(spec)


_INDEX_OPTIONS = {
    "unique", "sparse", "partialFilterExpression", "expireAfterSeconds", "hidden", "collation",
    "background", "prepareUnique", "weights", "default_language", "language_override",
    "textIndexVersion", "2dsphereIndexVersion", "bits", "min", "max", "wildcardProjection",
    "storageEngine", "bucketSize", "ns",
}


def normalize_index_spec(raw: Any) -> dict[str, Any]:
    """The spec as mongod stores and logs it (IndexCatalogImpl::_fixIndexSpec): `v`, then
    `unique` / `hidden` / `prepareUnique` when true, `key`, `name`, then every other field in
    the order given."""
    if not isinstance(raw, Mapping):
        raise MongoError(14, "BSON field 'createIndexes.indexes' element is not an object")
    key = raw.get("key")
    if not isinstance(key, Mapping) or not key:
        raise MongoError(67 if isinstance(key, Mapping) else 9,
                         "Index keys cannot be an empty field." if isinstance(key, Mapping)
                         else "The 'key' field is a required property of an index specification")
    name = raw.get("name")
    if not isinstance(name, str) or not name:
        raise MongoError(9, "The 'name' field is a required property of an index specification")
    for k in raw:
        if k not in ("key", "name", "v", "_id", "dropDups") and k not in _INDEX_OPTIONS:
            raise MongoError(
                197, f"The field '{k}' is not valid for an index specification. "
                f"Specification: {_spec_string(raw)}",
            )
    if name == "_id_" and (list(key) != ["_id"]):
        raise MongoError(197, "The index name '_id_' is reserved for the _id index")
    spec: dict[str, Any] = {"v": 2}
    for flag in ("unique", "hidden", "prepareUnique"):
        if raw.get(flag):
            spec[flag] = True
    spec["key"] = dict(key)
    spec["name"] = name
    for k, v in raw.items():
        if k in ("_id", "dropDups", "ns", "unique", "key", "v", "name", "hidden",
                 "prepareUnique"):
            continue
        spec[k] = dict(v) if isinstance(v, Mapping) else v
    return spec


def _comparable(spec: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in spec.items() if k not in ("v", "name", "background", "hidden")}


@command("createIndexes")
async def create_indexes(server, conn, cmd, db):
    store = get_store(server)
    coll = coll_arg(cmd, "createIndexes")
    raw = cmd.get("indexes")
    if not isinstance(raw, list):
        raise MongoError(40414 if raw is None else 14,
                         "BSON field 'createIndexes.indexes' is missing but a required field"
                         if raw is None else
                         f"BSON field 'createIndexes.indexes' is the wrong type "
                         f"'{type_name(raw)}', expected type 'array'")
    if not raw:
        raise MongoError(2, "Must specify at least one index to create")
    specs = [normalize_index_spec(r) for r in raw]
    with store.batch():
        c = store.get(db, coll)
        created = c is None
        if c is None:
            c = store.create_collection(db, coll)
        before = len(c.indexes)
        new: list[dict[str, Any]] = []
        for spec in specs:
            same_name = c.index(spec["name"]) or next(
                (s for s in new if s["name"] == spec["name"]), None
            )
            same_key = next(
                (s for s in [*c.indexes, *new] if dict(s["key"]) == dict(spec["key"])), None
            )
            if same_name is not None:
                if _comparable(same_name) == _comparable(spec):
                    continue
                if dict(same_name["key"]) != dict(spec["key"]):
                    raise MongoError(
                        86,
                        "An existing index has the same name as the requested index. When index "
                        "names are not specified, they are auto generated and can cause "
                        "conflicts. Please refer to our documentation. Requested index: "
                        f"{_spec_string(spec)}, existing index: {_spec_string(same_name)}",
                    )
                raise MongoError(
                    85,
                    f"An existing index has the same name as the requested index. Requested "
                    f"index: {_spec_string(spec)}, existing index: {_spec_string(same_name)}",
                )
            if same_key is not None and _comparable(same_key) == _comparable(spec):
                raise MongoError(
                    85,
                    "Index already exists with a different name: " + same_key["name"],
                )
            new.append(spec)
        if new:
            store.create_indexes(c, new)
    reply: dict[str, Any] = {
        "numIndexesBefore": before,
        "numIndexesAfter": len(c.indexes),
    }
    if not new:
        reply["note"] = "all indexes already exist"
    else:
        reply["createdCollectionAutomatically"] = created
    reply["commitQuorum"] = "votingMembers"
    return reply


@command("dropIndexes", "deleteIndexes")
async def drop_indexes(server, conn, cmd, db):
    store = get_store(server)
    name = next(iter(cmd))
    coll = coll_arg(cmd, name)
    which = cmd.get("index")
    with store.batch():
        c = store.get(db, coll)
        if c is None:
            raise _ns_not_found(f"{db}.{coll}")
        was = len(c.indexes)
        names: list[str]
        if which == "*":
            names = [s["name"] for s in c.indexes[1:]]
        elif isinstance(which, str):
            names = [which]
        elif isinstance(which, list):
            names = [str(n) for n in which]
        elif isinstance(which, Mapping):
            found = [s for s in c.indexes if dict(s["key"]) == dict(which)]
            if not found:
                raise MongoError(27, f"can't find index with key: {bson_string(dict(which))}")
            if len(found) > 1:
                raise MongoError(
                    27 if False else 2,
                    f"{len(found)} indexes found for key: {bson_string(dict(which))}, identify "
                    "by name instead. Conflicting indexes: "
                    + ", ".join(_spec_string(s) for s in found),
                )
            names = [found[0]["name"]]
        else:
            raise MongoError(40414, "BSON field 'dropIndexes.index' is missing but a required "
                             "field")
        for n in names:
            if n == "_id_":
                raise MongoError(72, "cannot drop _id index")
            if c.index(n) is None:
                raise MongoError(27, f"index not found with name [{n}]")
        for n in names:
            store.drop_index(c, n)
    return {"nIndexesWas": was}


@command("listIndexes")
async def list_indexes(server, conn, cmd, db):
    store = get_store(server)
    coll = coll_arg(cmd, "listIndexes")
    c = store.get(db, coll)
    if c is None:
        raise _ns_not_found(f"{db}.{coll}")
    batch_size = None
    if isinstance(cmd.get("cursor"), Mapping) and cmd["cursor"].get("batchSize") is not None:
        batch_size = int(cmd["cursor"]["batchSize"])
    return cursor_first_batch(server, f"{db}.$cmd.listIndexes.{coll}",
                              [dict(s) for s in c.indexes], batch_size)


# ---------------------------------------------------------------------------------------------
# collMod


_COLLMOD_OPTIONS = {
    "changeStreamPreAndPostImages", "validator", "validationLevel", "validationAction",
    "expireAfterSeconds", "index", "collation",
}


def _find_index(c: Collection, spec: Mapping[str, Any]) -> dict[str, Any]:
    if "name" in spec:
        found = c.index(spec["name"])
        if found is None:
            raise MongoError(27, f"cannot find index {spec['name']} for ns {c.ns}")
        return found
    if "keyPattern" in spec:
        key = dict(spec["keyPattern"])
        found = next((s for s in c.indexes if dict(s["key"]) == key), None)
        if found is None:
            raise MongoError(27, f"cannot find index {bson_string(key)} for ns {c.ns}")
        return found
    raise MongoError(2, "must specify either index name or key pattern")


@command("collMod")
async def coll_mod(server, conn, cmd, db):
    store = get_store(server)
    coll = coll_arg(cmd, "collMod")
    with store.batch():
        c = store.get(db, coll)
        if c is None:
            raise _ns_not_found(f"{db}.{coll}")
        o: dict[str, Any] = {"collMod": coll}
        new_options: dict[str, Any] = {}
        index_change = None
        reply: dict[str, Any] = {}
        for k, v in cmd.items():
            if k == "collMod" or k in _GENERIC:
                continue
            if k not in _COLLMOD_OPTIONS:
                raise MongoError(40415, f"BSON field 'collMod.{k}' is an unknown field.")
            if k == "index":
                if not isinstance(v, Mapping):
                    raise MongoError(14, "BSON field 'collMod.index' is the wrong type")
                spec = _find_index(c, v)
                changes = {f: v[f] for f in v if f not in ("name", "keyPattern")}
                if not changes:
                    raise MongoError(
                        2, "no expireAfterSeconds, hidden, unique, or prepareUnique field"
                    )
                old: dict[str, Any] = {}
                for f, value in changes.items():
                    if f in ("hidden", "prepareUnique", "unique"):
                        old[f] = bool(spec.get(f, False))
                        reply[f"{f}_old"] = old[f]
                        reply[f"{f}_new"] = value
                    elif f == "expireAfterSeconds":
                        if "expireAfterSeconds" in spec:
                            old[f] = spec[f]
                            reply["expireAfterSeconds_old"] = spec[f]
                        reply["expireAfterSeconds_new"] = value
                    else:
                        raise MongoError(40415, f"BSON field 'collMod.index.{f}' is an unknown "
                                         "field.")
                index_change = (spec["name"], changes, old)
                o["index"] = {"name": spec["name"], **changes}
                continue
            if k == "changeStreamPreAndPostImages":
                _check_pre_post(v)
                v = {"enabled": v["enabled"]}
            new_options[k] = v
            o[k] = v
        store.coll_mod(c, o, new_options, index_change)
    return reply


# ---------------------------------------------------------------------------------------------
# listCollections / listDatabases


def collection_info(c: Collection) -> dict[str, Any]:
    return {
        "name": c.name,
        "type": "collection",
        "options": dict(c.options),
        "info": {"readOnly": False, "uuid": Binary(c.uuid, 4)},
        "idIndex": dict(ID_INDEX),
    }


# The oplog-derived versions (handshake.py), used when serving a recorded oplog.
_OPLOG_LIST_COLLECTIONS = COMMANDS.get("listCollections")
_OPLOG_LIST_DATABASES = COMMANDS.get("listDatabases")


@command("listCollections")
async def list_collections(server, conn, cmd, db):
    if getattr(server, "store", None) is None and _OPLOG_LIST_COLLECTIONS is not None:
        return await _OPLOG_LIST_COLLECTIONS(server, conn, cmd, db)
    store = get_store(server)
    filter_doc = cmd.get("filter") or {}
    name_only = cmd.get("nameOnly") is True
    out = []
    infos = [collection_info(c) for c in store.collections_of(db)]
    if db == oplog_find.OPLOG_DB:
        infos.append(oplog_find.collection_info(server.log))
    for info in infos:
        if filter_doc and not engine.matches(filter_doc, info):
            continue
        out.append({"name": info["name"], "type": "collection"} if name_only else info)
    batch_size = None
    if isinstance(cmd.get("cursor"), Mapping) and cmd["cursor"].get("batchSize") is not None:
        batch_size = int(cmd["cursor"]["batchSize"])
    return cursor_first_batch(server, f"{db}.$cmd.listCollections", out, batch_size)


def _db_size(store: Store, db: str) -> int:
    import bson

    total = 0
    for c in store.collections_of(db):
        total += sum(len(bson.encode(d)) for d in store.documents(c).values())
    return total


@command("listDatabases")
async def list_databases(server, conn, cmd, db):
    if getattr(server, "store", None) is None and _OPLOG_LIST_DATABASES is not None:
        return await _OPLOG_LIST_DATABASES(server, conn, cmd, db)
    store = get_store(server)
    names = sorted({*store.databases(), "admin", "config", "local"})
    dbs = []
    total = 0
    for name in names:
        size = _db_size(store, name) + 4096 * max(1, len(store.collections_of(name)))
        total += size
        dbs.append({"name": name, "sizeOnDisk": Int64(size), "empty": False})
    filter_doc = cmd.get("filter")
    if filter_doc:
        dbs = [d for d in dbs if engine.matches(filter_doc, d)]
    if cmd.get("nameOnly"):
        return {"databases": [{"name": d["name"]} for d in dbs]}
    return {"databases": dbs, "totalSize": Int64(total), "totalSizeMb": Int64(total >> 20)}
