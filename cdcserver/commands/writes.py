"""Write commands of the embedded store: insert, update, delete, findAndModify, and the
statement machinery commands/bulk_write.py runs its ops with (one statement at a time, retryable,
waiting for a transaction that holds a document, pausing between documents); `$out`'s writes.

Replies are shaped as a replica-set primary's (mongod 8.0): write replies carry `n`,
`electionId`, `opTime`, `writeErrors` (index, code, errmsg[, keyPattern, keyValue]), and for
updates `upserted` and `nModified`.
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextvars import Token
from dataclasses import dataclass, field
from typing import Any, TypeVar

import bson
from bson.int64 import Int64
from bson.objectid import ObjectId
from bson.timestamp import Timestamp

from cdcserver.commands import write_concern, write_parsing
from cdcserver.commands.admin import ELECTION_ID as _ELECTION_ID
from cdcserver.commands.arguments import array_arg, is_string
from cdcserver.commands.base import Handler, family
from cdcserver.commands.crud_common import (
    _doc_arg,
    _sort_list,
    coll_arg,
    engine_errors,
    project,
)
from cdcserver.commands.transactions import (
    NOT_DONE,
    Retry,
    get_store,
    lsid_str,
    retry_state,
    txn_write_error,
)
from cdcserver.context import ConnectionState, ServerState
from cdcserver.embedded import engine, modifiers, query, timeseries, timeseries_writes
from cdcserver.embedded.bson_depth import check_update_depth
from cdcserver.embedded.sessions import OpSession
from cdcserver.embedded.store import (
    Collection,
    DocumentValidationError,
    DuplicateKeyError,
    LoggedWrite,
    Store,
    TxnBlocked,
    id_key,
    validate_collection_name,
)
from pipeline_stages import bson_bytes
from pipeline_stages.dotted_path import document_value
from pipeline_stages.errors import MongoError
from pipeline_stages.value_string import type_name

# The write commands of the embedded store; the modes that serve them: cdcserver/deployments/.
TABLE: dict[str, Handler] = {}
command = family(TABLE)

T = TypeVar("T")


def _statement_failed(
    store: Store, errors: list[dict[str, Any]], i: int, err: MongoError, ordered: bool
) -> bool:
    """Record statement `i`'s write error; True when the batch stops there (ordered, or in a
    transaction). A transaction's write conflict fails the whole command instead."""
    if err.code == 112:
        raise err
    errors.append(_write_error(i, err))
    return txn_write_error(store) or ordered


@dataclass
class _Progress:
    """How far a write command got, kept while it waits for a transaction to end."""

    retry: Retry | None = None
    next: int = 0  # the statement to run (again, after a wait)
    # a multi-document statement that waited: the documents it matched, those it wrote, and
    # its counts so far
    keys: list[bytes] | None = None
    done: set[bytes] = field(default_factory=set)
    n: int = 0
    modified: int = 0
    # the matched documents as they were (a write re-checks only those that changed), and
    # the position in `keys` of the next one to write
    matched: list[Any] | None = None
    pos: int = 0

    def retry_state(self, store: Store, cmd: Mapping[str, Any]) -> Retry:
        if self.retry is None or cmd.get("autocommit") is False:
            self.retry = retry_state(store, cmd)
        return self.retry

    def statement_done(self, i: int) -> None:
        self.next, self.keys, self.n, self.modified = i + 1, None, 0, 0
        self.matched, self.pos = None, 0
        self.done.clear()


class _Pause(Exception):  # noqa: N818 - a signal to _run_writes, never a reply
    """A multi-document statement outside a transaction has written for a while: its batch
    ends there (durable and visible, as mongod commits each document's write) and the loop
    gets a turn before it goes on (mongod's executor yields between documents)."""


async def _run_writes(store: Store, cmd: Mapping[str, Any], run: Callable[[], T]) -> T:
    """Run a write command's `run` in a batch. A write outside transactions that meets a
    document or unique key an open transaction has written waits (no polling) until that
    transaction commits or aborts, then `run` goes on from the statement that waited: mongod's
    writeConflictRetry, bounded by the command's maxTimeMS (50 MaxTimeMSExpired)."""
    loop = asyncio.get_running_loop()
    max_ms = cmd.get("maxTimeMS")
    deadline = None
    if isinstance(max_ms, (int, float)) and not isinstance(max_ms, bool) and max_ms > 0:
        deadline = loop.time() + float(max_ms) / 1000
    while True:
        try:
            with store.batch():
                return run()
        except _Pause:
            await query.pause()
            if deadline is not None and loop.time() >= deadline:
                raise MongoError(50, "operation exceeded time limit") from None
        except TxnBlocked as blocked:
            timeout = None if deadline is None else deadline - loop.time()
            store.waiting_writes += 1
            try:
                if timeout is not None and timeout <= 0:
                    raise TimeoutError
                await asyncio.wait_for(blocked.txn.ended.wait(), timeout)
            except TimeoutError:
                raise MongoError(50, "operation exceeded time limit") from None
            finally:
                store.waiting_writes -= 1


# ---------------------------------------------------------------------------------------------
# Replies


def _statement_loop(
    store: Store, cmd: Mapping[str, Any], progress: _Progress, count: int,
    errors: list[dict[str, Any]], ordered: bool, execute: Callable[[int, Retry], Any],
    accept: Callable[[int, Any], None], command: str = "insert",
) -> Callable[[], None]:
    """An update's or a delete's statements, from where a paused run stopped: each one
    answered from the session's history if this txnNumber already ran it (a retry), else
    executed and recorded; a WriteConflict (112) leaves its statement to be run again."""

    def run() -> None:
        retry = progress.retry_state(store, cmd)
        try:
            for i in range(progress.next, count):
                progress.next = i
                done = retry.result(i, command)
                try:
                    if done is NOT_DONE:
                        done = execute(i, retry)
                        retry.record(i, done)
                except MongoError as err:
                    if err.code != 112:
                        progress.statement_done(i)
                    if _statement_failed(store, errors, i, err, ordered):
                        break
                    continue
                progress.statement_done(i)
                accept(i, done)
        finally:
            retry.finish()

    return run


async def _run_matched_writes(
    store: Store, db: str, coll: str, cmd: Mapping[str, Any],
    statements: list[tuple[Any, bool, Any]], run: Callable[[], None],
) -> None:
    """Run the statements' loop with their documents matched first (`_prematch`: a long scan
    yields to the event loop), forgetting those matches after."""
    prematched = await _prematch(store, db, coll, statements, query.Deadline.of(cmd))
    try:
        await _run_writes(store, cmd, run)
    finally:
        if prematched is not None:
            query.forget_prematched(prematched)


def _write_error(index: int, err: MongoError) -> dict[str, Any]:
    doc: dict[str, Any] = {"index": index, "code": err.code, "errmsg": err.errmsg}
    if isinstance(err, (DuplicateKeyError, DocumentValidationError)):
        doc.update(err.extra())
    return doc


def _write_reply(store: Store, n: int, errors: list[dict[str, Any]]) -> dict[str, Any]:
    reply: dict[str, Any] = {"n": n, "electionId": _ELECTION_ID}
    reply["opTime"] = {"ts": store.latest_ts() or Timestamp(0, 0), "t": Int64(1)}
    if errors:
        reply["writeErrors"] = errors
    return reply


# ---------------------------------------------------------------------------------------------
# insert


def _dollar_prefixed(value: Any) -> str | None:
    """The first `$`-prefixed field name inside an embedded document (or array), else None; a
    DBRef's `$ref`, `$id`, `$db` are valid (storageValidEmbedded)."""
    if isinstance(value, Mapping):
        dbref = list(value)[:2] == ["$ref", "$id"]
        for key, inner in value.items():
            if dbref and key in ("$ref", "$id", "$db"):
                continue
            if isinstance(key, str) and key.startswith("$"):
                return key
            found = _dollar_prefixed(inner)
            if found is not None:
                return found
    elif isinstance(value, list):
        for inner in value:
            found = _dollar_prefixed(inner)
            if found is not None:
                return found
    return None


def prepare_insert(doc: Any) -> dict[str, Any]:
    if not isinstance(doc, Mapping):
        raise MongoError(14, f"BSON field 'insert.documents.0' is the wrong type "
                         f"'{type_name(doc)}', expected type 'object'")
    return _id_checked_first(engine.normalize(dict(doc)))


# An empty Timestamp's 8 value bytes: what normalize() replaces (by the current time).
_EMPTY_TIMESTAMP = bytes(8)


def prepare_decoded_insert(doc: Any) -> tuple[dict[str, Any], bytes]:
    """prepare_insert of a document the wire decoded, with its BSON. Of what the decoder makes
    (no tuple, no OrderedDict), normalize() changes only datetimes (the wire's are tz-aware)
    and empty Timestamps, and copies every value on the way (the per-document cost the raw
    SQLite floor does not have): here only a document whose bytes may hold an empty
    Timestamp (a 0x11 byte and eight zero bytes) goes through normalize(), and only one that
    may hold a date (a 0x09 byte) is walked for its datetimes, copying just the containers
    on their way (the bytes stay: a date encodes the same naive or aware)."""
    if type(doc) is not dict:
        prepared = prepare_insert(doc)
        return prepared, bson_bytes.encode(prepared)
    prepared = _id_checked_first(dict(doc))
    raw = bson_bytes.encode(prepared)
    if b"\x11" in raw and _EMPTY_TIMESTAMP in raw:
        prepared = engine.normalize(prepared)
        return prepared, bson_bytes.encode(prepared)
    if b"\x09" in raw:
        prepared = _normalized_dates(prepared)
    return prepared, raw


def _normalized_dates(value: Any) -> Any:
    """`value` (decoded BSON) with each datetime as normalize() makes it: the same object where
    it holds none, else a copy of the dicts and lists on the way to one."""
    kind = type(value)
    if kind is dict:
        out: Any = None
        for k, v in value.items():
            if type(v) in _WALKED:
                new = _normalized_dates(v)
                if new is not v:
                    if out is None:
                        out = dict(value)
                    out[k] = new
        return value if out is None else out
    if kind is list:
        out = None
        for i, v in enumerate(value):
            if type(v) in _WALKED:
                new = _normalized_dates(v)
                if new is not v:
                    if out is None:
                        out = list(value)
                    out[i] = new
        return value if out is None else out
    if kind is datetime.datetime:
        return engine.normalize(value)
    return value


_WALKED = frozenset({dict, list, datetime.datetime})
_PLAIN_IDS = frozenset({int, str, float, ObjectId, Int64})


def _id_checked_first(doc: dict[str, Any]) -> dict[str, Any]:
    """`doc` with a valid `_id` (an ObjectId if it had none) as its first field."""
    if "_id" in doc:
        _id = doc["_id"]
        if type(_id) in _PLAIN_IDS:  # none of the checks below can refuse it
            if next(iter(doc)) == "_id":
                return doc
            return {"_id": _id, **{k: v for k, v in doc.items() if k != "_id"}}
        if isinstance(_id, list):
            raise MongoError(53, "The '_id' value cannot be of type array")
        if isinstance(_id, bson.regex.Regex) or hasattr(_id, "pattern"):
            raise MongoError(53, "can't use a regex for _id")
        dollar = _dollar_prefixed(_id)
        if dollar is not None:  # validIdField: storageValidEmbedded of the _id document
            raise MongoError(52, "_id fields may not contain '$'-prefixed fields: "
                             f"{dollar} is not valid for storage.")
        if next(iter(doc)) == "_id":  # as drivers send it
            return doc
        return {"_id": _id, **{k: v for k, v in doc.items() if k != "_id"}}
    return {"_id": ObjectId(), **doc}


@command("insert")
async def insert(
    server: ServerState, conn: ConnectionState, cmd: dict[str, Any], db: str
) -> dict[str, Any]:
    store = get_store(server)
    coll = coll_arg(cmd, "insert")
    request = write_parsing.parse_write_command(cmd, "insert")  # whole, before any write
    docs = request.statements
    wc = write_concern.parse(cmd)
    ordered = request.ordered
    validate = not request.bypass_validation
    n = 0
    errors: list[dict[str, Any]] = []
    progress = _Progress()

    def run() -> None:
        nonlocal n
        retry = progress.retry_state(store, cmd)
        c: Collection | None = store.get(db, coll)
        if c is not None and timeseries.is_viewless(c):  # 9.0's form: measurements, bucketed
            c = store.ensure_collection(db, coll)
        try:
            for i in range(progress.next, len(docs)):
                progress.next = stmt_id = i
                if retry.result(stmt_id) is not NOT_DONE:
                    n += 1
                    continue
                try:
                    doc, raw = prepare_decoded_insert(docs[i])
                    if c is None:
                        c = store.ensure_collection(db, coll)
                    store.insert_document(c, doc, retry.session, stmt_id, validate=validate,
                                          raw=raw)
                except MongoError as err:
                    if _statement_failed(store, errors, i, err, ordered):
                        break
                    continue
                retry.record(stmt_id, True)
                n += 1
        finally:
            retry.finish()

    await _run_writes(store, cmd, run)
    return write_concern.add_to_reply(_write_reply(store, n, errors), wc)


# ---------------------------------------------------------------------------------------------
# update


def _update_kind(u: Any) -> str:
    if isinstance(u, list):
        engine.validate_pipeline_update(u)  # parsed with the command, matched or not
        return "pipeline"
    if not isinstance(u, Mapping):
        raise MongoError(
            14, f"BSON field 'update.updates.u' is the wrong type '{type_name(u)}', expected "
            "type 'object'",
        )
    if engine.is_replacement(u):
        for k in u:
            if k.startswith("$"):
                raise MongoError(
                    52,
                    f"The dollar ($) prefixed field '{k}' in '{k}' is not allowed in the context "
                    "of an update's replacement document. Consider using an aggregation "
                    "pipeline with $replaceWith.",
                )
        return "replacement"
    for k in u:
        if not k.startswith("$"):
            raise MongoError(
                9,
                f"Unknown modifier: {k}. Expected a valid update modifier or pipeline-style "
                "update specified as an array",
            )
    engine.validate_modifiers(u)
    return "modifier"


def _id_first(doc: dict[str, Any]) -> dict[str, Any]:
    if "_id" not in doc or next(iter(doc)) == "_id":
        return doc
    return {"_id": doc["_id"], **{k: v for k, v in doc.items() if k != "_id"}}


def compute_update(
    store: Store, db: str, coll: str, pre: dict[str, Any], q: Mapping[str, Any], u: Any,
    kind: str, array_filters: list[Any] | None, is_insert: bool = False,
) -> dict[str, Any]:
    if kind == "replacement":
        rest = {k: engine.normalize(v) for k, v in u.items() if k != "_id"}
        return {"_id": engine.normalize(u.get("_id", pre.get("_id"))), **rest}
    if kind == "pipeline":
        new = engine.apply_pipeline_update(pre, u)
        if "_id" not in new and "_id" in pre:  # a pipeline that drops _id keeps the document's
            new = {"_id": pre["_id"], **new}
        return _id_first(new)
    return _id_first(
        engine.apply_modifiers(pre, q, u, is_insert=is_insert, array_filters=array_filters)
    )


def upsert_document(
    store: Store, db: str, coll: str, q: Mapping[str, Any], u: Any, kind: str,
    array_filters: list[Any] | None,
) -> dict[str, Any]:
    seed = engine.upsert_seed(q)
    if kind == "replacement":
        # the replacement's _id, else the filter's equality (either may be null), else new
        if "_id" in u:
            _id = u["_id"]
        else:
            _id = seed["_id"] if "_id" in seed else ObjectId()
        doc = {k: engine.normalize(v) for k, v in u.items() if k != "_id"}
        replacement = {"_id": _id, **doc}
        check_update_depth(replacement)  # an upsert is stored through the update's checks
        return replacement
    if "_id" in seed:
        seed = _id_first(seed)
    if kind == "pipeline":
        new = engine.apply_pipeline_update(seed, u)
    else:
        new = engine.apply_modifiers(seed, q, u, is_insert=True, array_filters=array_filters)
    if "_id" not in new:
        new = {"_id": ObjectId(), **new}
    check_update_depth(new)
    return _id_first(new)


def _id_lookup(q: Mapping[str, Any]) -> tuple[bool, Any]:
    """(True, value) for a filter that is `{_id: value}` / `{_id: {$eq: value}}` with a scalar
    value: the document is found by its key, without a scan."""
    if len(q) != 1 or "_id" not in q:
        return False, None
    value = q["_id"]
    if isinstance(value, Mapping) and list(value) == ["$eq"]:
        value = value["$eq"]
    if isinstance(value, (Mapping, list, bson.regex.Regex)) or hasattr(value, "pattern"):
        return False, None
    return True, value


def matching(
    store: Store, c: Collection | None, q: Mapping[str, Any], one: bool,
    collation: query.Collation | None = None,
) -> list[dict[str, Any]]:
    return [doc for _, doc in _matching_items(store, c, q, one, collation)]


def _matching_items(
    store: Store, c: Collection | None, q: Mapping[str, Any], one: bool,
    collation: query.Collation | None = None,
) -> list[tuple[bytes, dict[str, Any]]]:
    """The (key, document) pairs `q` matches, in natural order."""
    if c is None:
        engine.matches(q, {})  # still validate the filter
        return []
    by_id, value = _id_lookup(q)
    if by_id and not (collation is not None and isinstance(value, str)):
        key = id_key(value)
        doc = store.documents(c).get(key)
        return [(key, doc)] if doc is not None and engine.matches(q, doc) else []
    match = query.matcher(q, collation)  # parse errors before any document
    known = query.prematched(q, collation)  # matched before the write, in steps (_prematch)
    out = []
    for key, doc in list(store.documents(c).items()):
        hit = known.get(id(doc)) if known is not None else None
        if hit[1] if hit is not None and hit[0] is doc else match(doc):
            out.append((key, doc))
            if one:
                break
    return out


async def _prematch(
    store: Store, db: str, coll: str, statements: list[tuple[Any, bool, Any]],
    deadline: query.Deadline,
) -> Token[Any] | None:
    """Match the filters of a write's multi-document statements before the write, in steps
    that let other connections run, within its maxTimeMS; `matching` re-uses the answers
    for documents that have not changed since. A filter that fails is left to its statement
    (its error belongs in writeErrors)."""
    c = store.get(db, coll)
    if c is None:
        return None
    docs: list[Any] | None = None
    known: dict[bytes, query.Prematched] = {}
    for q, multi, collation_spec in statements:
        if not multi or not isinstance(q, Mapping):
            continue
        q = engine.normalize(dict(q))
        try:
            collation = query.collation_of(collation_spec, c.options.get("collation"))
        except MongoError:
            continue
        key = query.filter_key(q, collation)
        if key is None or key in known or _id_lookup(q)[0]:
            continue
        if docs is None:
            docs = list(store.documents(c).values())
        answers: query.Prematched = {}
        try:
            await query.run_async(query.classify(docs, q, answers, collation), deadline)
        except MongoError as err:
            if err.code == 50:
                raise
            continue
        except Exception:  # noqa: BLE001 - the statement raises it as its write error
            continue
        known[key] = answers
    return query.remember_prematched(known) if known else None


def run_update_statement(
    store: Store, db: str, coll: str, spec: Mapping[str, Any], retry: Retry, stmt_id: int,
    validate: bool = True, progress: _Progress | None = None, raw_data: bool = False,
) -> tuple[int, int, Any]:
    """(n, nModified, (upserted _id,) or None) of one update statement (a tuple: the upserted
    _id may itself be null)."""
    if not isinstance(spec, Mapping):
        raise MongoError(14, "BSON field 'update.updates' element is not an object")
    if "q" not in spec:
        raise MongoError(40414, "BSON field 'update.updates.q' is missing but a required field")
    if "u" not in spec:
        raise MongoError(40414, "BSON field 'update.updates.u' is missing but a required field")
    q = _doc_arg(spec, "q", "update.updates") or {}
    q = engine.normalize(q)
    u = spec["u"]
    multi = spec.get("multi") is True
    upsert = spec.get("upsert") is True
    array_filters = array_arg(spec, "arrayFilters", "update.updates", of="object")
    kind = _update_kind(u)
    if multi and kind == "replacement":
        raise MongoError(9, "multi update is not supported for replacement-style update")
    ts = timeseries_writes.target(store, db, coll, raw_data)
    if ts is not None:  # its measurements (timeseries_writes.py)
        return _timeseries_update(store, ts, spec, q, u, kind, array_filters, multi, upsert,
                                  None if multi else retry.session, stmt_id)
    c = store.get(db, coll)
    store.check_catalog_for_write(c)  # dropped or renamed since a transaction's snapshot: 112
    if c is None:
        store.check_not_view(db, coll)  # 166, as mongod refuses writes to a view
    else:  # 2 BadValue for a hint no index answers
        engine.hinted_index(c.indexes, spec.get("hint"), c.ns)
    collation = query.collation_of(spec.get("collation"),
                                   c.options.get("collation") if c is not None else None,
                                   "update.updates")
    docs, n, modified = _multi_matching(store, c, q, multi, progress, collation)
    if not multi and spec.get("sort") and c is not None:  # 8.0: which match updateOne takes
        with engine_errors():
            found = _sorted_find(store, db, coll, q, spec["sort"], spec.get("collation"))
        docs = [found] if found is not None else []
    session = None if multi else retry.session
    for pre in docs:
        assert c is not None
        with executor_errors("update"):
            post = compute_update(store, db, coll, pre, q, u, kind, array_filters)
            if store.update_document(c, pre, post, kind=kind, update=u, session=session,
                                     stmt_id=stmt_id, array_filters=array_filters,
                                     validate=validate):
                modified += 1
        n += 1
        if multi and progress is not None:
            progress.done.add(id_key(pre["_id"]))
            progress.n, progress.modified = n, modified
    if n or not upsert:
        return n, modified, None
    if c is None:  # the upsert creates the collection: a name insert refuses is refused (73)
        validate_collection_name(db, coll)
    with executor_errors("update"):
        new = upsert_document(store, db, coll, q, u, kind, array_filters)
    c = store.ensure_collection(db, coll)
    store.insert_document(c, new, session, stmt_id, validate=validate)
    return 1, 0, (new["_id"],)


def _timeseries_update(
    store: Store, ts: timeseries_writes.Target, spec: Mapping[str, Any], q: Mapping[str, Any],
    u: Any, kind: str, array_filters: list[Any] | None, multi: bool, upsert: bool,
    session: OpSession | None, stmt_id: int,
) -> tuple[int, int, Any]:
    db, coll = ts.db, ts.coll
    collation = query.collation_of(spec.get("collation"), ts.buckets.options.get("collation"),
                                   "update.updates")

    def apply(measurement: dict[str, Any]) -> dict[str, Any]:
        with executor_errors("update"):
            return compute_update(store, db, coll, measurement, q, u, kind, array_filters)

    n, modified = timeseries_writes.update(store, ts, q, collation, multi, apply, session,
                                           stmt_id)
    if n or not upsert:
        return n, modified, None
    with executor_errors("update"):
        new = upsert_document(store, db, coll, q, u, kind, array_filters)
    timeseries_writes.upsert(store, ts, new, session, stmt_id)
    return 1, 0, (new["_id"],)


def _multi_matching(
    store: Store, c: Collection | None, q: Mapping[str, Any], multi: bool,
    progress: _Progress | None, collation: query.Collation | None = None,
) -> tuple[Iterable[dict[str, Any]], int, int]:
    """The documents a statement writes, and its counts so far. A multi-document statement
    that waited for a transaction goes on with the documents it matched and has not written,
    as they are now and if they still match (as mongod's update and delete stages re-check a
    document after a write conflict)."""
    if progress is None or not multi:
        return matching(store, c, q, not multi, collation), 0, 0
    if progress.keys is None or c is None:
        items = _matching_items(store, c, q, False, collation)
        progress.keys = [key for key, _ in items]
        progress.matched, progress.pos = [doc for _, doc in items], 0
        if c is None:
            return progress.matched, 0, 0
    return _still_matching(store, c, q, progress, collation), progress.n, progress.modified


def _still_matching(
    store: Store, c: Collection, q: Mapping[str, Any], progress: _Progress,
    collation: query.Collation | None,
) -> Iterator[dict[str, Any]]:
    """The matched documents not written yet, as they are now and if they still match; a
    document is done when the caller asks for the next. Outside a transaction, raises
    _Pause between documents once the batch has run for query.YIELD_AFTER_S."""
    assert progress.keys is not None and progress.matched is not None
    current = store.documents(c)
    match = query.matcher(q, collation)
    may_pause = store.txn is None or not store.txn.of_a_session
    started = time.monotonic()
    while progress.pos < len(progress.keys):
        i = progress.pos
        key = progress.keys[i]
        doc = current.get(key)
        if key not in progress.done and doc is not None and (
            doc is progress.matched[i] or match(doc)
        ):
            yield doc
        progress.pos = i + 1
        if may_pause and time.monotonic() - started >= query.YIELD_AFTER_S and (
            progress.pos < len(progress.keys)
        ):
            raise _Pause


# Errors raised while the update runs on a document (not those of parsing it), which mongod
# 8 raises through its plan executor, with this context; duplicate keys and validation
# failures of `update` come from the write itself, unwrapped.
_UNWRAPPED_IN_UPDATE = (11000, 121)


@contextlib.contextmanager
def executor_errors(command_name: str) -> Iterator[None]:
    try:
        yield
    except MongoError as err:
        if err.code != 112 and (
            command_name != "update" or err.code not in _UNWRAPPED_IN_UPDATE
        ):
            err.errmsg = f"Plan executor error during {command_name} :: caused by :: {err.errmsg}"
            err.args = (err.errmsg,)
        raise


@command("update")
async def update(
    server: ServerState, conn: ConnectionState, cmd: dict[str, Any], db: str
) -> dict[str, Any]:
    bound = engine.bind_let(cmd)  # `let` variables bound into filters and pipeline updates
    store = get_store(server)
    coll = coll_arg(bound, "update")
    request = write_parsing.parse_write_command(bound, "update")  # whole, before any write
    updates = request.statements
    for spec in updates:  # a pipeline's stage names fail the command, as mongod parses them
        if isinstance(spec, Mapping) and isinstance(spec.get("u"), list):
            engine.check_stage_names(spec["u"])
    wc = write_concern.parse(bound)
    ordered = request.ordered
    n = modified = 0
    upserted: list[dict[str, Any]] = []
    errors: list[dict[str, Any]] = []
    progress = _Progress()

    def execute(i: int, retry: Retry) -> Any:
        return run_update_statement(
            store, db, coll, updates[i], retry, i,
            validate=not request.bypass_validation, progress=progress,
            raw_data=bound.get("rawData") is True,
        )

    def count(i: int, done: Any) -> None:
        nonlocal n, modified
        sn, sm, up = done
        n += sn
        modified += sm
        if up is not None:
            upserted.append({"index": i, "_id": up[0]})

    statements = [(u.get("q"), u.get("multi") is True, u.get("collation")) for u in updates
                  if isinstance(u, Mapping)]
    run = _statement_loop(store, bound, progress, len(updates), errors, ordered, execute, count,
                          "update")
    await _run_matched_writes(store, db, coll, bound, statements, run)
    reply = _write_reply(store, n, errors)
    if upserted:
        reply["upserted"] = upserted
    reply["nModified"] = modified
    return write_concern.add_to_reply(reply, wc)


# ---------------------------------------------------------------------------------------------
# delete


@command("delete")
async def delete(
    server: ServerState, conn: ConnectionState, cmd: dict[str, Any], db: str
) -> dict[str, Any]:
    bound = engine.bind_let(cmd)
    store = get_store(server)
    coll = coll_arg(bound, "delete")
    request = write_parsing.parse_write_command(bound, "delete")  # whole, before any write
    deletes = request.statements
    wc = write_concern.parse(bound)
    ordered = request.ordered
    n = 0
    errors: list[dict[str, Any]] = []
    progress = _Progress()

    def execute(i: int, retry: Retry) -> Any:
        return run_delete_statement(store, db, coll, deletes[i], retry, i, progress,
                                    raw_data=bound.get("rawData") is True)

    def count(i: int, done: Any) -> None:
        nonlocal n
        n += done

    statements = [(d.get("q"), _is_multi_delete(d), d.get("collation")) for d in deletes
                  if isinstance(d, Mapping)]
    run = _statement_loop(store, bound, progress, len(deletes), errors, ordered, execute, count)
    await _run_matched_writes(store, db, coll, bound, statements, run)
    return write_concern.add_to_reply(_write_reply(store, n, errors), wc)


def run_delete_statement(
    store: Store, db: str, coll: str, spec: Mapping[str, Any], retry: Retry, stmt_id: int,
    progress: _Progress, raw_data: bool = False,
) -> int:
    """The number of documents one delete statement (parsed already) deletes."""
    # parsed already (write_parsing): limit 0 (or not a number) is multi
    limit = 0 if write_parsing.delete_limit(spec["limit"]) else 1
    q = engine.normalize(_doc_arg(spec, "q", "delete.deletes") or {})
    ts = timeseries_writes.target(store, db, coll, raw_data)
    if ts is not None:  # its measurements (timeseries_writes.py)
        collation = query.collation_of(spec.get("collation"),
                                       ts.buckets.options.get("collation"), "delete.deletes")
        return timeseries_writes.delete(store, ts, q, collation, limit == 0,
                                        retry.session if limit == 1 else None, stmt_id)
    c = store.get(db, coll)
    store.check_catalog_for_write(c)  # dropped or renamed since a transaction's snapshot: 112
    if c is None:
        store.check_not_view(db, coll)
    else:  # 2 BadValue for a hint no index answers
        engine.hinted_index(c.indexes, spec.get("hint"), c.ns)
    collation = query.collation_of(
        spec.get("collation"),
        c.options.get("collation") if c is not None else None,
        "delete.deletes",
    )
    docs, done, _ = _multi_matching(store, c, q, limit == 0, progress, collation)
    session = retry.session if limit == 1 else None
    for pre in docs:
        assert c is not None
        store.delete_document(c, pre, session, stmt_id)
        done += 1
        progress.done.add(id_key(pre["_id"]))
        progress.n = done
    return done


def _is_multi_delete(spec: Mapping[str, Any]) -> bool:
    try:
        return bool(write_parsing.delete_limit(spec.get("limit")))
    except MongoError:
        return False


# ---------------------------------------------------------------------------------------------
# findAndModify


def _sorted_find(
    store: Store, db: str, coll: str, q: Mapping[str, Any], sort: Mapping[str, Any] | None,
    collation_spec: Any = None,
) -> dict[str, Any] | None:
    c = store.get(db, coll)
    if c is None:
        engine.matches(q, {})
        return None
    collation = query.collation_of(collation_spec, c.options.get("collation"), "findAndModify")
    if not sort:
        found = matching(store, c, q, True, collation)
        return found[0] if found else None
    sort_list = _sort_list(sort)
    out: list[Any] = []
    with engine_errors():
        query.run_sync(query.find(list(store.documents(c).values()), q, sort_list, 0, 1, out,
                                  collation=collation))
    return out[0] if out else None


@command("findAndModify", "findandmodify")
async def find_and_modify(
    server: ServerState, conn: ConnectionState, cmd: dict[str, Any], db: str
) -> dict[str, Any]:
    bound = engine.bind_let(cmd)
    store = get_store(server)
    name = next(iter(bound))
    coll = coll_arg(bound, name)
    write_parsing.parse_find_and_modify(bound)  # the whole request, in mongod's order
    remove = write_parsing.true_value(bound.get("remove"))
    u = bound.get("update")
    new = write_parsing.true_value(bound.get("new"))
    upsert = write_parsing.true_value(bound.get("upsert"))
    wc = write_concern.parse(bound)
    if remove and u is not None:
        raise MongoError(9, "Cannot specify both an update and remove=true")
    if not remove and u is None:
        raise MongoError(9, "Either an update or remove=true must be specified")
    if remove and (upsert or new):
        raise MongoError(9, "Cannot specify both upsert=true and remove=true" if upsert
                         else "Cannot specify both new=true and remove=true; 'remove' always "
                         "returns the deleted document")
    progress = _Progress()

    def run() -> dict[str, Any]:
        retry = progress.retry_state(store, bound)
        done = retry.result(0, "findAndModify")
        if isinstance(done, LoggedWrite):
            return _replayed_find_and_modify(store, db, coll, retry, done, bound)
        if isinstance(done, dict):  # this findAndModify's recorded reply
            return done
        if done is not NOT_DONE:  # the statement was another command's (insert, update...)
            raise MongoError(
                40606, f"findAndModify retry request: {bound} is not compatible with previous "
                "write in the transaction",
            )
        try:
            reply = _find_and_modify_once(store, db, coll, bound, retry)
        finally:
            retry.finish()
        retry.record(0, reply)
        return reply

    reply = await _run_writes(store, bound, run)
    return write_concern.add_to_reply(reply, wc)


def _find_and_modify_once(
    store: Store, db: str, coll: str, cmd: Mapping[str, Any], retry: Retry
) -> dict[str, Any]:
    q = engine.normalize(_doc_arg(cmd, "query", "findAndModify") or {})
    sort = _doc_arg(cmd, "sort", "findAndModify")
    remove = write_parsing.true_value(cmd.get("remove"))  # safeBool: numbers count too
    u = cmd.get("update")
    new = write_parsing.true_value(cmd.get("new"))
    upsert = write_parsing.true_value(cmd.get("upsert"))
    fields = cmd.get("fields")
    validate = not write_parsing.true_value(cmd.get("bypassDocumentValidation"))
    ts = timeseries_writes.target(store, db, coll, cmd.get("rawData") is True)
    if ts is not None:  # its measurements (timeseries_writes.py)
        return _timeseries_find_and_modify(store, ts, cmd, q, sort, remove, u, new, upsert)
    if store.get(db, coll) is None:
        store.check_not_view(db, coll)
    else:  # 2 BadValue for a hint no index answers
        target = store.get(db, coll)
        assert target is not None
        store.check_catalog_for_write(target)  # as update's and delete's statements
        engine.hinted_index(target.indexes, cmd.get("hint"), target.ns)
    pre = _sorted_find(store, db, coll, q, sort, cmd.get("collation"))
    c = store.get(db, coll)
    if remove:
        if pre is None:
            reply = {"lastErrorObject": {"n": 0}, "value": None}
        else:
            assert c is not None
            store.delete_document(c, pre, retry.session, 0, retry_image="preImage")
            reply = {"lastErrorObject": {"n": 1},
                     "value": project(store, db, coll, pre, fields)}
    else:
        kind = _update_kind(u)
        array_filters = array_arg(cmd, "arrayFilters", "findAndModify", of="object")
        if pre is not None:
            assert c is not None
            with executor_errors("findAndModify"):
                post = compute_update(store, db, coll, pre, q, u, kind, array_filters)
                store.update_document(c, pre, post, kind=kind, update=u,
                                      session=retry.session, stmt_id=0,
                                      array_filters=array_filters, validate=validate,
                                      retry_image="postImage" if new else "preImage")
            value = post if new else pre
            reply = {"lastErrorObject": {"n": 1, "updatedExisting": True},
                     "value": project(store, db, coll, value, fields)}
        elif upsert:
            if c is None:  # as insert refuses the name of the collection it would create (73)
                validate_collection_name(db, coll)
            with executor_errors("findAndModify"):
                doc = upsert_document(store, db, coll, q, u, kind, array_filters)
                c = store.ensure_collection(db, coll)
                store.insert_document(c, doc, retry.session, 0, validate=validate)
            reply = {
                "lastErrorObject": {"n": 1, "updatedExisting": False, "upserted": doc["_id"]},
                "value": project(store, db, coll, doc, fields) if new else None,
            }
        else:
            reply = {"lastErrorObject": {"n": 0, "updatedExisting": False}, "value": None}
    return reply


def _timeseries_find_and_modify(
    store: Store, ts: timeseries_writes.Target, cmd: Mapping[str, Any], q: Mapping[str, Any],
    sort: Mapping[str, Any] | None, remove: bool, u: Any, new: bool, upsert: bool,
) -> dict[str, Any]:
    """findAndModify on a time-series collection's measurements: the first match (or the
    first by `sort`) removed, or updated (out of its bucket, in again as updated); an
    upsert's document inserted as a measurement. No retry images: mongod does not retry a
    time-series findAndModify."""
    db, coll, fields = ts.db, ts.coll, cmd.get("fields")
    collation = query.collation_of(cmd.get("collation"), ts.buckets.options.get("collation"),
                                   "findAndModify")
    with engine_errors():
        found = timeseries_writes.first(store, ts, q, collation,
                                        _sort_list(sort) if sort else None)
    if remove:
        if found is None:
            return {"lastErrorObject": {"n": 0}, "value": None}
        timeseries_writes.remove_one(store, ts, found)
        return {"lastErrorObject": {"n": 1}, "value": project(store, db, coll, found[2], fields)}
    kind = _update_kind(u)
    array_filters = array_arg(cmd, "arrayFilters", "findAndModify", of="object")
    if found is not None:
        pre = found[2]
        with executor_errors("findAndModify"):
            post = compute_update(store, db, coll, pre, q, u, kind, array_filters)
            timeseries_writes.replace_one(store, ts, found, post)
        return {"lastErrorObject": {"n": 1, "updatedExisting": True},
                "value": project(store, db, coll, post if new else pre, fields)}
    if not upsert:
        return {"lastErrorObject": {"n": 0, "updatedExisting": False}, "value": None}
    with executor_errors("findAndModify"):
        doc = upsert_document(store, db, coll, q, u, kind, array_filters)
        timeseries_writes.upsert(store, ts, doc, None, None)
    return {"lastErrorObject": {"n": 1, "updatedExisting": False, "upserted": doc["_id"]},
            "value": project(store, db, coll, doc, fields) if new else None}


def _replayed_find_and_modify(
    store: Store, db: str, coll: str, retry: Retry, done: LoggedWrite, cmd: Mapping[str, Any]
) -> dict[str, Any]:
    """A retried findAndModify known from its oplog entry only (the server restarted since):
    its reply rebuilt as mongod rebuilds it, from the entry (an upsert) or from the image its
    `needsRetryImage` points at in config.image_collection."""
    session = retry.session
    assert session is not None
    fields = cmd.get("fields")
    if done.op == "i":  # an upsert: the inserted document is the entry's `o`
        value = None
        if write_parsing.true_value(cmd.get("new")):
            entry = store.entry_at(done.ts) if done.ts is not None else None
            value = project(store, db, coll, entry["o"], fields) if entry else None
        return {"lastErrorObject": {"n": 1, "updatedExisting": False, "upserted": done.doc_id},
                "value": value}
    image = store.retry_image(session.lsid, session.txn_number, done.ts)
    if image is None or done.needs_retry_image is None:
        raise MongoError(
            217, f"Retrying a findAndModify operation with session id {lsid_str(session.lsid)} "
            f"and txn number {session.txn_number} after it has been executed but the "
            f"{'post' if done.needs_retry_image == 'postImage' else 'pre'}-image is no "
            "longer available",
        )
    last_error: dict[str, Any] = {"n": 1}
    if done.op == "u":
        last_error["updatedExisting"] = True
    return {"lastErrorObject": last_error, "value": project(store, db, coll, image, fields)}

# ---------------------------------------------------------------------------------------------
# $out


def _write_out(store: Store, db: str, stage: Mapping[str, Any], results: list[Any]) -> None:
    """`$out` as mongod runs it: a temporary collection renamed over the target."""
    import uuid

    name, arg = next(iter(stage.items()))
    if name == "$merge":
        _write_merge(store, db, arg, results)
        return
    if isinstance(arg, Mapping):
        out_db, out_coll = arg.get("db", db), arg.get("coll")
    else:
        out_db, out_coll = db, arg
    if not is_string(out_coll) or not out_coll or not is_string(out_db):
        raise MongoError(16990, "$out only supports a string or object argument")
    tmp = store.create_collection(out_db, f"tmp.agg_out.{uuid.uuid4()}", {})
    target = store.get(out_db, out_coll)
    if target is not None:
        store.create_indexes(tmp, [dict(s) for s in target.indexes[1:]])
    for doc in results:
        store.insert_document(tmp, prepare_insert(doc))
    store.rename_collection(tmp, out_db, out_coll, drop_target=True, stay_temp=False)


# ---------------------------------------------------------------------------------------------
# $merge (mongod's DocumentSourceMerge: each result matched on `on` in the target collection)

_MERGE_FIELDS = ("into", "on", "let", "whenMatched", "whenNotMatched", "targetCollectionVersion")
_WHEN_MATCHED = ("replace", "keepExisting", "merge", "fail")
_WHEN_NOT_MATCHED = ("insert", "discard", "fail")


def _merge_spec(db: str, arg: Any) -> tuple[str, str, list[str], Any, Any, Any]:
    """(db, coll, on fields, whenMatched, whenNotMatched, let) of a `$merge` stage, checked as
    mongod parses it (DocumentSourceMergeSpec)."""
    if is_string(arg):
        arg = {"into": arg}
    if not isinstance(arg, Mapping):
        raise MongoError(51182, "$merge only supports a string or object argument, but found "
                         f"{type_name(arg)}")
    for key in arg:
        if key not in _MERGE_FIELDS:
            raise MongoError(40415, f"BSON field '$merge.{key}' is an unknown field.")
    into = arg.get("into")
    if is_string(into):
        out_db, out_coll = db, into
    elif isinstance(into, Mapping):
        out_db, out_coll = into.get("db", db), into.get("coll")
    else:
        raise MongoError(51178, "$merge 'into' field  must be either a string or an object, "
                         f"but found {type_name(into)}")
    if not is_string(out_coll) or not out_coll or not is_string(out_db) or not out_db:
        raise MongoError(73, f"Invalid {'$merge'} target namespace: '{out_db}.{out_coll}'")
    on = arg.get("on", "_id")
    fields = [on] if is_string(on) else on
    if not isinstance(fields, list) or not fields or not all(is_string(f) for f in fields):
        raise MongoError(51186, "$merge 'on' field  must be either a string or an array of "
                         f"strings, but found {type_name(on)}")
    if len(set(fields)) != len(fields):
        raise MongoError(31465, f"Found a duplicate field '{fields[0]}'")
    matched = arg.get("whenMatched", "merge")
    if not isinstance(matched, list) and matched not in _WHEN_MATCHED:
        raise MongoError(2, f"Enumeration value '{matched}' for field '$merge.whenMatched' is "
                         "not a valid value.")
    not_matched = arg.get("whenNotMatched", "insert")
    if not_matched not in _WHEN_NOT_MATCHED:
        raise MongoError(2, f"Enumeration value '{not_matched}' for field "
                         "'$merge.whenNotMatched' is not a valid value.")
    let = arg.get("let")
    if let is not None and not isinstance(matched, list):
        raise MongoError(51199, "Cannot use 'let' variables with 'whenMatched: "
                         f"{matched}' mode")
    if let is not None and not isinstance(let, Mapping):
        raise MongoError(14, f"BSON field '$merge.let' is the wrong type '{type_name(let)}', "
                         "expected type 'object'")
    return out_db, out_coll, fields, matched, not_matched, let


def _merge_key(doc: Mapping[str, Any], fields: list[str]) -> tuple[bytes, ...]:
    """The `on` fields' values of `doc` (each present, not null/undefined, not an array)."""
    key = []
    for path in fields:
        value = document_value(doc, path, None)
        if isinstance(value, list):
            raise MongoError(51185, f"$merge write error: 'on' field '{path}' is an array")
        if value is None:  # missing, null (BSON undefined decodes to None)
            raise MongoError(51132, f"$merge write error: 'on' field '{path}' cannot be "
                             "missing, null, undefined or an array")
        key.append(id_key(value))
    return tuple(key)


def _write_merge(store: Store, db: str, arg: Any, results: list[Any]) -> None:
    """`$merge`: each result document updates (whenMatched) or is inserted into
    (whenNotMatched) the target collection, matched on the `on` fields."""
    out_db, out_coll, fields, matched, not_matched, let = _merge_spec(db, arg)
    validate_collection_name(out_db, out_coll)
    target = store.get(out_db, out_coll)
    if fields != ["_id"]:  # mongod requires a unique index whose keys are exactly `on`
        unique = target is not None and any(
            ix.get("unique") and set(ix.get("key", {})) == set(fields)
            for ix in target.indexes[1:]
        )
        if not unique:
            raise MongoError(51183, "Cannot find index to verify that join fields will be "
                             "unique")
    c = target if target is not None else store.ensure_collection(out_db, out_coll)
    by_key: dict[tuple[bytes, ...], dict[str, Any]] = {}
    for existing in store.documents(c).values():
        try:
            by_key.setdefault(_merge_key(existing, fields), existing)
        except MongoError:
            continue  # a target document without the `on` fields matches nothing
    for doc in results:
        if not isinstance(doc, dict):
            continue
        if "_id" not in doc and "_id" in fields:  # MergeProcessor: only when `on` has _id
            doc = {"_id": ObjectId(), **doc}
        key = _merge_key(doc, fields)
        pre = by_key.get(key)
        if pre is None or matched == "fail":
            if not_matched == "discard" and pre is None:
                continue
            if not_matched == "fail" and pre is None:
                raise MongoError(13113, "$merge could not find a matching document in the "
                                 "target collection for at least one document in the source "
                                 "collection")
            if isinstance(matched, list) and pre is None:  # an upsert: the pipeline applied
                # to the `on` fields (MergeProcessor's upsert), not the result document
                seed: dict[str, Any] = {}
                for path in fields:
                    modifiers.set_path(seed, path, document_value(doc, path, None))
                update = engine.bind_pipeline(matched, engine.merge_variables(let, doc))
                new = engine.apply_pipeline_update(seed, update)
                new = _id_first({"_id": seed["_id"], **new} if "_id" in seed else new)
            else:
                new = doc
            new = prepare_insert(new)
            store.insert_document(c, new, validate=True)
            by_key[key] = new
            continue
        if matched == "keepExisting":
            continue
        if matched == "replace":
            post = {k: engine.normalize(v) for k, v in doc.items()}
            post = {"_id": post.get("_id", pre["_id"]), **{k: v for k, v in post.items()
                                                           if k != "_id"}}
            kind, update = "replacement", post
        elif matched == "merge":
            update = {"$set": dict(doc)}
            post = compute_update(store, out_db, out_coll, pre, {}, update, "modifier", None)
            kind = "modifier"
        else:  # a pipeline: $$new is the result document unless `let` names other variables
            variables = engine.merge_variables(let, doc)
            update = engine.bind_pipeline(matched, variables)
            post = compute_update(store, out_db, out_coll, pre, {}, update, "pipeline", None)
            kind = "pipeline"
        if "_id" in post and id_key(post["_id"]) != id_key(pre["_id"]):
            raise MongoError(66, "$merge failed to update the matching document, did you "
                             "attempt to modify the _id or the shard key? :: caused by :: "
                             "Performing an update on the path '_id' would modify the "
                             "immutable field '_id'")
        store.update_document(c, pre, post, kind=kind, update=update, validate=True)
        by_key[key] = post


