"""Write concern as a single-member replica-set primary (mongod 8.0) takes it.

The store is the only data-bearing member, so `w: 1`, `w: "majority"` and `w: 0` are all
satisfied when the write is (durably, `persist.py` commits before the reply); `j` is accepted.
What one member cannot satisfy is reported the way mongod reports it: the write is applied and
the reply is `ok: 1` with a `writeConcernError`; a malformed write concern fails the command
before it runs (9 FailedToParse).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from cdcserver.commands.arguments import safe_long
from pipeline_stages.errors import CODE_NAMES, MongoError
from pipeline_stages.value_string import type_name

MAX_MEMBERS = 50  # kMaxReplSetMembers
MEMBERS = 1  # data-bearing members of the (single-member) replica set


def parse(cmd: Mapping[str, Any]) -> dict[str, Any] | None:
    """The command's `writeConcern` checked as mongod's WriteConcernOptions::parse checks it;
    None when absent."""
    wc = cmd.get("writeConcern")
    if wc is None:
        return None
    if not isinstance(wc, Mapping):
        raise MongoError(
            14, f"BSON field 'writeConcern' is the wrong type '{type_name(wc)}', expected type "
            "'object'",
        )
    if "w" in wc:
        w = wc["w"]
        if isinstance(w, bool) or not isinstance(w, (int, float, str)):
            raise MongoError(9, "w has to be a number or string")
        if not isinstance(w, str) and (w < 0 or w > MAX_MEMBERS):
            raise MongoError(
                9, f"w has to be a non-negative number and not greater than {MAX_MEMBERS}; "
                f"found: {_number(w)}",
            )
    for name in ("j", "fsync"):
        value = wc.get(name)
        if value is not None and not isinstance(value, (bool, int, float)):
            raise MongoError(9, f"{name} must be numeric or a boolean value")
    wtimeout = wc.get("wtimeout", wc.get("wtimeoutMS"))
    if wtimeout is not None and (isinstance(wtimeout, bool) or not isinstance(
        wtimeout, (int, float)
    )):
        raise MongoError(9, "wtimeout must be a number")
    if wc.get("j") and wc.get("fsync"):
        raise MongoError(9, "fsync and j options cannot be used together")
    return dict(wc)


def _number(w: Any) -> str:
    if isinstance(w, float) and not math.isfinite(w):
        return str(safe_long(w))  # mongod prints safeNumberLong's clamp of ±inf
    return str(int(w)) if float(w) == int(w) else str(w)


def error_for(wc: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """The `writeConcernError` a satisfied write gets under `wc` on a one-member set."""
    if wc is None or "w" not in wc:
        return None
    w = wc["w"]
    if isinstance(w, str):
        if w == "majority":
            return None
        code, msg = 79, f"No write concern mode named '{w}' found in replica set configuration"
    elif w <= MEMBERS:
        return None
    else:
        code, msg = 100, "Not enough data-bearing nodes"
    shown: dict[str, Any] = {"w": w}
    if "j" in wc:
        shown["j"] = wc["j"]
    shown["wtimeout"] = int(wc.get("wtimeout", 0) or 0)
    shown["provenance"] = "clientSupplied"
    return {"code": code, "codeName": CODE_NAMES[code], "errmsg": msg,
            "errInfo": {"writeConcern": shown}}


def add_to_reply(reply: dict[str, Any], wc: Mapping[str, Any] | None) -> dict[str, Any]:
    err = error_for(wc)
    return reply if err is None else {**reply, "writeConcernError": err}


# Commands whose handlers leave write concern to the dispatcher (registry.run_command): mongod's
# DDL commands wait for the write concern as any write does (supportsWriteConcern), and so does
# an aggregate whose last stage writes ($out, $merge). insert / update / delete /
# findAndModify / bulkWrite / commitTransaction / abortTransaction answer for it themselves.
_DDL_COMMANDS = frozenset({
    "create", "drop", "dropDatabase", "renameCollection", "createIndexes", "dropIndexes",
    "deleteIndexes", "collMod", "convertToCapped", "cloneCollectionAsCapped", "applyOps",
})


def _writes_through_pipeline(cmd: Mapping[str, Any]) -> bool:
    pipeline = cmd.get("pipeline")
    if not isinstance(pipeline, list) or not pipeline or not isinstance(pipeline[-1], Mapping):
        return False
    last = pipeline[-1]
    return "$out" in last or "$merge" in last


def left_to_dispatch(name: str, cmd: Mapping[str, Any]) -> bool:
    """True when `run_command` parses this command's write concern and reports it."""
    if name in _DDL_COMMANDS:
        return True
    return name == "aggregate" and _writes_through_pipeline(cmd)


def add_if_unreported(reply: dict[str, Any], wc: Mapping[str, Any] | None) -> dict[str, Any]:
    """`add_to_reply` unless the reply has its writeConcernError already (a sharded front
    passes a shard's on; a failCommand fail point adds its own later)."""
    if "writeConcernError" in reply:
        return reply
    return add_to_reply(reply, wc)


def add_to_error_reply(reply: dict[str, Any], wc: Mapping[str, Any] | None) -> dict[str, Any]:
    """An error reply with the writeConcernError a failed command gets under `wc` (after
    codeName, before errorLabels, as mongod appends it)."""
    err = error_for(wc)
    if err is None or "writeConcernError" in reply:
        return reply
    out: dict[str, Any] = {}
    for key, value in reply.items():
        if key in ("errorLabels", "$clusterTime", "operationTime") and err is not None:
            out["writeConcernError"], err = err, None
        out[key] = value
    if err is not None:
        out["writeConcernError"] = err
    return out
