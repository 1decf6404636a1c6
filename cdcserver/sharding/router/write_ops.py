"""The front's writes (mongos's src/mongo/s/write_ops/): insert, update and delete split by
shard key into one batch per shard, their replies merged back into the client's statement
order; a single write without the shard key goes to the first shard with a match (8.0's
write without shard key); an update or findAndModify that changes a document's shard key
moves the document (WouldChangeOwningShard: a delete and an insert, in one transaction).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from bson.objectid import ObjectId

from cdcserver.commands.base import family
from cdcserver.context import ConnectionState, Handler, ServerState
from cdcserver.embedded import engine
from cdcserver.embedded.store import id_key as _id_key
from cdcserver.sharding.cluster import ShardedCluster
from cdcserver.sharding.router.routing import (
    cluster_of,
    forward,
    owning_shards,
    primary_shard,
    sharded_ns,
    targeted_shard,
)
from pipeline_stages.errors import MongoError

# This family's handlers (the front's whole table: router/commands.py).
TABLE: dict[str, Handler] = {}
command = family(TABLE)


def _merge_write_replies(replies: list[tuple[list[int], dict[str, Any]]]) -> dict[str, Any]:
    """Per-shard write replies into one (indexes mapped back to the client's statements)."""
    out: dict[str, Any] = {"n": 0}
    modified = None
    upserted: list[dict[str, Any]] = []
    errors: list[dict[str, Any]] = []
    for indexes, reply in replies:
        out["n"] += int(reply.get("n", 0))
        if "nModified" in reply:
            modified = (modified or 0) + int(reply["nModified"])
        for u in reply.get("upserted", []):
            upserted.append({**u, "index": indexes[u["index"]]})
        for e in reply.get("writeErrors", []):
            errors.append({**e, "index": indexes[e["index"]]})
    if upserted:
        out["upserted"] = sorted(upserted, key=lambda u: u["index"])
    if modified is not None:
        out["nModified"] = modified
    if errors:
        out["writeErrors"] = sorted(errors, key=lambda e: e["index"])
    return out


@command("insert")
async def insert(
    server: ServerState, conn: ConnectionState, cmd: dict[str, Any], db: str
) -> dict[str, Any]:
    cluster = cluster_of(server)
    ns = sharded_ns(cluster, cmd, db)
    if ns is None:
        return await forward(cluster, primary_shard(cluster, db, create=True), cmd, db)
    docs = cmd.get("documents")
    if not isinstance(docs, list):
        return await forward(cluster, primary_shard(cluster, db, create=True), cmd, db)
    docs = [d if not isinstance(d, dict) or "_id" in d else {"_id": ObjectId(), **d}
            for d in docs]
    by_shard: dict[str, list[int]] = {}
    for i, doc in enumerate(docs):
        shard = cluster.catalog.shard_for(ns, doc) if isinstance(doc, Mapping) else \
            cluster.shards[0].name
        by_shard.setdefault(shard, []).append(i)
    replies = []
    ordered = cmd.get("ordered", True) is not False
    for name, indexes in by_shard.items():
        sub = {**cmd, "documents": [docs[i] for i in indexes]}
        reply = await forward(cluster, cluster.shard(name), sub, db)
        replies.append((indexes, reply))
        if ordered and reply.get("writeErrors"):
            break
    return _merge_write_replies(replies)


async def _routed_writes(
    server: ServerState, cmd: dict[str, Any], db: str, field: str,
    multi_of: Callable[[Mapping[str, Any]], bool],
) -> dict[str, Any]:
    cluster = cluster_of(server)
    ns = sharded_ns(cluster, cmd, db)
    statements = cmd.get(field)
    if ns is None or not isinstance(statements, list):
        create = field == "updates"
        return await forward(cluster, primary_shard(cluster, db, create=create), cmd, db)
    groups: dict[str, list[int]] = {}
    broadcast: list[int] = []
    replies = []
    for i, stmt in enumerate(statements):
        if field == "updates" and _may_change_shard_key(cluster, ns, stmt):
            moved = await _update_changing_shard_key(cluster, cmd, db, ns, stmt)
            if moved is not None:
                replies.append(([i], moved))
                continue
        # Under the statement's collation (none given: the collection's default).
        shard = (targeted_shard(cluster, ns, stmt.get("q"), stmt.get("collation"))
                 if isinstance(stmt, Mapping) else None)
        if shard is None:
            broadcast.append(i)
        else:
            groups.setdefault(shard.name, []).append(i)
    for name, indexes in groups.items():
        sub = {**cmd, field: [statements[i] for i in indexes]}
        replies.append((indexes, await forward(cluster, cluster.shard(name), sub, db)))
    for i in broadcast:
        stmt = statements[i]
        shards = owning_shards(cluster, ns)
        if field == "updates" and stmt.get("upsert") is True and not multi_of(stmt):
            # 8.0's write without shard key: the first shard with a match updates it; with no
            # match anywhere, the document the upsert makes goes to the shard of its key.
            replies.append(([i], await _upsert_without_shard_key(cluster, cmd, db, ns, stmt)))
            continue
        if field == "updates" and stmt.get("upsert") is True:
            # A multi-document upsert must know its shard: mongos targets it by the query's
            # shard key.
            replies.append(([i], {"n": 0, "nModified": 0, "writeErrors": [{
                "index": 0, "code": 61,
                "errmsg": "Failed to target upsert by query :: could not extract exact shard "
                          "key",
            }]}))
            if cmd.get("ordered", True) is not False:
                break
            continue
        if multi_of(stmt):
            for shard in shards:
                replies.append(([i], await forward(cluster, shard, {**cmd, field: [stmt]}, db)))
            continue
        # One document without the shard key: the first shard that has a match takes it.
        for k, shard in enumerate(shards):
            one = dict(stmt)
            if k < len(shards) - 1 and field == "updates":
                one["upsert"] = False
            reply = await forward(cluster, shard, {**cmd, field: [one]}, db)
            if reply.get("n") or reply.get("writeErrors") or k == len(shards) - 1:
                replies.append(([i], reply))
                break
    return _merge_write_replies(replies)


async def _upsert_without_shard_key(cluster: ShardedCluster, cmd: Mapping[str, Any], db: str,
                                    ns: str, stmt: Mapping[str, Any]) -> dict[str, Any]:
    # The probe is a read (a retryable write's txnNumber goes with the one write only); in
    # the user's transaction it is a statement of it.
    coll = ns.split(".", 1)[1]
    find: dict[str, Any] = {"find": coll, "filter": stmt.get("q") or {}, "limit": 1,
                            "singleBatch": True, "projection": {"_id": 1}}
    if "collation" in stmt:
        find["collation"] = stmt["collation"]
    if cmd.get("autocommit") is False:
        find.update({k: v for k, v in cmd.items()
                     if k in ("lsid", "txnNumber", "autocommit", "startTransaction")})
    for shard in owning_shards(cluster, ns):
        found = (await forward(cluster, shard, find, db))["cursor"]["firstBatch"]
        if found:
            match = {**stmt, "q": {"$and": [stmt.get("q") or {}, {"_id": found[0]["_id"]}]}}
            return await forward(cluster, shard, {**cmd, "updates": [match]}, db)
    doc = await cluster.upsert_document(stmt)
    if doc is None:  # the shard gives the update's own error
        return await forward(cluster, owning_shards(cluster, ns)[0],
                             {**cmd, "updates": [stmt]}, db)
    # The _id the merger chose, pinned, so the shard inserts the document that was targeted
    # (a generated _id could belong to another shard under a key on _id).
    pinned = {**stmt, "q": {"$and": [stmt.get("q") or {}, {"_id": doc["_id"]}]}}
    owner = cluster.shard(cluster.catalog.shard_for(ns, doc))
    return await forward(cluster, owner, {**cmd, "updates": [pinned]}, db)


def _may_change_shard_key(cluster: ShardedCluster, ns: str, stmt: Any) -> bool:
    """Whether a single update may write a shard key field (a replacement, a pipeline, or an
    operator on a path that is, contains or is inside a key field)."""
    if not isinstance(stmt, Mapping) or stmt.get("multi") is True:
        return False
    update = stmt.get("u")
    if not isinstance(update, Mapping) or not update or not all(
        str(k).startswith("$") for k in update
    ):
        return True
    fields = list(cluster.catalog.key_pattern(ns) or {})
    for args in update.values():
        if not isinstance(args, Mapping):
            continue
        for path in args:
            for field in fields:
                if path == field or path.startswith(field + ".") or field.startswith(path + "."):
                    return True
    return False


async def _update_changing_shard_key(cluster: ShardedCluster, cmd: Mapping[str, Any], db: str,
                                     ns: str, stmt: Mapping[str, Any],
                                     moved: list[Any] | None = None) -> dict[str, Any] | None:
    """A single update whose new shard key belongs to another shard (WouldChangeOwningShard):
    mongos deletes the document on its shard and inserts it on the new one, in one
    transaction; without a txnNumber it is refused (20 IllegalOperation). None: the document
    stays where it is (the update goes its usual way)."""
    coll = ns.split(".", 1)[1]
    target = targeted_shard(cluster, ns, stmt.get("q"), stmt.get("collation"))
    shards = [target] if target is not None else owning_shards(cluster, ns)
    find = {"find": coll, "filter": stmt.get("q") or {}, "limit": 1, "singleBatch": True}
    for option in ("collation", "sort"):
        if option in stmt:
            find[option] = stmt[option]
    for shard in shards:
        found = (await forward(cluster, shard, find, db))["cursor"]["firstBatch"]
        if found:
            break
    else:
        return None
    pre = found[0]
    post = await cluster.apply_update(pre, stmt)
    if post is None:
        return None
    owner = cluster.catalog.shard_for(ns, post)
    if owner == shard.name:
        return None
    if cmd.get("txnNumber") is None:
        return {"n": 0, "nModified": 0, "writeErrors": [{
            "index": 0, "code": 20,
            "errmsg": "Must run update to shard key field in a multi-statement transaction or "
                      "with retryWrites: true.",
        }]}
    key = cluster.catalog.document_key(ns, pre) or {"_id": pre["_id"]}
    if cmd.get("autocommit") is False:  # the user's transaction: two more statements of it
        base = {k: v for k, v in cmd.items()
                if k in ("lsid", "txnNumber", "autocommit", "startTransaction", "readConcern",
                         "comment", "bypassDocumentValidation")}
        await forward(cluster, shard, {"delete": coll, "deletes": [{"q": key, "limit": 1}],
                                       **base}, db)
        await forward(cluster, cluster.shard(owner), {"insert": coll, "documents": [post],
                                                      **base}, db)
        if moved is not None:
            moved.extend((pre, post))
        return {"n": 1, "nModified": 1}
    # A retryable write: both shards' writes at one time, without yielding in between.
    db_name = db
    source, dest = shard.store, cluster.shard(owner).store
    c_source, c_dest = source.get(db_name, coll), dest.get(db_name, coll)
    current = source.documents(c_source).get(_id_key(pre["_id"])) if c_source else None
    if current is None or c_dest is None:
        return None
    at = cluster.clock.tick()
    with source.commit_at(at), source.batch():
        source.delete_document(c_source, current)
    with dest.commit_at(at), dest.batch():
        dest.insert_document(c_dest, post)
    if moved is not None:
        moved.extend((pre, post))
    return {"n": 1, "nModified": 1}


@command("update")
async def update(
    server: ServerState, conn: ConnectionState, cmd: dict[str, Any], db: str
) -> dict[str, Any]:
    return await _routed_writes(server, cmd, db, "updates", lambda s: s.get("multi") is True)


@command("delete")
async def delete(
    server: ServerState, conn: ConnectionState, cmd: dict[str, Any], db: str
) -> dict[str, Any]:
    return await _routed_writes(server, cmd, db, "deletes", lambda s: s.get("limit") == 0)


@command("findAndModify", "findandmodify")
async def find_and_modify(
    server: ServerState, conn: ConnectionState, cmd: dict[str, Any], db: str
) -> dict[str, Any]:
    cluster = cluster_of(server)
    ns = sharded_ns(cluster, cmd, db)
    if ns is None:
        return await forward(cluster, primary_shard(cluster, db, create=True), cmd, db)
    if not cmd.get("remove") and "update" in cmd:
        stmt = {"q": cmd.get("query") or {}, "u": cmd["update"]}
        for option in ("collation", "sort", "arrayFilters"):
            if option in cmd:
                stmt[option] = cmd[option]
        if _may_change_shard_key(cluster, ns, stmt):
            moved_reply = await _find_and_modify_changing_shard_key(cluster, cmd, db, ns, stmt)
            if moved_reply is not None:
                return moved_reply
    shard = targeted_shard(cluster, ns, cmd.get("query"), cmd.get("collation"))
    if shard is not None:
        return await forward(cluster, shard, cmd, db)
    shards = owning_shards(cluster, ns)
    for k, shard in enumerate(shards):
        reply = await forward(cluster, shard, cmd, db)
        if reply.get("value") is not None or k == len(shards) - 1:
            return reply
    return {}


async def _find_and_modify_changing_shard_key(
    cluster: ShardedCluster, cmd: Mapping[str, Any], db: str, ns: str, stmt: dict[str, Any],
) -> dict[str, Any] | None:
    """findAndModify whose new shard key belongs to another shard (WouldChangeOwningShard): in
    a transaction or a retryable write the document moves (a delete and an insert, as for
    update), else 20 IllegalOperation as mongos 8.0 answers. None: it stays on its shard."""
    moved: list[Any] = []
    reply = await _update_changing_shard_key(cluster, cmd, db, ns, stmt, moved)
    if reply is None:
        return None
    if not moved:  # refused: no transaction, not retryable
        error = reply["writeErrors"][0]
        raise MongoError(error["code"], error["errmsg"])
    pre, post = moved
    value = post if cmd.get("new") is True else pre
    fields = cmd.get("fields")
    if isinstance(fields, Mapping) and fields:
        value = engine.project(value, fields)  # (findAndModify's is a find projection)
    return {"lastErrorObject": {"n": 1, "updatedExisting": True}, "value": value}
