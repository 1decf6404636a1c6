"""Query commands: find (+ getMore, killCursors through the cursor registry), count,
distinct, and aggregate without `$changeStream` (the whole pipeline, `$out` included); the
query results' cursor (`ResultCursor`).

`find` / `count` / `aggregate` on `local.oplog.rs` read the server's oplog whatever its source,
with tailable + awaitData cursors (`oplog_find.py`); `find` on `config.system.preimages` reads
the store's pre-images in mongod's schema.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sized
from dataclasses import dataclass, field
from typing import Any

from bson.int64 import Int64

from cdcserver.commands import admin, capped_find, crud_common, executor_context, oplog_find, search
from cdcserver.commands import cursors as change_streams
from cdcserver.commands.arguments import is_number, is_string
from cdcserver.commands.base import Handler, family
from cdcserver.commands.crud_common import (
    _doc_arg,
    _int,
    _sort_list,
    coll_arg,
    engine_errors,
    find_arguments,
    max_time_ms_arg,
    project,
)
from cdcserver.commands.executor_context import command_context, executing
from cdcserver.commands.transactions import get_store, snapshot_reads
from cdcserver.commands.writes import _write_out
from cdcserver.context import ConnectionState, ServerState
from cdcserver.cursors import QUERY_RESULT, GetMore, HeldHere
from cdcserver.embedded import (
    engine,
    index_table,
    query,
    text_search,
    timeseries,
    view_reads,
)
from cdcserver.embedded.store import Store
from cdcserver.scan_deadline import ScanBudget
from pipeline_stages import bson_bytes, query_engine
from pipeline_stages.errors import MongoError
from pipeline_stages.spec import check_requires_change_stream, is_change_stream_aggregate
from pipeline_stages.value_string import type_name

DEFAULT_BATCH = 101
MAX_REPLY_BYTES = 16 * 1024 * 1024

# The reads of the embedded store (and find / aggregate on the oplog of any source); the modes
# that serve them: cdcserver/deployments/.
TABLE: dict[str, Handler] = {}
command = family(TABLE)


# ---------------------------------------------------------------------------------------------
# Cursors of find / aggregate / listIndexes ...


@dataclass(eq=False)
class ResultCursor(HeldHere):
    """A query's results kept for getMore (a cursor of the registry, cdcserver/cursors/)."""

    id: int
    ns: str
    docs: list[Any]
    pos: int = 0
    last_used: float = field(default_factory=time.monotonic)
    busy: bool = False  # a getMore is gathering its batch
    awaited_s: float = 0.0  # never waits
    # the query's maxTimeMS: mongod keeps it with the cursor, its getMores run with a deadline
    max_time_ms: int | None = None
    # A plain collection scan (no sort, no limit): as mongod's, it learns it has reached the
    # end only by looking past a full batch, so a batch that ends exactly at the last document
    # leaves the cursor open and the next getMore returns an empty last batch.
    open_until_seen_end: bool = False
    end_seen: bool = False
    kind = QUERY_RESULT
    owner = None

    @property
    def done(self) -> bool:
        if self.pos < len(self.docs):
            return False
        return not self.open_until_seen_end or self.end_seen

    async def get_more_reply(self, more: GetMore) -> dict[str, Any]:
        batch: list[Any] = []  # up to 16 MiB, gathered in steps
        await query.run_async(_taking(self, more.batch_size or None, batch))
        return {"cursor": {"nextBatch": batch, "id": Int64(0 if self.done else self.id),
                           "ns": self.ns}}

    def close(self) -> None:
        pass


def _take(cursor: ResultCursor, batch_size: int | None) -> list[Any]:
    out: list[Any] = []
    query.run_sync(_taking(cursor, batch_size, out))
    return out


def _taking(cursor: ResultCursor, batch_size: int | None, out: list[Any]) -> query.Scan:
    """The next batch (up to `batch_size` documents and 16 MiB) into `out`, in steps."""
    size = 0
    while True:
        if batch_size is not None and len(out) >= batch_size:
            break  # full: mongod does not look further
        if cursor.pos >= len(cursor.docs):
            cursor.end_seen = True
            break
        doc = cursor.docs[cursor.pos]
        n = len(bson_bytes.encode(doc)) if isinstance(doc, Mapping) else 16
        if out and size + n > MAX_REPLY_BYTES:
            break
        out.append(doc)
        size += n
        cursor.pos += 1
        if len(out) % query.CHECK_EVERY == 0:
            yield


def cursor_first_batch(
    server: ServerState, ns: str, docs: list[Any], batch_size: int | None,
    single_batch: bool = False, max_time_ms: Any = None, open_until_seen_end: bool = False,
) -> dict[str, Any]:
    """A `{cursor: {firstBatch, id, ns}}` reply; keeps the rest for getMore."""
    cid = server.cursors.new_id()
    cursor = ResultCursor(cid, ns, docs, open_until_seen_end=open_until_seen_end)
    if is_number(max_time_ms) and max_time_ms > 0:
        cursor.max_time_ms = int(max_time_ms)
    batch = _take(cursor, DEFAULT_BATCH if batch_size is None else batch_size)
    more = not cursor.done and not single_batch
    if more:
        server.cursors.add(cursor)
    return {"cursor": {"firstBatch": batch, "id": Int64(cid if more else 0), "ns": ns}}


# ---------------------------------------------------------------------------------------------
# Reads


def run_find(
    store: Store, db: str, coll: str, filter_doc: Mapping[str, Any] | None, projection: Any,
    sort: Any, skip: int, limit: int, *, copy: bool = False,
) -> list[dict[str, Any]]:
    """A find's documents, without pausing (for callers that must not interleave). Result
    documents are the stored ones (never changed in place) unless projected or `copy`."""
    scan, out = _find_scan(store, db, coll, filter_doc, projection, sort, skip, limit, copy)
    if scan is not None:
        with executing():
            query.run_sync(scan)
    return out


async def find_documents(
    store: Store, cmd: Mapping[str, Any], db: str, coll: str,
    filter_doc: Mapping[str, Any] | None, projection: Any, sort: Any, skip: int, limit: int,
    *, copy: bool = False, deadline: query.Deadline | None = None,
) -> list[dict[str, Any]]:
    """A find's documents, read in the command's snapshot, matched in steps that let other
    connections run, within the command's maxTimeMS (50 MaxTimeMSExpired)."""
    if deadline is None:
        deadline = query.Deadline.of(cmd)
    where = next(iter(cmd), "find")
    with snapshot_reads(store, cmd):
        scan, out = _find_scan(store, db, coll, filter_doc, projection, sort, skip, limit, copy,
                               (cmd.get("collation"), where),
                               (cmd.get("hint"), cmd.get("min"), cmd.get("max")),
                               raw_data=cmd.get("rawData") is True)
    if scan is not None:
        with executing():
            await query.run_async(scan, deadline)
    return out


def _find_scan(
    store: Store, db: str, coll: str, filter_doc: Mapping[str, Any] | None, projection: Any,
    sort: Any, skip: int, limit: int, copy: bool, collation: tuple[Any, str] | None = None,
    hint_args: tuple[Any, Any, Any] | None = None, raw_data: bool = False,
) -> tuple[query.Scan | None, list[Any]]:
    """The scan of a find over the collection's documents as they are now, and the list it
    fills (no scan when the answer is known: a view's, a missing collection's). `collation`:
    the command's (and its name), applied with the collection's default. A viewless
    time-series collection (9.0's) reads as its view did, measurements unpacked; with
    `raw_data` (the command's rawData) its buckets."""
    engine.validate_filter(filter_doc or {})  # mongod's parse errors, before any document
    if filter_doc and "$text" in filter_doc:
        text_search.parse(filter_doc["$text"], "english")
    c = store.get(db, coll)
    viewless = c is not None and not raw_data and timeseries.is_viewless(c)
    if c is None or viewless:
        resolved = (
            (coll, timeseries.view_pipeline(c.options["timeseries"])) if c is not None
            else store.resolve_view(db, coll))
        if resolved is not None:
            view_out: list[Any] = []
            view_scan = _view_scan(store, db, resolved,
                                   _view_find_stages(filter_doc, projection, sort, skip, limit),
                                   view_out)
            # In a transaction: now, in its snapshot.
            if store.txn is not None and store.txn.of_a_session:
                with executing():
                    query.run_sync(view_scan)
                return None, view_out
            return view_scan, view_out
        engine.matches({k: v for k, v in (filter_doc or {}).items() if k != "$text"}, {})
        _sort_list(_text_score_sort(sort)[0])  # mongod parses the sort before the lookup
        return None, []
    text_q: text_search.TextQuery | None = None
    ix: Mapping[str, Any] = {}
    if filter_doc and "$text" in filter_doc:  # matched and scored here, the rest as any filter
        ix = text_search.text_index(c.indexes)
        text_q = text_search.parse(filter_doc["$text"], ix.get("default_language", "english"))
        filter_doc = {k: v for k, v in filter_doc.items() if k != "$text"}
    sort, meta_sorted = _text_score_sort(sort)
    if text_q is None and (meta_sorted or _text_score_fields(projection)):
        raise MongoError(40218, "query requires text score metadata, but it is not available")
    normalized = engine.normalize(dict(filter_doc or {}))
    with engine_errors():
        engine.matcher(normalized)  # compiled (regexes) before the first document
    sort_list = _sort_list(sort)
    fields = dict(projection) if projection else None
    score_fields = _text_score_fields(projection)
    if fields is not None and score_fields:
        fields = {k: v for k, v in fields.items() if k not in score_fields} or None
    project_one = None
    if fields is not None:
        def project_one(doc: Mapping[str, Any]) -> Any:
            return engine.project(doc, fields)

    applied = None
    if collation is not None:
        applied = query.collation_of(collation[0], c.options.get("collation"), collation[1])
    hinted = hint_args is not None and any(a is not None for a in hint_args)
    records = store.documents(c)
    plan = None
    if not hinted and text_q is None and applied is None and records is c.records:
        # not in a transaction's or a snapshot's view: the tables index the working set
        plan = index_table.plan(c, records, normalized)
    docs: list[dict[str, Any]] = list(
        plan.documents(records) if plan is not None else records.values())
    if hint_args is not None and hinted:  # hint, min, max
        hint, min_doc, max_doc = hint_args
        docs = engine.index_scan(docs, engine.hinted_index(c.indexes, hint, c.ns), hint,
                                 min_doc, max_doc, c.ns)
    if text_q is not None:
        text_scores: dict[int, float] = {}
        for doc in docs:
            found = text_search.score(ix, text_q, doc)
            if found is not None:
                text_scores[id(doc)] = found
        docs = [d for d in docs if id(d) in text_scores]
        if meta_sorted:  # highest score first; the sort's plain keys before it then apply
            docs.sort(key=lambda d: -text_scores[id(d)])
        if score_fields:
            inner = project_one

            def project_one(doc: Mapping[str, Any]) -> Any:
                shown = dict(inner(doc)) if inner is not None else engine.copy_document(doc)
                for name in score_fields:
                    shown[name] = text_scores[id(doc)]
                return shown
    out: list[Any] = []
    scan = query.find(docs, normalized, sort_list, skip, limit, out,
                      project=project_one, copy=copy, collation=applied)
    return scan, out


def _text_score_fields(projection: Any) -> list[str]:
    """The projection's `{name: {$meta: "textScore"}}` fields."""
    if not isinstance(projection, Mapping):
        return []
    return [k for k, v in projection.items()
            if isinstance(v, Mapping) and dict(v) == {"$meta": "textScore"}]


def _text_score_sort(sort: Any) -> tuple[Any, bool]:
    """The sort without its `{$meta: "textScore"}` key (and the plain keys after it, which
    only order documents of equal score), and whether it had one."""
    if not isinstance(sort, Mapping):
        return sort, False
    plain: dict[str, Any] = {}
    for k, v in sort.items():
        if isinstance(v, Mapping) and dict(v) == {"$meta": "textScore"}:
            return plain, True
        plain[k] = v
    return sort, False


def view_documents(store: Store, db: str, resolved: tuple[str, list[Any]],
                   stages: list[Any]) -> list[Any]:
    """A view's documents: its (resolved) pipeline, then `stages`, over the collection it
    reads."""
    out: list[Any] = []
    with executing():
        query.run_sync(_view_scan(store, db, resolved, stages, out))
    return out


def _view_scan(store: Store, db: str, resolved: tuple[str, list[Any]], stages: list[Any],
               out: list[Any]) -> query.Scan:
    """The scan of a view's documents (see view_documents) into `out`: the collection's
    documents copied, then the pipeline (its per-document stages in chunks)."""
    base, pipeline = resolved
    c = store.get(db, base)
    docs = list(store.documents(c).values()) if c is not None else []
    full = [engine.normalize(dict(s)) for s in [*pipeline, *stages]]
    copies: list[Any] = []
    yield from query.find(docs, None, None, 0, 0, copies, copy=True)
    if not full:
        out.extend(copies)
        return
    database = store.query_database(db)
    yield from query.pipeline(copies, database, full, out)


def _view_find_stages(
    filter_doc: Mapping[str, Any] | None, projection: Any, sort: Any, skip: int, limit: int,
) -> list[Any]:
    """`find` on a view, as mongod runs it: an aggregation of the view's pipeline followed by
    `$match`, `$sort`, `$skip`, `$limit` and `$project` (query_request_conversion)."""
    stages: list[Any] = []
    if filter_doc:
        stages.append({"$match": dict(filter_doc)})
    sort_list = _sort_list(sort)
    if sort_list:
        stages.append({"$sort": dict(sort_list)})
    if skip:
        stages.append({"$skip": skip})
    if limit:
        stages.append({"$limit": limit})
    if projection:
        stages.append({"$project": dict(projection)})
    return stages


def _distinct_values(docs: list[Any], key: str) -> list[Any]:
    """The distinct values at dotted path `key` (array elements counted one by one), equal as
    mongod compares them (KeyString)."""
    from cdcserver.embedded.store import id_key

    def at(value: Any, parts: list[str]) -> list[Any]:
        if not parts:
            return list(value) if isinstance(value, list) else [value]
        if isinstance(value, Mapping):
            return at(value[parts[0]], parts[1:]) if parts[0] in value else []
        if isinstance(value, list):
            return [v for element in value for v in at(element, parts)]
        return []

    seen: dict[bytes, Any] = {}
    for doc in docs:
        for value in at(doc, key.split(".")):
            seen.setdefault(id_key(value), value)
    return list(seen.values())


# find's fields of IDL type object_owned_nonempty_serialize (find_command.idl): mongod 8.0
# parses them with parseOwnedBSON, whose TypeMismatch text has no space before "to"
# (query_request_helper.cpp), null refused alike; boolNoOpSerializer's parseBoolean (oplogReplay)
# says the same "object". Checked in the command's field order, as the IDL parser meets them.
_FIND_OBJECT_FIELDS = frozenset({
    "filter", "projection", "sort", "collation", "min", "max", "$queryOptions", "$_resumeAfter",
})


def find_field_types(cmd: Mapping[str, Any]) -> None:
    for key, value in cmd.items():
        if key in _FIND_OBJECT_FIELDS and not isinstance(value, Mapping):
            raise MongoError(14, f"Expected field {key}to be of type object")
        if key == "oplogReplay" and not isinstance(value, bool):
            raise MongoError(14, "Expected field oplogReplayto be of type object")


@command("find")
async def find(
    server: ServerState, conn: ConnectionState, cmd: dict[str, Any], db: str
) -> dict[str, Any]:
    find_field_types(cmd)
    with command_context(_find_context(server, cmd, db)):
        return await _find(server, engine.bind_let(cmd), db)


def _find_context(server: ServerState, cmd: Mapping[str, Any], db: str) -> str:
    """find's executor context: a view's (or a viewless time-series collection's) find runs
    as an aggregation."""
    coll = cmd.get("find")
    if not isinstance(coll, str) or not is_string(coll) or oplog_find.is_oplog(db, coll):
        return executor_context.find_context(f"{db}.{coll}")  # (its parse fails, if at all)
    store = get_store(server)
    c = store.get(db, coll)
    if timeseries.is_viewless(c) if c is not None else store.view(db, coll) is not None:
        return executor_context.AGGREGATION
    return executor_context.find_context(f"{db}.{coll}")


async def _find(server: ServerState, cmd: Mapping[str, Any], db: str) -> dict[str, Any]:
    """find, its `let` bound."""
    if oplog_find.is_oplog(db, cmd.get("find")):
        return await find_oplog(server, cmd)
    store = get_store(server)
    coll = coll_arg(cmd, "find")
    tailable, _ = oplog_find.validate_tailable(cmd)
    view = store.view(db, coll) if store.get(db, coll) is None else None
    if view is not None:  # mongod runs find on a view as an aggregation
        if tailable:
            raise MongoError(168, "Tailable cursors are not supported in aggregation.")
        collation = cmd.get("collation")
        view_locale = (view.get("collation") or {}).get("locale", "simple")
        if isinstance(collation, Mapping) and collation.get("locale", view_locale) != view_locale:
            raise MongoError(167, "Cannot override a view's default collation")
    filter_doc, projection, skip, limit, batch_size = find_arguments(cmd)
    max_time_ms_arg(cmd, "find")
    executor_context.fold_find(filter_doc, projection, view is not None)
    if tailable:  # a capped collection's tailable cursor (capped_find.py)
        c = store.get(db, coll)
        if c is None or not c.options.get("capped"):
            raise capped_find.non_capped_error(db, coll)
        with engine_errors():
            return await capped_find.open_tailable(
                server, store, c, db, coll, cmd, filter_doc, projection, skip, limit,
                batch_size, cmd.get("awaitData") is True, DEFAULT_BATCH,
            )
    if db == "config" and coll == "system.preimages" and store.get(db, coll) is None:
        docs = await find_pre_images(store, filter_doc, projection, skip, limit,
                                     cmd.get("maxTimeMS"))
    elif db == "config" and coll == "transactions" and store.get(db, coll) is None:
        docs = [d for d in store.transaction_records.values()  # the sessions' records
                if engine.matches(filter_doc or {}, d)][skip:]
        docs = [project(store, db, coll, d, projection) for d in docs[:limit or None]]
    elif cmd.get("returnKey") is True and store.get(db, coll) is not None:
        # each document's key in the index the plan scans ({} for a collection scan)
        docs = await find_documents(store, cmd, db, coll, filter_doc, None,
                                    cmd.get("sort"), skip, limit)
        c = store.get(db, coll)
        assert c is not None
        index = engine.plan_index(c.indexes, cmd.get("hint"), cmd.get("sort"), filter_doc,
                                  c.ns)
        docs = [engine.index_key(d, index) for d in docs]
    else:
        docs = await find_documents(store, cmd, db, coll, filter_doc, projection,
                                    cmd.get("sort"), skip, limit)
    return cursor_first_batch(server, f"{db}.{coll}", docs, batch_size,
                              single_batch=cmd.get("singleBatch") is True,
                              max_time_ms=cmd.get("maxTimeMS"),
                              open_until_seen_end=not limit and not cmd.get("sort"))


async def find_pre_images(
    store: Store, filter_doc: Mapping[str, Any] | None, projection: Mapping[str, Any] | None,
    skip: int, limit: int, max_time_ms: Any = None,
) -> list[dict[str, Any]]:
    """`config.system.preimages`, where mongod keeps the pre-images of collections with
    `changeStreamPreAndPostImages` (read by other change-stream servers, e.g. a cdcserver
    with this one as its upstream). `{_id: ...}` and `{_id: {$in: [...]}}` are looked up by
    key; other filters are matched on every document, within `max_time_ms` (50), giving the
    loop a turn every 5 ms (cdcserver/scan_deadline.py)."""
    from pipeline_stages.image_source import _pre_image_key

    filter_doc = filter_doc or {}
    wanted = filter_doc.get("_id") if list(filter_doc) == ["_id"] else None
    if isinstance(wanted, Mapping) and list(wanted) == ["$in"] and isinstance(
        wanted["$in"], list
    ):
        keys = [_pre_image_key(v) for v in wanted["$in"] if isinstance(v, Mapping)]
        docs = store.pre_image_documents(keys)
    elif isinstance(wanted, Mapping) and "nsUUID" in wanted:
        docs = store.pre_image_documents([_pre_image_key(wanted)])
    else:
        budget = ScanBudget(max_time_ms)
        docs = []
        for d in store.pre_image_documents():  # (a list: a pause cannot change it)
            if engine.matches(filter_doc, d):
                docs.append(d)
            await budget.step()
    docs = docs[skip:]
    if limit:
        docs = docs[:limit]
    if projection:
        docs = [project(store, "config", "system.preimages", d, projection) for d in docs]
    return docs


async def find_oplog(server: ServerState, cmd: Mapping[str, Any]) -> dict[str, Any]:
    """`find` on `local.oplog.rs`: the server's own oplog, whatever its source (the embedded
    store's, a recorded one), with tailable / awaitData cursors as on mongod."""
    filter_doc, projection, skip, limit, batch_size = find_arguments(cmd)
    cursor = oplog_find.open_cursor(
        server.oplog, server.cursors.new_id(), cmd, filter_doc, projection, skip, limit
    )
    batch = await cursor.fill(DEFAULT_BATCH if batch_size is None else batch_size)
    if cmd.get("singleBatch") is True:
        cursor.exhausted = True
    if not cursor.done:
        server.cursors.add(cursor)
    return oplog_find.reply(cursor, batch, first=True)


@command("count")
async def count(
    server: ServerState, conn: ConnectionState, cmd: dict[str, Any], db: str
) -> dict[str, Any]:
    if cmd.get("autocommit") is False:
        raise MongoError(
            263, "Cannot run 'count' in a multi-document transaction. Please see "
            "http://dochub.mongodb.org/core/transaction-count for a recommended alternative.",
        )
    predicate = _doc_arg(cmd, "query", "count")
    skip = _int(cmd, "skip", "count")
    limit = abs(_int(cmd, "limit", "count"))
    if oplog_find.is_oplog(db, cmd.get("count")):
        # Every source keeps its count (a source without one: the scan counts the same).
        if not predicate and not skip and not limit and isinstance(server.oplog, Sized):
            return {"n": len(server.oplog)}
        return {"n": len(await oplog_find.scan(server.oplog, predicate, max(skip, 0), limit,
                                               cmd.get("maxTimeMS")))}
    store = get_store(server)
    coll = coll_arg(cmd, "count")
    max_time_ms_arg(cmd, None)
    deadline = query.Deadline.of(cmd)
    skip = max(skip, 0)
    c = store.get(db, coll)
    if c is None or timeseries.is_viewless(c):  # a view's (an aggregation), or nothing
        with command_context(executor_context.AGGREGATION):
            n = len(run_find(store, db, coll, predicate, {"_id": 1}, None, skip, limit))
        return {"n": n}
    engine.validate_filter(predicate or {})
    hinted = engine.hinted_index(c.indexes, cmd.get("hint"), c.ns)  # 2: an unknown index
    normalized = engine.normalize(dict(predicate or {}))
    with engine_errors():
        engine.matcher(normalized)
    collation = query.collation_of(cmd.get("collation"), c.options.get("collation"), "count")
    docs = list(store.documents(c).values())
    if hinted is not None and hinted.get("sparse"):  # counts what the hinted index holds
        docs = [d for d in docs if engine.in_sparse_index(hinted, d)]
    if not normalized:
        n = len(docs)
    else:  # counted without copying a document
        matched: list[Any] = []
        with executing():
            await query.run_async(
                query.select(docs, normalized, matched, skip + limit if limit else None,
                             collation),
                deadline,
            )
        n = len(matched)
    n = max(n - skip, 0)
    return {"n": min(n, limit) if limit else n}


@command("distinct")
async def distinct(
    server: ServerState, conn: ConnectionState, cmd: dict[str, Any], db: str
) -> dict[str, Any]:
    store = get_store(server)
    coll = coll_arg(cmd, "distinct")
    key = cmd.get("key")
    if not isinstance(key, str) or not is_string(key):  # (is_string: not Code either)
        raise MongoError(
            14 if key is not None else 40414,
            "BSON field 'distinct.key' is missing but a required field" if key is None else
            f"BSON field 'distinct.key' is the wrong type '{type_name(key)}', expected type "
            "'string'",
        )
    predicate = _doc_arg(cmd, "query", "distinct")
    max_time_ms_arg(cmd, None)
    with snapshot_reads(store, cmd):  # in a snapshot: the catalog as it was then
        c = store.get(db, coll)
        default_collation = c.options.get("collation") if c is not None else None
    if c is None:
        resolved = store.resolve_view(db, coll)
        if resolved is None:
            return {"values": []}
        # mongod runs distinct on a view as an aggregation ($match, then the values)
        stages = [{"$match": dict(predicate)}] if predicate else []
        with command_context(executor_context.AGGREGATION):
            docs = view_documents(store, db, resolved, stages)
        return {"values": _distinct_values(docs, key)}
    deadline = query.Deadline.of(cmd)
    with command_context(executor_context.DISTINCT):
        docs = await find_documents(store, cmd, db, coll, predicate, None, None, 0, 0,
                                    deadline=deadline)
    values: list[Any] = []
    collation = query.collation_of(cmd.get("collation"), default_collation, "distinct")
    with command_context(executor_context.DISTINCT), executing():
        await query.run_async(
            query.distinct(docs, key, values, collation), deadline)
    return {"values": values}


@command("aggregate")
async def aggregate(
    server: ServerState, conn: ConnectionState, cmd: dict[str, Any], db: str
) -> dict[str, Any]:
    """aggregate: a `$changeStream` opens a change stream (commands/cursors.py); any other
    pipeline runs on the store's documents, on the oplog, or on `$currentOp` / `$collStats`."""
    if is_change_stream_aggregate(cmd):
        return await change_streams.aggregate(server, conn, cmd, db)
    with command_context(executor_context.AGGREGATION):
        return await _aggregate(server, conn, engine.bind_let(cmd), db)


async def _aggregate(
    server: ServerState, conn: ConnectionState, cmd: Mapping[str, Any], db: str
) -> dict[str, Any]:
    """aggregate without `$changeStream`, its `let` bound."""
    crud_common.check_explain_write_concern(cmd)
    search.check_search_stages(cmd.get("pipeline"))  # 31082: no search service here
    check_requires_change_stream(cmd.get("pipeline"))
    target = cmd.get("aggregate")
    if cmd.get("explain") is True:
        return await admin.explain_aggregate(server, conn, cmd, db)
    written = _collectionless_write(server, conn, cmd, db)
    if written is not None:
        return written
    sourced = _documents_source(server, cmd, db) or admin.aggregate_source(
        server, conn, cmd, db)  # $documents, $currentOp, $collStats
    if sourced is not None:
        return cursor_first_batch(server, *sourced)
    if oplog_find.is_oplog(db, target):
        return await _aggregate_oplog(server, cmd)
    store = get_store(server)
    pipeline = cmd.get("pipeline")
    if not isinstance(pipeline, list):
        raise MongoError(14, f"BSON field 'aggregate.pipeline' is the wrong type "
                         f"'{type_name(pipeline)}', expected type 'array'")
    cursor_doc = cmd.get("cursor")
    if not isinstance(cursor_doc, Mapping) and not cmd.get("explain"):
        raise MongoError(
            9, "The 'cursor' option is required, except for aggregate with the explain argument"
        )
    batch_size = None
    if isinstance(cursor_doc, Mapping) and cursor_doc.get("batchSize") is not None:
        batch_size = _int(cursor_doc, "batchSize", "aggregate.cursor")
    if not isinstance(target, str) or not is_string(target):  # (not Code either)
        raise MongoError(
            73, "{aggregate: 1} is not valid for '$match'; a collection is required."
        )
    max_time_ms_arg(cmd, "aggregate")
    pipeline = [engine.normalize(dict(s)) if isinstance(s, Mapping) else s for s in pipeline]
    out_stage = None
    if pipeline and isinstance(pipeline[-1], Mapping):
        last = next(iter(pipeline[-1]), "")
        if last in ("$out", "$merge"):
            out_stage = pipeline.pop()
    for stage in pipeline:
        if isinstance(stage, Mapping) and ("$out" in stage or "$merge" in stage):
            raise MongoError(40601, f"{next(iter(stage))} can only be the final stage in the "
                             "pipeline")
    if out_stage is not None and cmd.get("autocommit") is False:  # LiteParsed's check
        raise MongoError(263, "Operation not permitted in transaction :: caused by :: "
                         f"Aggregation stage {next(iter(out_stage))} cannot run within a "
                         "multi-document transaction.")
    # A leading $match selects documents in steps that let other connections run (the rest
    # of the pipeline runs on the query engine at once); the deadline is checked after it.
    first_match = None
    if pipeline and isinstance(pipeline[0], Mapping) and list(pipeline[0]) == ["$match"] and (
        isinstance(pipeline[0]["$match"], Mapping)
    ):
        first_match = pipeline.pop(0)["$match"]
        query_engine.check_match_stage(first_match)
    executor_context.parse(pipeline, first_match)  # parse errors, before any document
    with snapshot_reads(store, cmd):  # the views it reads have its collation (167)
        main = store.get(db, target)
        view_reads.check_view_collations(store, db, pipeline, cmd.get("collation") or (
            main.options.get("collation") if main is not None
            else (store.view(db, target) or {}).get("collation")))
    deadline = query.Deadline.of(cmd)
    docs = await find_documents(store, cmd, db, target, first_match, None, None, 0, 0,
                                copy=True, deadline=deadline)
    results: list[Any] = []
    database = store.query_database(db)
    with snapshot_reads(store, cmd):  # its default collation as its snapshot's catalog has it
        c = store.get(db, target)
    collation = query.collation_of(cmd.get("collation"),
                                   c.options.get("collation") if c is not None else None,
                                   "aggregate")
    stages = query.pipeline(docs, database, pipeline, results, collation)
    if not pipeline:
        results = docs
    elif cmd.get("autocommit") is False:  # $lookup & co. read the transaction's snapshot
        with snapshot_reads(store, cmd), executing():
            query.run_sync(stages, deadline)
    else:  # per-document stages in chunks that yield, the rest at once
        with executing():
            await query.run_async(stages, deadline)
    deadline.check()
    if out_stage is not None:
        with store.batch():
            _write_out(store, db, out_stage, results)
        results = []
    return cursor_first_batch(server, f"{db}.{target}", results, batch_size,
                              max_time_ms=cmd.get("maxTimeMS"))


def _cursor_batch_size(cmd: Mapping[str, Any]) -> int | None:
    """The `cursor.batchSize` of an aggregate that must have a `cursor` (9 without one)."""
    cursor_doc = cmd.get("cursor")
    if not isinstance(cursor_doc, Mapping):
        raise MongoError(
            9, "The 'cursor' option is required, except for aggregate with the explain argument"
        )
    if cursor_doc.get("batchSize") is None:
        return None
    return _int(cursor_doc, "batchSize", "aggregate.cursor")


def _documents_source(
    server: ServerState, cmd: Mapping[str, Any], db: str
) -> tuple[str, list[Any], int | None] | None:
    """`{aggregate: 1}` whose pipeline starts with `$documents`: its namespace, results and
    batch size, else None."""
    pipeline = cmd.get("pipeline")
    if cmd.get("aggregate") != 1 or not isinstance(pipeline, list) or not pipeline or not (
        isinstance(pipeline[0], Mapping) and next(iter(pipeline[0]), "") == "$documents"
    ):
        return None
    batch_size = _cursor_batch_size(cmd)
    values = pipeline[0]["$documents"]
    if not isinstance(values, list):  # an expression (evaluated once, on no document)
        values = engine.run_pipeline([{}], None, [{"$project": {"_id": 0, "d": values}}])
        values = values[0].get("d") if values else None
    if not isinstance(values, list) or not all(isinstance(v, Mapping) for v in values):
        raise MongoError(5858203, "error during evaluation of the $documents expression: "
                         "an array of objects is required")
    docs = [engine.normalize(dict(v)) for v in values]
    rest = [engine.normalize(dict(s)) if isinstance(s, Mapping) else s for s in pipeline[1:]]
    if rest:
        executor_context.parse(rest)
        with executing():
            docs = engine.run_pipeline(docs, get_store(server).query_database(db), rest)
    return f"{db}.$cmd.aggregate", docs, batch_size


def _collectionless_write(
    server: ServerState, conn: ConnectionState, cmd: Mapping[str, Any], db: str
) -> dict[str, Any] | None:
    """`{aggregate: 1}` ending in `$out` / `$merge` (`$documents`, `$listLocalSessions`...
    first): its results written, an empty first batch returned; else None."""
    pipeline = cmd.get("pipeline")
    if cmd.get("aggregate") != 1 or not isinstance(pipeline, list) or len(pipeline) < 2 or not (
        isinstance(pipeline[-1], Mapping) and next(iter(pipeline[-1]), "") in ("$out", "$merge")
    ):
        return None
    reading = dict(cmd, pipeline=pipeline[:-1])
    sourced = _documents_source(server, reading, db) or admin.aggregate_source(
        server, conn, reading, db)
    if sourced is None:
        return None
    ns, results, batch_size = sourced
    store = get_store(server)
    with store.batch():
        _write_out(store, db, engine.normalize(dict(pipeline[-1])), results)
    return cursor_first_batch(server, ns, [], batch_size)


async def _aggregate_oplog(server: ServerState, cmd: Mapping[str, Any]) -> dict[str, Any]:
    """`aggregate` on `local.oplog.rs`: a leading `$match` selects entries as `find` does
    (bounds on `ts`), the rest of the pipeline runs on the query engine."""
    pipeline = cmd.get("pipeline")
    if not isinstance(pipeline, list):
        raise MongoError(14, f"BSON field 'aggregate.pipeline' is the wrong type "
                         f"'{type_name(pipeline)}', expected type 'array'")
    batch_size = _cursor_batch_size(cmd)
    stages = list(pipeline)
    filter_doc: Mapping[str, Any] = {}
    if stages and isinstance(stages[0], Mapping) and list(stages[0]) == ["$match"]:
        filter_doc = stages.pop(0)["$match"]
    for stage in stages:
        if isinstance(stage, Mapping) and ("$out" in stage or "$merge" in stage):
            raise MongoError(2, "cdcserver does not write aggregation results from the oplog")
    entries = await oplog_find.scan(server.oplog, filter_doc, max_time_ms=cmd.get("maxTimeMS"))
    if not stages:
        results: list[Any] = list(entries)
    else:
        database = engine.query_database(oplog_find.OPLOG_DB)
        results = engine.run_pipeline(oplog_find.decoded(entries), database, stages)
    return cursor_first_batch(server, oplog_find.OPLOG_NS, results, batch_size)
