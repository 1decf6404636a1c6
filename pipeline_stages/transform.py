"""`$_internalChangeStreamTransform`: one oplog entry -> one change event, fields in mongod's order.

See ../shared/reference/oplog_to_events.md §4. The event is a plain dict whose insertion order
is the wire order; documents taken from the oplog (`o` -> `fullDocument`, `o2` -> `documentKey`)
stay `RawBSONDocument`s so their bytes are copied, not rebuilt.

Deviations from mongod 8.0, for replaying old oplogs (docs/fidelity.md):
- `$v:1` / modifier-style updates (written by MongoDB <= 4.4) produce the `updateDescription`
  MongoDB 6.x produced, instead of 8.0's error 6741200;
- entries without `wall` (MongoDB < 3.6) produce events without `wallTime` instead of 40532.
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping
from typing import Any

import bson
from bson.raw_bson import RawBSONDocument
from bson.timestamp import Timestamp

from pipeline_stages import bson_bytes, resume_token
from pipeline_stages.errors import MongoError
from pipeline_stages.oplog_entry import (
    VIEWLESS_TIMESERIES,
    Entry,
    EntryDocument,
    split_ns,
    viewless_timeseries_rename,
)
from pipeline_stages.resume_token import ResumeTokenData
from pipeline_stages.spec import ChangeStreamSpec
from pipeline_stages.update_description import legacy_update_description, update_description
from pipeline_stages.value_string import value_string

# Operation types a stream shows without showExpandedEvents (the classic-type $match, §2.1/9).
CLASSIC_EVENT_TYPES = frozenset(
    {
        "insert", "update", "replace", "delete", "drop", "rename", "dropDatabase", "invalidate",
        "reshardBegin", "reshardDoneCatchUp", "migrateChunkToNewShard",
    }
)

_NO_OP_EVENTS = (
    "shardCollection", "refineCollectionShardKey", "reshardCollection", "reshardBegin",
    "reshardDoneCatchUp", "migrateChunkToNewShard", "migrateLastChunkFromShard",
)


class _Missing:
    """A reserved but empty field slot (mongod's missing Value): dropped before the reply."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "MISSING"


MISSING: Any = _Missing()

# Internal fields the image stages read; removed before events leave the pipeline.
PRE_IMAGE_ID = "preImageId"
RAW_OPLOG_UPDATE_SPEC = "rawOplogUpdateSpec"
INTERNAL_FIELDS = (PRE_IMAGE_ID, RAW_OPLOG_UPDATE_SPEC)


def _without(doc: Mapping[str, Any], *names: str) -> dict[str, Any]:
    return {k: v for k, v in doc.items() if k not in names}


def _update_shape(o: Mapping[str, Any]) -> tuple[Any, bool]:
    """(`o.$v`, whether `o` is a replacement) without decoding a raw replacement document:
    mongod writes `$v` first in update entries and `_id` first in replacements."""
    if type(o) is EntryDocument or isinstance(o, RawBSONDocument):  # exact type: no ABC check
        raw = o.raw
        if raw[5:9] == b"_id\x00":
            return None, True
        if raw[5:8] == b"$v\x00" and raw[4] == 0x10:
            return int.from_bytes(raw[8:12], "little", signed=True), False
    version = o.get("$v")
    return version, version is None and "_id" in o


def _raw(doc: Mapping[str, Any]) -> bytes:
    if type(doc) is EntryDocument or isinstance(doc, RawBSONDocument):  # exact type: no ABC check
        raw = doc.raw
        # A view into a large entry's bytes: the token's KeyString builder reads bytes.
        return raw if type(raw) is bytes else bytes(raw)
    return bson_bytes.encode(doc)


class ChangeStreamTransform:
    """Builds events for one stream (its spec decides expanded fields and token versions)."""

    def __init__(self, spec: ChangeStreamSpec) -> None:
        self.spec = spec
        self.expanded = spec.show_expanded_events
        self.raw_updates = spec.show_raw_update_description
        self.resumed_from = spec.resume_token
        self.want_pre_image = spec.full_document_before_change != "off"
        self.want_post_image = spec.full_document in ("whenAvailable", "required")
        self.post_image_slot = spec.full_document != "default"

    def _version(self, ts: Timestamp) -> int:
        resumed = self.resumed_from
        default = self.spec.token_version
        if resumed is not None and resumed.version != default and ts <= resumed.cluster_time:
            return resumed.version
        return default

    def transform(self, entry: Entry) -> dict[str, Any] | None:
        """The event for `entry`, or None for entries that produce none (index-build steps)."""
        op = entry["op"]
        if op == "i" or op == "u" or op == "d":
            db, coll = split_ns(entry["ns"])
            if coll == "system.views":
                return self._view_event(entry, db)
            return self._crud_event(entry, op, db, coll)
        if op == "c":
            return self._command_event(entry)
        if op == "n":
            return self._no_op_event(entry)
        raise MongoError(5052201, f"Unexpected op type: {op}")

    # -- shared parts ---------------------------------------------------------------------------

    def _head(
        self,
        entry: Entry,
        operation_type: str,
        *,
        document_key: Mapping[str, Any] | None = None,
        operation_description: Mapping[str, Any] | None = None,
        uuid: bytes | None = None,
        show_uuid: bool = True,
        first: dict[str, Any] | None = None,
    ) -> dict[str, Any]:
        """`[first fields,] [txnNumber, lsid,] _id, operationType, clusterTime,
        [collectionUUID,] wallTime` — the prefix every event shares."""
        ts = entry["ts"]
        event: dict[str, Any] = first if first is not None else {}
        txn_op_index = entry.get("txnOpIndex")
        if txn_op_index is not None:  # lsid/txnNumber only on events unwound from a transaction
            if "txnNumber" in entry:
                event["txnNumber"] = entry["txnNumber"]
            if "lsid" in entry:
                event["lsid"] = entry["lsid"]
        version = self._version(ts)
        if version == 2 and uuid is not None and document_key is not None:
            event["_id"] = resume_token.event_token(  # the per-CRUD-event fast path
                ts, operation_type, uuid, _raw(document_key), txn_op_index or 0
            )
        else:
            event["_id"] = ResumeTokenData.for_event(
                ts,
                operation_type,
                uuid=uuid,
                document_key=None if document_key is None else _raw(document_key),
                operation_description=(
                    None if operation_description is None else _raw(operation_description)
                ),
                txn_op_index=txn_op_index or 0,
                version=version,
            ).to_document()
        event["operationType"] = operation_type
        event["clusterTime"] = ts
        if self.expanded and uuid is not None and show_uuid:
            event["collectionUUID"] = uuid
        wall = entry.get("wall")
        if wall is not None:
            if not isinstance(wall, datetime.datetime):
                raise MongoError(
                    40532, f'Entry field "wall" should be date, found: {value_string(wall)}'
                )
            event["wallTime"] = wall
        return event

    # -- CRUD -----------------------------------------------------------------------------------

    def _crud_event(self, entry: Entry, op: str, db: str, coll: str) -> dict[str, Any]:
        o = entry["o"]
        uuid = entry.get("ui")
        ns = {"db": db, "coll": coll}
        if op == "i":
            key = entry.get("o2")
            if key is None:  # entries written before 5.3 carry no o2
                key = {"_id": o["_id"]}
            event = self._head(entry, "insert", document_key=key, uuid=uuid)
            event["fullDocument"] = o
            event["ns"] = ns
            event["documentKey"] = key
            return event
        if op == "d":
            event = self._head(entry, "delete", document_key=o, uuid=uuid)
            self._pre_image_id(event, entry, uuid)
            event["ns"] = ns
            event["documentKey"] = o
            return event
        key = entry["o2"]
        version, is_replacement = _update_shape(o)
        if is_replacement:
            event = self._head(entry, "replace", document_key=key, uuid=uuid)
            event["fullDocument"] = o
            self._pre_image_id(event, entry, uuid)
            event["ns"] = ns
            event["documentKey"] = key
            return event
        event = self._head(entry, "update", document_key=key, uuid=uuid)
        if self.post_image_slot:
            event["fullDocument"] = MISSING  # filled by add_post_image, at this position
        self._pre_image_id(event, entry, uuid, update=True)
        event["ns"] = ns
        event["documentKey"] = key
        if version == 2:
            if self.raw_updates:
                event["rawUpdateDescription"] = o
            else:
                event["updateDescription"] = update_description(o["diff"], self.expanded)
            if self.want_post_image:
                event[RAW_OPLOG_UPDATE_SPEC] = o
        elif version in (None, 1) and any(k.startswith("$") and k != "$v" for k in o):
            event["updateDescription"] = legacy_update_description(o)
        else:
            raise MongoError(
                6741200, f"Unsupported or missing oplog version, $v: {value_string(version)}"
            )
        return event

    def _pre_image_id(
        self, event: dict[str, Any], entry: Entry, uuid: bytes | None, update: bool = False
    ) -> None:
        """`{nsUUID, ts, applyOpsIndex}`: the `_id` of the pre-image in config.system.preimages
        (inside a transaction: the applyOps entry holding the op, and the op's index in it)."""
        if self.want_pre_image or (update and self.want_post_image):
            event[PRE_IMAGE_ID] = {
                "nsUUID": uuid,
                "ts": entry.get("applyOpsTs", entry["ts"]),
                "applyOpsIndex": bson.Int64(entry.get("applyOpsIndex", 0)),
            }

    def _view_event(self, entry: Entry, db: str) -> dict[str, Any] | None:
        """Writes to `<db>.system.views` are view DDL (only reach here with expanded events)."""
        op = entry["op"]
        o = entry["o"]
        if op == "d":
            view_ns = o["_id"]
            operation_type, description = "drop", None
        else:
            view_ns = o["_id"]
            operation_type = "create" if op == "i" else "modify"
            description = _without(o, "_id")
        vdb, vcoll = split_ns(view_ns)
        event = self._head(
            entry, operation_type, operation_description=description,
            uuid=entry.get("ui"), show_uuid=False,
        )
        event["ns"] = {"db": vdb, "coll": vcoll}
        if description is not None:
            if self.expanded:
                event["operationDescription"] = description
            if operation_type == "create":
                view_on = str(description.get("viewOn", ""))
                event["nsType"] = "timeseries" if view_on.startswith("system.buckets.") else "view"
        return event

    # -- commands -------------------------------------------------------------------------------

    def _command_event(self, entry: Entry) -> dict[str, Any] | None:
        o = entry["o"]
        name = next(iter(o))
        db, _ = split_ns(entry["ns"])
        uuid = entry.get("ui")
        if name == "drop":
            event = self._head(entry, "drop", uuid=uuid)
            event["ns"] = {"db": db, "coll": o["drop"]}
            return event
        if name == VIEWLESS_TIMESERIES:
            # 9.0's conversion of a time-series collection: the rename of its buckets onto
            # it (upgrade) or back (downgrade), with a rename's fields.
            names = viewless_timeseries_rename(entry["ns"], o)
            if names is None:
                return None
            o = {"renameCollection": names[0], "to": names[1]}
            name = "renameCollection"
        if name == "renameCollection":
            from_db, from_coll = split_ns(o["renameCollection"])
            to_db, to_coll = split_ns(o["to"])
            to = {"db": to_db, "coll": to_coll}
            description = {
                k: (to if k == "to" else v)
                for k, v in o.items()
                if k not in ("renameCollection", "stayTemp")
            }
            event = self._head(
                entry, "rename", operation_description=description, uuid=uuid, first={"to": to}
            )
            event["ns"] = {"db": from_db, "coll": from_coll}
            if self.expanded:
                event["operationDescription"] = description
            return event
        if name == "dropDatabase":
            event = self._head(entry, "dropDatabase")
            event["ns"] = {"db": db}
            return event
        if name == "create":
            description = _without(o, "create")
            event = self._ddl(entry, "create", db, o["create"], description)
            view_on = description.get("viewOn")
            if view_on is not None:
                event["nsType"] = (
                    "timeseries" if str(view_on).startswith("system.buckets.") else "view"
                )
            elif "timeseries" in description and not str(o["create"]).startswith(
                "system.buckets."
            ):  # 9.0's viewless time-series collection
                event["nsType"] = "timeseries"
            elif self.expanded:
                event["nsType"] = "collection"
            return event
        if name == "createIndexes":
            return self._ddl(
                entry, "createIndexes", db, o["createIndexes"],
                {"indexes": [_without(o, "createIndexes")]},
            )
        if name == "commitIndexBuild":
            return self._ddl(
                entry, "createIndexes", db, o["commitIndexBuild"], {"indexes": o["indexes"]}
            )
        if name == "dropIndexes":
            o2 = entry.get("o2") or {}
            return self._ddl(
                entry, "dropIndexes", db, o["dropIndexes"],
                {"indexes": [_without(o2, "dropIndexes")]},
            )
        if name == "collMod":
            o2 = entry.get("o2") or {}
            event = self._ddl(entry, "modify", db, o["collMod"], _without(o, "collMod"))
            before: dict[str, Any] = {}
            if "collectionOptions_old" in o2:
                before["collectionOptions"] = o2["collectionOptions_old"]
            if "indexOptions_old" in o2:
                before["indexOptions"] = o2["indexOptions_old"]
            event["stateBeforeChange"] = before
            return event
        # startIndexBuild / abortIndexBuild and other commands produce no event in 8.0.
        return None

    def _ddl(
        self, entry: Entry, operation_type: str, db: str, coll: str, description: dict[str, Any]
    ) -> dict[str, Any]:
        event = self._head(
            entry, operation_type, operation_description=description, uuid=entry.get("ui")
        )
        event["ns"] = {"db": db, "coll": coll}
        if self.expanded:
            event["operationDescription"] = description
        return event

    # -- sharding no-ops ------------------------------------------------------------------------

    def _no_op_event(self, entry: Entry) -> dict[str, Any] | None:
        o2 = entry.get("o2")
        if o2 is None:
            return None
        name = next((n for n in _NO_OP_EVENTS if n in o2), None)
        if name is None:
            return None
        db, coll = split_ns(entry["ns"])
        description = _without(o2, name)
        first = None
        if name in ("reshardBegin", "reshardDoneCatchUp"):
            first = {"reshardingUUID": o2.get("reshardingUUID")}
        event = self._head(
            entry, name, operation_description=description, uuid=entry.get("ui"), first=first
        )
        event["ns"] = {"db": db, "coll": coll} if coll else {"db": db}
        if self.expanded:
            event["operationDescription"] = description
        return event


def invalidate_event(event: Mapping[str, Any]) -> dict[str, Any]:
    """The `invalidate` that follows an invalidating event: same token with fromInvalidate."""
    data = resume_token.decode(event["_id"])
    data.from_invalidate = True
    out: dict[str, Any] = {
        "_id": data.to_document(),
        "operationType": "invalidate",
        "clusterTime": event["clusterTime"],
    }
    if "wallTime" in event:
        out["wallTime"] = event["wallTime"]
    return out
