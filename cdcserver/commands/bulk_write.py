"""The 8.0 `bulkWrite` admin command (client bulk write), answered as mongod 8.0's
`bulk_write.cpp` answers it.

`{bulkWrite: 1, ops: [...], nsInfo: [{ns}], ordered, errorsOnly, bypassDocumentValidation, let,
cursor: {batchSize}}` on the admin database: inserts, updates and deletes over several
namespaces, each op run by the same statement machinery as insert / update / delete
(commands/writes.py). The reply is a cursor over one result per op (`{ok, idx, n[, nModified]
[, upserted]}`, or `{ok: 0, idx, code, errmsg, ...}`; with `errorsOnly` only the errors) and
the summary counts `nErrors`, `nInserted`, `nMatched`, `nModified`, `nUpserted`, `nDeleted`.

mongod's order of checks: admin only (13), the IDL parse (strict, fields in document order),
then validateRequest (16 batch size, 72 stmtId with stmtIds, 73 namespace, 2 nsInfo index).
A retryable write's statement ids are the ops' positions (or `stmtId` + position, or
`stmtIds`); a retried statement is answered from the session and listed in `retriedStmtIds`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import bson
from bson.int64 import Int64
from bson.timestamp import Timestamp

from cdcserver.commands import queries, transactions, write_concern, write_parsing, writes
from cdcserver.commands.admin import ELECTION_ID
from cdcserver.commands.arguments import cursor_batch_size, missing, unknown_field, wrong_type
from cdcserver.commands.transactions import NOT_DONE, get_store
from cdcserver.context import ConnectionState, ServerState
from cdcserver.embedded import engine
from cdcserver.embedded.store import DocumentValidationError, DuplicateKeyError
from pipeline_stages import bson_bytes
from pipeline_stages.errors import MongoError

CURSOR_NS = "admin.$cmd.bulkWrite"  # NamespaceString::makeBulkWriteNSS
# gBulkWriteMaxRepliesSize's default: the replies kept for the cursor, in bytes.
MAX_REPLIES_SIZE = 16 * 1024 * 1024
_CTX = "bulkWrite"
# BulkWriteReplyItem::getApproximateSize: the item's own size (about a C++ object's) plus its
# error message and upserted _id; the BSON encoding is not what mongod counts.
_ITEM_SIZE = 80

# write_parsing's IDL field checks, shared with insert / update / delete.
_check_bool = write_parsing._check_bool
_check_safe_bool = write_parsing._check_safe_bool
_check_object = write_parsing._check_object
_check_int = write_parsing._check_int
_check_uuid = write_parsing._check_uuid
_array_of = write_parsing._array_of


@dataclass
class Op:
    kind: str  # insert | update | delete
    ns_index: int
    spec: Mapping[str, Any]


@dataclass
class Request:
    ops: list[Op]
    namespaces: list[tuple[str, str]]  # (db, collection) per nsInfo entry
    ordered: bool = True
    bypass_validation: bool = False
    errors_only: bool = False
    batch_size: int | None = None
    stmt_id: int | None = None
    stmt_ids: list[int] | None = None


# -- parsing (bulk_write.idl) -------------------------------------------------------------------

_INSERT_FIELDS: tuple[str, ...] = ("insert", "document")
_UPDATE_FIELDS: tuple[str, ...] = (
    "update", "filter", "multi", "updateMods", "upsert", "upsertSupplied", "arrayFilters", "hint",
    "constants", "let", "collation", "sort", "return", "returnFields",
)
_DELETE_FIELDS: tuple[str, ...] = (
    "delete", "filter", "multi", "hint", "let", "collation", "sort", "return", "returnFields",
)


def _ns_index(value: Any, path: str) -> int:
    """IDL `safeInt` with validator gte 0."""
    if isinstance(value, bool) or not isinstance(value, (int, float, bson.decimal128.Decimal128)):
        raise wrong_type(path, value, "[int, long, double, decimal]")
    number = int(float(str(value))) if not isinstance(value, int) else value
    if number < 0:
        raise MongoError(51024, f"BSON field '{path}' value must be >= 0, actual value "
                         f"'{number}'")
    return number


def _parse_op(raw: Mapping[str, Any]) -> Op:
    first = next(iter(raw), None)
    if first == "insert":
        kind, allowed = "insert", _INSERT_FIELDS
    elif first == "update":
        kind, allowed = "update", _UPDATE_FIELDS
    elif first == "delete":
        kind, allowed = "delete", _DELETE_FIELDS
    else:
        raise unknown_field(f"{_CTX}.ops.{first}")
    ctx = f"{_CTX}.ops.{kind}" if kind != "insert" else f"{_CTX}.ops"
    seen: set[str] = set()
    ns_index = 0
    for key, value in raw.items():
        path = f"{ctx}.{key}"
        if key not in allowed:
            raise unknown_field(path)
        if key == kind:
            ns_index = _ns_index(value, path)
        elif key in ("document", "filter", "collation", "sort", "returnFields", "constants",
                     "let"):
            _check_object(value, path)
        elif key == "updateMods":
            write_parsing.check_update_modification(value)
        elif key in ("multi", "upsert", "upsertSupplied"):
            _check_bool(value, path)
        elif key == "arrayFilters":
            _array_of(value, path, "object")
        elif key == "hint":
            write_parsing.check_hint(value)
        elif key == "return":
            if kind == "update" and value is not None and not isinstance(value, str):
                raise wrong_type(path, value, "string")
            if kind == "delete":
                _check_bool(value, path)
        if value is not None or key in ("updateMods", "hint"):
            seen.add(key)
    required = {"insert": ("insert", "document"), "update": ("update", "filter", "updateMods"),
                "delete": ("delete", "filter")}[kind]
    for name in required:
        if name not in seen:
            raise missing(f"{ctx}.{name}")
    return Op(kind, ns_index, raw)


def _parse_ns_info(entry: Mapping[str, Any], path: str) -> str:
    ns: str | None = None
    for key, value in entry.items():
        sub = f"{path}.{key}"
        if key == "ns":
            if not isinstance(value, str):
                raise wrong_type(sub, value, "string")
            ns = value
        elif key == "collectionUUID":
            _check_uuid(value, sub)
        elif key in ("encryptionInformation", "shardVersion", "databaseVersion"):
            _check_object(value, sub)
        elif key == "isTimeseriesNamespace":
            _check_bool(value, sub)
        else:
            raise unknown_field(sub)
    if ns is None:
        raise missing(f"{path}.ns")
    return ns


def _split_ns(ns: str) -> tuple[str, str]:
    """NamespaceString::isValid, or 73."""
    db, dot, coll = ns.partition(".")
    if not dot or not coll or not db or any(ch in db for ch in '/\\. "$\0') or "\0" in coll:
        raise MongoError(73, f"Invalid namespace specified for bulkWrite: '{ns}'")
    return db, coll


def parse(cmd: Mapping[str, Any]) -> Request:
    """The command parsed as its IDL parses it, then bulk_write_common::validateRequest."""
    ops: list[Op] | None = None
    namespaces: list[str] | None = None
    request = Request([], [])
    for i, (key, value) in enumerate(cmd.items()):
        if i == 0:
            continue
        path = f"{_CTX}.{key}"
        if key == "ops":
            if value is None:
                continue
            ops = [_parse_op(raw) for raw in _array_of(value, path, "object")]
        elif key == "nsInfo":
            if value is None:
                continue
            namespaces = [_parse_ns_info(e, path) for e in _array_of(value, path, "object")]
        elif key == "cursor":
            request.batch_size = cursor_batch_size(cmd, _CTX)
        elif key == "bypassDocumentValidation":
            request.bypass_validation = _check_safe_bool(value, path)
        elif key in ("ordered", "errorsOnly"):
            _check_bool(value, path)
            if key == "ordered":
                request.ordered = value is not False
            else:
                request.errors_only = value is True
        elif key == "stmtId":
            _check_int(value, path)
            request.stmt_id = value
        elif key == "stmtIds":
            request.stmt_ids = _array_of(value, path, "int") if value is not None else None
        elif key in ("let", "$_originalQuery", "$_originalCollation"):
            _check_object(value, path)
        elif key in write_parsing.GENERIC_ARGUMENTS:
            continue
        else:
            raise unknown_field(path)
    if ops is None:
        raise missing(f"{_CTX}.ops")
    if namespaces is None:
        raise missing(f"{_CTX}.nsInfo")
    request.ops = ops
    _validate(request, namespaces)
    write_parsing.check_max_time_ms(cmd)
    return request


def _validate(request: Request, namespaces: list[str]) -> None:
    n = len(request.ops)
    if not n or n > write_parsing.MAX_WRITE_BATCH:
        raise MongoError(16, f"Write batch sizes must be between 1 and "
                         f"{write_parsing.MAX_WRITE_BATCH}. Got {n} operations.")
    if request.stmt_id is not None and request.stmt_ids is not None:
        raise MongoError(72, "May not specify both stmtId and stmtIds in bulkWrite command. Got "
                         f"{{ stmtId: {request.stmt_id}, stmtIds: {request.stmt_ids} }}.")
    if request.stmt_ids is not None and len(request.stmt_ids) != n:
        raise MongoError(16, "Number of statement ids must match the number of batch entries. "
                         f"Got {len(request.stmt_ids)} statement ids but {n} operations.")
    request.namespaces = [_split_ns(ns) for ns in namespaces]
    for op in request.ops:
        if op.ns_index >= len(request.namespaces):
            raise MongoError(2, f"BulkWrite ops entry {_shell(op.spec)} has an invalid nsInfo "
                             "index.")


def _shell(doc: Mapping[str, Any]) -> str:
    """A small document as mongod prints one in a message ({ insert: 5, document: {...} })."""
    def value(v: Any) -> str:
        if isinstance(v, Mapping):
            return _shell(v)
        if isinstance(v, str):
            return f'"{v}"'
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, list):
            return "[ " + ", ".join(value(x) for x in v) + " ]" if v else "[]"
        return str(v)
    if not doc:
        return "{}"
    return "{ " + ", ".join(f"{k}: {value(v)}" for k, v in doc.items()) + " }"


def statement_id(request: Request, index: int) -> int:
    """bulk_write_common::getStatementId."""
    if request.stmt_ids is not None:
        return int(request.stmt_ids[index])
    return (request.stmt_id or 0) + index


# -- running ------------------------------------------------------------------------------------


@dataclass
class _Replies:
    """mongod's BulkWriteReplies: the per-op results kept for the cursor, and the counts."""

    errors_only: bool
    items: list[dict[str, Any]] = field(default_factory=list)
    retried: list[int] = field(default_factory=list)
    size: int = 0
    n_errors: int = 0
    n_inserted: int = 0
    n_matched: int = 0
    n_modified: int = 0
    n_upserted: int = 0
    n_deleted: int = 0

    def add(self, item: dict[str, Any]) -> None:
        if item["ok"] == 1.0 and self.errors_only:
            return
        size = _ITEM_SIZE + len(item.get("errmsg", ""))
        if "upserted" in item:
            size += len(bson_bytes.encode(item["upserted"]))
        self.size += size
        self.items.append(item)

    def error(self, idx: int, err: MongoError, update: bool = False) -> None:
        item: dict[str, Any] = {"ok": 0.0, "idx": idx, "code": err.code, "errmsg": err.errmsg}
        if isinstance(err, (DuplicateKeyError, DocumentValidationError)):
            item.update(err.extra())
        item["n"] = 0
        if update:
            item["nModified"] = 0
        self.n_errors += 1
        self.add(item)


def _update_spec(op: Mapping[str, Any], variables: Mapping[str, Any]) -> dict[str, Any]:
    """A bulkWrite update op as an update command's statement (makeUpdateOpEntryFromUpdateOp),
    the command's `let` variables bound into its filter and pipeline."""
    u = op.get("updateMods")
    spec: dict[str, Any] = {
        "q": engine.bind_filter(op.get("filter"), variables) if variables else op.get("filter"),
        "u": engine.bind_pipeline(u, variables) if variables and isinstance(u, list) else u,
    }
    for src, dst in (("multi", "multi"), ("upsert", "upsert"), ("arrayFilters", "arrayFilters"),
                     ("collation", "collation"), ("hint", "hint"), ("sort", "sort"),
                     ("constants", "c")):
        if op.get(src) is not None:
            spec[dst] = op[src]
    return spec


def _delete_spec(op: Mapping[str, Any], variables: Mapping[str, Any]) -> dict[str, Any]:
    q = op.get("filter")
    spec: dict[str, Any] = {"q": engine.bind_filter(q, variables) if variables else q,
                            "limit": 0 if op.get("multi") is True else 1}
    for key in ("collation", "hint"):
        if op.get(key) is not None:
            spec[key] = op[key]
    return spec


async def bulk_write(
    server: ServerState, conn: ConnectionState, cmd: dict[str, Any], db: str
) -> dict[str, Any]:
    if db != "admin":
        raise MongoError(13, "bulkWrite may only be run against the admin database.")
    request = parse(cmd)
    variables = engine.let_variables(cmd.get("let"), _CTX)  # evaluated once, before any op
    wc = write_concern.parse(cmd)
    store = get_store(server)
    validate = not request.bypass_validation
    retryable = cmd.get("txnNumber") is not None and cmd.get("autocommit") is None
    replies = _Replies(request.errors_only)
    progress = writes._Progress()

    def run() -> None:
        retry = progress.retry_state(store, cmd)
        try:
            for i in range(progress.next, len(request.ops)):
                progress.next = i
                if replies.size >= MAX_REPLIES_SIZE:  # aboveBulkWriteRepliesMaxSize
                    replies.error(i, MongoError(146, "BulkWrite response size exceeded limit "
                                                f"({MAX_REPLIES_SIZE} bytes)"))
                    break
                if not _run_op(i, retry):
                    break
        finally:
            retry.finish()

    def _run_op(i: int, retry: Any) -> bool:
        """One op; False when the batch stops there."""
        op = request.ops[i]
        ns_db, coll = request.namespaces[op.ns_index]
        stmt = statement_id(request, i)
        spec = op.spec
        multi = spec.get("multi") is True
        try:
            if op.kind != "insert" and multi and retryable:
                raise MongoError(72, "Cannot use retryable writes with multi=true")
            # IncompleteTransactionHistory (217) fails the command: outside the op's errors
            done = retry.result(stmt, "update" if op.kind == "update" else "insert")
        except MongoError as err:
            if err.code == 217:
                raise
            return _failed(i, op, err)
        if done is not NOT_DONE:
            replies.retried.append(stmt)
        try:
            if op.kind == "insert":
                if done is NOT_DONE:
                    doc, raw = writes.prepare_decoded_insert(spec["document"])
                    c = store.get(ns_db, coll) or store.ensure_collection(ns_db, coll)
                    store.insert_document(c, doc, retry.session, stmt, validate=validate,
                                          raw=raw)
                    retry.record(stmt, True)
                replies.n_inserted += 1
                item: dict[str, Any] = {"ok": 1.0, "idx": i, "n": 1}
            elif op.kind == "update":
                if done is NOT_DONE:
                    done = writes.run_update_statement(
                        store, ns_db, coll, _update_spec(spec, variables), retry, stmt,
                        validate=validate,
                        progress=progress,
                    )
                    retry.record(stmt, done)
                n, modified, upserted = done
                item = {"ok": 1.0, "idx": i, "n": n, "nModified": modified}
                replies.n_modified += modified
                if upserted is not None:
                    item["upserted"] = {"index": 0, "_id": upserted[0]}
                    replies.n_upserted += 1
                else:
                    replies.n_matched += n
            else:
                if done is NOT_DONE:
                    done = writes.run_delete_statement(
                        store, ns_db, coll, _delete_spec(spec, variables), retry, stmt,
                        progress,
                    )
                    retry.record(stmt, done)
                replies.n_deleted += done
                item = {"ok": 1.0, "idx": i, "n": done}
        except MongoError as err:
            if err.code == 112 and store.txn is not None and store.txn.of_a_session:
                raise  # a write conflict in a transaction fails the command (transient)
            if err.code != 112:
                progress.statement_done(i)
            return _failed(i, op, err)
        progress.statement_done(i)
        replies.add(item)
        return True

    def _failed(i: int, op: Op, err: MongoError) -> bool:
        replies.error(i, err, update=op.kind == "update")
        # In a transaction a write error ends the batch and aborts the transaction.
        return not transactions.txn_write_error(store) and not request.ordered

    await writes._run_writes(store, cmd, run)
    return write_concern.add_to_reply(_reply(server, store, request, replies, wc), wc)


def _reply(server: Any, store: Any, request: Request, replies: _Replies,
           wc: Mapping[str, Any] | None) -> dict[str, Any]:
    """_populateCursorReply: the results that fit in the first batch, the rest for getMore."""
    unacknowledged = wc is not None and wc.get("w") == 0 and not wc.get("j")
    counts = {"nErrors": replies.n_errors, "nInserted": replies.n_inserted,
              "nMatched": replies.n_matched, "nModified": replies.n_modified,
              "nUpserted": replies.n_upserted, "nDeleted": replies.n_deleted}
    if not replies.items or unacknowledged:
        return {"cursor": {"id": Int64(0), "firstBatch": [], "ns": CURSOR_NS}, **counts}
    batch_size = request.batch_size if request.batch_size is not None else len(replies.items)
    first = queries.cursor_first_batch(server, CURSOR_NS, replies.items, batch_size)["cursor"]
    reply: dict[str, Any] = {
        "cursor": {"id": first["id"], "firstBatch": first["firstBatch"], "ns": CURSOR_NS},
        **counts,
        "electionId": ELECTION_ID,
        "opTime": {"ts": store.latest_ts() or Timestamp(0, 0), "t": Int64(1)},
    }
    if replies.retried:
        reply["retriedStmtIds"] = replies.retried
    return reply


# This family's commands (a family table, as cdcserver/deployments/ assemble them).
TABLE: dict[str, Any] = {"bulkWrite": bulk_write}
