"""Time-series collections of the embedded store, as mongod 8.0 keeps them.

A time-series collection `<db>.<coll>` is two catalog objects (create_collection.cpp's
_createTimeseries): the buckets collection `<db>.system.buckets.<coll>` (clustered on `_id`,
with the `timeseries` options and a `$jsonSchema` validator on bucket documents) and a view
`<coll>` on it whose pipeline is `[{$_internalUnpackBucket: ...}]`. Reads go through the view
(find, aggregate, count, distinct see the measurements unpacked); inserts into `<coll>` go into
buckets: a new bucket is an insert into the buckets collection, a measurement added to an open
bucket an update of it (a `$v: 2` delta), as the bucket catalog writes them.

This module holds the pure parts (options parsing and validation, the bucket documents, the
deltas, unpacking) and the `$_internalUnpackBucket` stage; the catalog (catalog.py) and the
DDL commands (commands/ddl.py) call it.

Approximation: mongod 8.0 writes compressed buckets (`control.version: 2`, BSONColumn
binary data); this store writes uncompressed ones (`control.version: 1`, `data.<field>` an
object keyed "0", "1", ...), which mongod also reads, and one bucket write per measurement
(mongod writes one per bucket per insert command).
"""

from __future__ import annotations

import datetime
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import bson
from bson.int64 import Int64
from bson.objectid import ObjectId

from cdcserver.embedded.store_types import Collection, id_key
from pipeline_stages import bson_bytes, keystring, query_engine
from pipeline_stages.errors import MongoError
from pipeline_stages.value_string import type_name

if TYPE_CHECKING:
    from cdcserver.embedded.sessions import OpSession
    from cdcserver.embedded.state import StoreState

BUCKETS_PREFIX = "system.buckets."
UNPACK_STAGE = "$_internalUnpackBucket"
# 9.0's oplog command converting a time-series collection to or from its viewless form
VIEWLESS_COMMAND = "upgradeDowngradeViewlessTimeseries"
# timeseriesBucketMaxCount / timeseriesBucketMaxSize (timeseries.idl defaults)
BUCKET_MAX_COUNT = 1000
BUCKET_MAX_SIZE = 128000
# TimeseriesOptions' fields in IDL order (how the options serialize)
_OPTION_FIELDS = ("timeField", "metaField", "granularity", "bucketRoundingSeconds",
                  "bucketMaxSpanSeconds")
_GRANULARITY_SPAN = {"seconds": 60 * 60, "minutes": 60 * 60 * 24, "hours": 60 * 60 * 24 * 30}
_GRANULARITY_ROUNDING = {"seconds": 60, "minutes": 60 * 60, "hours": 60 * 60 * 24}
# timeseries::kAllowedCollectionCreationOptions: the options a time-series create may carry
# (and that listCollections shows for it)
ALLOWED_CREATE_OPTIONS = ("storageEngine", "indexOptionDefaults", "collation", "timeseries",
                          "expireAfterSeconds", "temp")


def buckets_name(coll: str) -> str:
    return BUCKETS_PREFIX + coll


def is_buckets(coll: str) -> bool:
    return coll.startswith(BUCKETS_PREFIX)


def is_viewless(c: Collection) -> bool:
    """Whether `c` is a viewless time-series collection (9.0's form after an FCV upgrade):
    time-series options on a collection not named `system.buckets.*`, no view in front."""
    return "timeseries" in c.options and not is_buckets(c.name)


def is_timeseries_view(view: Mapping[str, Any] | None) -> bool:
    """Whether a `system.views` document is a time-series collection's view."""
    return view is not None and str(view.get("viewOn", "")).startswith(BUCKETS_PREFIX)


# ---------------------------------------------------------------------------------------------
# Options (timeseries.idl's TimeseriesOptions, create_command.cpp, timeseries_options.cpp)


def _safe_int(value: Any, field: str, command: str = "create") -> int:
    """An IDL `safeInt` field: a number (int, long, double, decimal) taken as an int, >= 1."""
    if isinstance(value, bool) or not isinstance(value, (int, float, bson.decimal128.Decimal128)):
        raise MongoError(14, f"BSON field '{command}.timeseries.{field}' is the wrong type "
                         f"'{type_name(value)}', expected types '[long, int, decimal, double]'")
    number = int(value.to_decimal()) if isinstance(value, bson.decimal128.Decimal128) else int(
        value)
    if number < 1:
        raise MongoError(51024, f"BSON field '{field}' value must be >= 1, actual value "
                         f"'{number}'")
    return number


def parse_options(value: Any) -> dict[str, Any]:
    """The `timeseries` option as mongod's IDL parser takes it (strict: unknown fields, types,
    the required timeField), its fields in IDL order."""
    if not isinstance(value, Mapping):
        raise MongoError(14, "BSON field 'create.timeseries' is the wrong type "
                         f"'{type_name(value)}', expected type 'object'")
    for k in value:
        if k not in _OPTION_FIELDS:
            raise MongoError(40415, f"BSON field 'create.timeseries.{k}' is an unknown field.")
    out: dict[str, Any] = {}
    for k in ("timeField", "metaField"):
        if k in value:
            if not isinstance(value[k], str):
                raise MongoError(14, f"BSON field 'create.timeseries.{k}' is the wrong type "
                                 f"'{type_name(value[k])}', expected type 'string'")
            out[k] = value[k]
    if "granularity" in value:
        granularity = value["granularity"]
        if not isinstance(granularity, str):
            raise MongoError(14, "BSON field 'create.timeseries.granularity' is the wrong type "
                             f"'{type_name(granularity)}', expected type 'string'")
        if granularity not in _GRANULARITY_SPAN:
            raise MongoError(2, f"Enumeration value '{granularity}' for field "
                             "'create.timeseries.granularity' is not a valid value.")
        out["granularity"] = granularity
    for k in ("bucketRoundingSeconds", "bucketMaxSpanSeconds"):
        if k in value:
            out[k] = _safe_int(value[k], k)
    if "timeField" not in out:
        raise MongoError(40414, "BSON field 'create.timeseries.timeField' is missing but a "
                         "required field")
    return {k: out[k] for k in _OPTION_FIELDS if k in out}


def check_create(ns: str, cmd: Mapping[str, Any], options: Mapping[str, Any],
                 generic: set[str]) -> None:
    """create_command.cpp's checks of a time-series create: the other options it allows, and
    the time and meta field names."""
    for k, v in cmd.items():
        if k == "create" or k in generic or k == "timeseries":
            continue
        if k == "capped" and v is False:
            continue
        if k in ("validator", "clusteredIndex") and is_buckets(ns.partition(".")[2]):
            continue  # restoring a buckets collection
        if k not in ALLOWED_CREATE_OPTIONS:
            raise MongoError(72, f"{ns}: 'timeseries' is not allowed with '{k}'")

    def top_level(field: str) -> str:
        return f"{ns}: '{field}' must be a top-level field and not contain a '.'"

    if "." in options["timeField"]:
        raise MongoError(72, top_level("timeField"))
    meta = options.get("metaField")
    if meta is not None:
        if meta == "_id":
            raise MongoError(72, "'metaField' cannot be \"_id\"")
        if meta == options["timeField"]:
            raise MongoError(72, "'metaField' cannot be the same as 'timeField'")
        if "." in meta:
            raise MongoError(72, top_level("metaField"))


def set_bucketing(options: dict[str, Any]) -> dict[str, Any]:
    """validateAndSetBucketingParameters: a granularity, or bucketRoundingSeconds and
    bucketMaxSpanSeconds together and equal; the defaults filled in (granularity "seconds",
    its bucketMaxSpanSeconds). 72 InvalidOptions otherwise."""
    granularity = options.get("granularity")
    rounding = options.get("bucketRoundingSeconds")
    span = options.get("bucketMaxSpanSeconds")
    default_span = _GRANULARITY_SPAN[granularity or "seconds"]
    out = dict(options)
    if granularity is not None:
        if span is not None and span != default_span:
            raise MongoError(72, "Timeseries 'bucketMaxSpanSeconds' is not configurable to a "
                             f"value other than the default of {default_span} for the "
                             "provided granularity")
        if rounding is not None:
            raise MongoError(72, "Timeseries 'bucketRoundingSeconds' is not configurable "
                             "alongside the granularity parameter")
        out["bucketMaxSpanSeconds"] = default_span
    elif span is not None or rounding is not None:
        if span != rounding:
            raise MongoError(72, "Timeseries 'bucketRoundingSeconds' needs to be equal to "
                             "'bucketMaxSpanSeconds'")
    else:
        out["granularity"] = "seconds"
        out["bucketMaxSpanSeconds"] = default_span
    return {k: out[k] for k in _OPTION_FIELDS if k in out}


def same_options(a: Mapping[str, Any], b: Mapping[str, Any]) -> bool:
    """timeseries::optionsAreEqual (an unset granularity is "seconds")."""
    def normal(o: Mapping[str, Any]) -> tuple[Any, ...]:
        granularity = o.get("granularity") or "seconds"
        return (o.get("timeField"), o.get("metaField"), granularity,
                o.get("bucketMaxSpanSeconds", _GRANULARITY_SPAN[granularity]),
                o.get("bucketRoundingSeconds", _GRANULARITY_ROUNDING[granularity]))

    return normal(a) == normal(b)


def parse_coll_mod(value: Any) -> dict[str, Any]:
    """collMod's `timeseries` (CollModTimeseries: granularity, bucketMaxSpanSeconds,
    bucketRoundingSeconds; strict)."""
    if not isinstance(value, Mapping):
        raise MongoError(14, "BSON field 'collMod.timeseries' is the wrong type "
                         f"'{type_name(value)}', expected type 'object'")
    out: dict[str, Any] = {}
    for k, v in value.items():
        if k == "granularity":
            if not isinstance(v, str):
                raise MongoError(14, "BSON field 'collMod.timeseries.granularity' is the wrong "
                                 f"type '{type_name(v)}', expected type 'string'")
            if v not in _GRANULARITY_SPAN:
                raise MongoError(2, f"Enumeration value '{v}' for field "
                                 "'collMod.timeseries.granularity' is not a valid value.")
            out[k] = v
        elif k in ("bucketMaxSpanSeconds", "bucketRoundingSeconds"):
            out[k] = _safe_int(v, k, "collMod")
        else:
            raise MongoError(40415, f"BSON field 'collMod.timeseries.{k}' is an unknown field.")
    return out


def apply_coll_mod(current: Mapping[str, Any],
                   mod: Mapping[str, Any]) -> tuple[dict[str, Any], bool]:
    """(the options after collMod's `timeseries`, whether they changed):
    isTimeseriesGranularityValidAndUnchanged's checks (granularity only from seconds to
    minutes or hours and from minutes to hours; custom bucketing given whole, equal, and never
    smaller), then applyTimeseriesOptionsModifications."""
    target = mod.get("granularity")
    span, rounding = mod.get("bucketMaxSpanSeconds"), mod.get("bucketRoundingSeconds")
    if target is None and span is None and rounding is None:
        return dict(current), False
    granularity = current.get("granularity")
    if target is not None:
        if span is not None and span != _GRANULARITY_SPAN[target]:
            raise MongoError(72, "Timeseries 'bucketMaxSpanSeconds' is not configurable to a "
                             "value other than the default for the provided granularity")
        if rounding is not None:
            raise MongoError(72, "Timeseries 'bucketRoundingSeconds' is not configurable "
                             "alongside the granularity parameter")
        if granularity is not None:
            if granularity == target:
                return dict(current), False
            if granularity == "hours" or (granularity == "minutes" and target != "hours"):
                raise MongoError(72, "Invalid transition for timeseries.granularity. Can only "
                                 "transition from 'seconds' to 'minutes' or 'minutes' to "
                                 "'hours'.")
        new_span, new_rounding = _GRANULARITY_SPAN[target], _GRANULARITY_ROUNDING[target]
    else:
        if span is None or rounding is None:
            raise MongoError(72, "Timeseries 'bucketMaxSpanSeconds' and "
                             "'bucketRoundingSeconds' need to be set alongside each other")
        if span != rounding:
            raise MongoError(72, "Timeseries 'bucketRoundingSeconds' needs to be equal to "
                             "'bucketMaxSpanSeconds'")
        new_span, new_rounding = span, rounding
    old_span = max_span_seconds(current)
    old_rounding = int(current.get("bucketRoundingSeconds")
                       or _GRANULARITY_ROUNDING[granularity or "seconds"])
    if old_span == new_span and old_rounding == new_rounding:
        return dict(current), False
    if old_span > new_span:
        raise MongoError(72, "Timeseries 'bucketMaxSpanSeconds' needs to be equal or greater "
                         "to transition")
    if old_rounding > new_rounding:
        raise MongoError(72, "Timeseries 'bucketRoundingSeconds' needs to be equal or greater "
                         "to transition")
    out = {k: v for k, v in current.items()
           if k not in ("granularity", "bucketRoundingSeconds", "bucketMaxSpanSeconds")}
    if target is not None:
        out["granularity"] = target
    else:
        out["bucketRoundingSeconds"] = rounding
    out["bucketMaxSpanSeconds"] = new_span
    return {k: out[k] for k in _OPTION_FIELDS if k in out}, True


def rounding_seconds(options: Mapping[str, Any]) -> int:
    granularity = options.get("granularity")
    if granularity is not None:
        return _GRANULARITY_ROUNDING[granularity]
    return int(options.get("bucketRoundingSeconds") or _GRANULARITY_ROUNDING["seconds"])


def max_span_seconds(options: Mapping[str, Any]) -> int:
    granularity = options.get("granularity") or "seconds"
    return int(options.get("bucketMaxSpanSeconds") or _GRANULARITY_SPAN[granularity])


def bucket_validator(time_field: str) -> dict[str, Any]:
    """generateTimeseriesValidator for the latest bucket version (2, mongod 8.0's): the
    structure of a bucket document (a version 1 bucket passes it too)."""
    bound = {"bsonType": "object", "required": [time_field],
             "properties": {time_field: {"bsonType": "date"}}}
    return {"$jsonSchema": {
        "bsonType": "object",
        "required": ["_id", "control", "data"],
        "properties": {
            "_id": {"bsonType": "objectId"},
            "control": {
                "bsonType": "object",
                "required": ["version", "min", "max"],
                "properties": {
                    "version": {"bsonType": "number"},
                    "min": bound,
                    "max": dict(bound),
                    "closed": {"bsonType": "bool"},
                    "count": {"bsonType": "number", "minimum": 1},
                },
                "additionalProperties": False,
            },
            "data": {"bsonType": "object"},
            "meta": {},
        },
        "additionalProperties": False,
    }}


def view_pipeline(options: Mapping[str, Any]) -> list[dict[str, Any]]:
    """timeseries::generateViewPipeline."""
    spec: dict[str, Any] = {"timeField": options["timeField"]}
    if "metaField" in options:
        spec["metaField"] = options["metaField"]
    spec["bucketMaxSpanSeconds"] = max_span_seconds(options)
    return [{UNPACK_STAGE: spec}]


def default_index_spec(options: Mapping[str, Any],
                       collation: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """createDefaultTimeseriesIndex: with a metaField, the buckets' index on the meta and the
    time bounds (`{meta: 1, control.min.t: 1, control.max.t: 1}`, named "<meta>_1_<time>_1"),
    in the collection's collation; none without a metaField."""
    meta = options.get("metaField")
    if meta is None:
        return None
    time = options["timeField"]
    spec: dict[str, Any] = {
        "v": 2,
        "key": {"meta": 1, f"control.min.{time}": 1, f"control.max.{time}": 1},
        "name": f"{meta}_1_{time}_1",
    }
    if collation:
        spec["collation"] = dict(collation)
    return spec


def user_index_spec(spec: Mapping[str, Any], options: Mapping[str, Any]) -> dict[str, Any] | None:
    """A buckets index as listIndexes on the time-series collection shows it (the meta and time
    fields back under their own names), or None when it is not one the view can show."""
    meta, time = options.get("metaField"), options["timeField"]
    key: dict[str, Any] = {}
    fields = list(spec["key"].items())
    i = 0
    while i < len(fields):
        path, direction = fields[i]
        if meta is not None and (path == "meta" or path.startswith("meta.")):
            key[meta + path[4:]] = direction
            i += 1
        elif path == f"control.min.{time}" and i + 1 < len(fields) and (
            fields[i + 1][0] == f"control.max.{time}"
        ):
            key[time] = direction
            i += 2
        elif path == f"control.max.{time}" and i + 1 < len(fields) and (
            fields[i + 1][0] == f"control.min.{time}"
        ):
            key[time] = -1 if direction == 1 else direction
            i += 2
        else:
            return None
    if not key:
        return None
    return {k: (key if k == "key" else v) for k, v in spec.items()}  # the key in its place


def listing_options(options: Mapping[str, Any], order: tuple[str, ...]) -> dict[str, Any]:
    """The buckets collection's options as listCollections shows them for the time-series
    collection (toBSON with kAllowedCollectionCreationOptions)."""
    return {k: options[k] for k in order if k in options and k in ALLOWED_CREATE_OPTIONS}


# ---------------------------------------------------------------------------------------------
# Buckets (the bucket catalog, version 1 uncompressed buckets)


@dataclass
class TimeseriesView(Collection):
    """What `ensure_collection` gives for a time-series collection: an insert into it adds a
    measurement to the buckets collection `buckets` (WritesMixin.insert_document)."""

    buckets: Collection | None = None


def normalize_meta(value: Any) -> Any:
    """The meta value as the bucket catalog stores it (metadata::normalize): the fields of
    its objects sorted by name, at every depth."""
    if isinstance(value, Mapping):
        return {k: normalize_meta(value[k]) for k in sorted(value)}
    if isinstance(value, list):
        return [normalize_meta(v) for v in value]
    return value


def _order_key(value: Any) -> bytes:
    return keystring.encode_values((value,))[0]


def _min(a: Any, b: Any) -> Any:
    return b if _order_key(b) < _order_key(a) else a


def _max(a: Any, b: Any) -> Any:
    return b if _order_key(b) > _order_key(a) else a


def round_time(time: datetime.datetime, seconds: int) -> datetime.datetime:
    """roundTimestampBySeconds: down to a multiple of `seconds` (towards the past, also
    before 1970)."""
    epoch = datetime.datetime(1970, 1, 1)
    ms = (time.replace(tzinfo=None) - epoch) // datetime.timedelta(milliseconds=1)
    step = seconds * 1000
    return epoch + datetime.timedelta(milliseconds=ms - ms % step)


def _bucket_id(rounded: datetime.datetime) -> ObjectId:
    """A bucket's _id: an ObjectId whose timestamp is the bucket's rounded time."""
    seconds = int((rounded - datetime.datetime(1970, 1, 1)).total_seconds())
    tail = ObjectId().binary[4:]
    return ObjectId((seconds & 0xFFFFFFFF).to_bytes(4, "big") + tail)


def measurement_time(doc: Mapping[str, Any], time_field: str) -> datetime.datetime:
    """The measurement's time; 2 BadValue when it is missing or not a date."""
    value = doc.get(time_field)
    if not isinstance(value, datetime.datetime):
        raise MongoError(2, f"'{time_field}' must be present and contain a valid BSON UTC "
                         "datetime value")
    return value


def new_bucket(doc: Mapping[str, Any], options: Mapping[str, Any]) -> dict[str, Any]:
    """A version 1 bucket holding the one measurement `doc`: control.min (the time rounded
    down) and control.max, the meta value (normalized), data.<field>: {"0": value}."""
    time_field, meta_field = options["timeField"], options.get("metaField")
    rounded = round_time(measurement_time(doc, time_field), rounding_seconds(options))
    fields = {k: v for k, v in doc.items() if k != meta_field}
    low = {k: (rounded if k == time_field else v) for k, v in fields.items()}
    bucket: dict[str, Any] = {
        "_id": _bucket_id(rounded),
        "control": {"version": 1, "min": low, "max": dict(fields)},
    }
    if meta_field is not None and meta_field in doc:
        bucket["meta"] = normalize_meta(doc[meta_field])
    bucket["data"] = {k: {"0": v} for k, v in fields.items()}
    return bucket


def bucket_count(bucket: Mapping[str, Any], options: Mapping[str, Any]) -> int | None:
    """The number of measurements of a version 1 bucket (its time column's), or None for a
    bucket this store does not add to (another version, or not a bucket)."""
    control, data = bucket.get("control"), bucket.get("data")
    if not isinstance(control, Mapping) or control.get("version") != 1:
        return None
    times = data.get(options["timeField"]) if isinstance(data, Mapping) else None
    low = control.get("min")
    if not isinstance(times, Mapping) or not isinstance(low, Mapping) or not isinstance(
        low.get(options["timeField"]), datetime.datetime
    ):
        return None
    return len(times)


def fits(bucket: Mapping[str, Any], doc: Mapping[str, Any], options: Mapping[str, Any],
         count: int, size: int) -> bool:
    """Whether `doc` goes into the open `bucket` (of `count` measurements, `size` bytes): the
    same time window (the bucket's rounded min time up to bucketMaxSpanSeconds later), room
    for one more measurement, and within the size limit."""
    time = measurement_time(doc, options["timeField"])
    low = bucket["control"]["min"][options["timeField"]]
    span = datetime.timedelta(seconds=max_span_seconds(options))
    if not (low <= time.replace(tzinfo=None) < low + span):
        return False
    if count >= BUCKET_MAX_COUNT:
        return False
    return size + len(bson_bytes.encode(dict(doc))) <= BUCKET_MAX_SIZE


def add_measurement(bucket: Mapping[str, Any], doc: Mapping[str, Any],
                    options: Mapping[str, Any], index: int,
                    ) -> tuple[dict[str, Any], dict[str, Any]]:
    """(the bucket with `doc` added as measurement `index`, the `$v: 2` delta of that
    update as mongod's makeTimeseriesUpdateOpEntry writes it: `scontrol` with the changes to
    control.min / control.max, `sdata` with the new values, new fields under `i`)."""
    meta_field = options.get("metaField")
    key = str(index)
    control = bucket["control"]
    low, high = dict(control["min"]), dict(control["max"])
    control_diff: dict[str, Any] = {}
    for name, bound, pick in (("min", low, _min), ("max", high, _max)):
        updated: dict[str, Any] = {}
        inserted: dict[str, Any] = {}
        for k, v in doc.items():
            if k == meta_field:
                continue
            if k not in bound:
                bound[k] = inserted[k] = v
                continue
            best = pick(bound[k], v)
            if best is not bound[k]:
                bound[k] = updated[k] = best
        section: dict[str, Any] = {}
        if updated:
            section["u"] = updated
        if inserted:
            section["i"] = inserted
        if section:
            control_diff["s" + name] = section
    data = {k: dict(v) for k, v in bucket["data"].items()}
    new_fields: dict[str, Any] = {}
    data_diff: dict[str, Any] = {}
    for k, v in doc.items():
        if k == meta_field:
            continue
        if k in data:
            data[k][key] = v
            data_diff["s" + k] = {"i": {key: v}}
        else:
            data[k] = {key: v}
            new_fields[k] = {key: v}
    post = {**bucket, "control": {**control, "min": low, "max": high}, "data": data}
    diff: dict[str, Any] = {}
    if control_diff:
        diff["scontrol"] = control_diff
    diff["sdata"] = {**({"i": new_fields} if new_fields else {}), **data_diff}
    return post, diff


def meta_key(doc: Mapping[str, Any], options: Mapping[str, Any]) -> bytes:
    """The key of the series `doc` belongs to (its normalized meta value, or none)."""
    meta_field = options.get("metaField")
    if meta_field is None or meta_field not in doc:
        return b""
    return bson_bytes.encode({"m": normalize_meta(doc[meta_field])})


# Open buckets: buckets collection uuid -> series key -> (bucket _id, measurements, size).
# An open bucket the collection no longer has (dropped, deleted) is forgotten when found.
_open: dict[bytes, dict[bytes, tuple[Any, int, int]]] = {}


def open_bucket(buckets_uuid: bytes, series: bytes) -> tuple[Any, int, int] | None:
    return _open.get(buckets_uuid, {}).get(series)


def set_open_bucket(buckets_uuid: bytes, series: bytes, bucket_id: Any, count: int,
                    size: int) -> None:
    _open.setdefault(buckets_uuid, {})[series] = (bucket_id, count, size)


def forget(buckets_uuid: bytes) -> None:
    _open.pop(buckets_uuid, None)


def insert_measurement(
    store: StoreState, view: TimeseriesView, doc: dict[str, Any],
    session: OpSession | None = None, stmt_id: int | None = None,
) -> None:
    """One measurement into a time-series collection, as the bucket catalog writes it: added
    to its series' open bucket when it fits there (an update of the bucket, a `$v: 2` delta),
    else a new bucket (an insert into the buckets collection)."""
    if store._txn() is not None:
        raise MongoError(263, "Cannot insert into a time-series collection in a "
                         f"multi-document transaction: {view.ns}")
    buckets = view.buckets
    assert buckets is not None
    options = buckets.options["timeseries"]
    measurement_time(doc, options["timeField"])  # 2 BadValue first
    series = meta_key(doc, options)
    size = len(bson_bytes.encode(doc))
    current = open_bucket(buckets.uuid, series)
    if current is not None:
        bucket_id, _, used = current
        pre = store.documents(buckets).get(id_key(bucket_id))
        # its measurements as the bucket has them (direct writes to it may have changed it)
        count = bucket_count(pre, options) if pre is not None else None
        if pre is not None and count is not None and fits(pre, doc, options, count, used):
            post, delta = add_measurement(pre, doc, options, count)
            store.update_document(buckets, pre, post, kind="delta", update=delta,
                                  session=session, stmt_id=stmt_id)
            set_open_bucket(buckets.uuid, series, bucket_id, count + 1, used + size)
            return
    bucket = new_bucket(doc, options)
    store.insert_document(buckets, bucket, session, stmt_id)
    set_open_bucket(buckets.uuid, series, bucket["_id"], 1, size)


# ---------------------------------------------------------------------------------------------
# $_internalUnpackBucket


def unpack(bucket: Mapping[str, Any], spec: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The measurements of one version 1 bucket, as BucketUnpacker gives them: the time field
    first, then the meta field (when the bucket has one), then the other fields in the bucket's
    column order; `include` / `exclude` select fields."""
    time_field = spec.get("timeField")
    meta_field = spec.get("metaField")
    data = bucket.get("data")
    if not isinstance(data, Mapping) or not isinstance(time_field, str):
        return []
    times = data.get(time_field)
    if not isinstance(times, Mapping):
        return []
    include = spec.get("include")
    exclude = spec.get("exclude")
    wanted: Callable[[str], bool]
    if isinstance(include, list):
        chosen = set(include)

        def wanted(name: str) -> bool:
            return name in chosen
    elif isinstance(exclude, list):
        dropped = set(exclude)

        def wanted(name: str) -> bool:
            return name not in dropped
    else:
        def wanted(name: str) -> bool:
            return True

    has_meta = isinstance(meta_field, str) and "meta" in bucket and wanted(meta_field)
    columns = [(k, v) for k, v in data.items()
               if k != time_field and isinstance(v, Mapping) and wanted(k)]
    out: list[dict[str, Any]] = []
    for index, time in times.items():
        doc: dict[str, Any] = {}
        if wanted(time_field):
            doc[time_field] = time
        if has_meta:
            assert isinstance(meta_field, str)
            doc[meta_field] = bucket["meta"]
        for name, column in columns:
            if index in column:
                doc[name] = column[index]
        out.append(doc)
    return out


def _unpack_stage(docs: list[Any], database: Any, spec: Any,
                  engine_handler: Callable[..., Any]) -> list[Any]:
    if not isinstance(spec, Mapping):
        raise MongoError(5346500, "$_internalUnpackBucket specification must be an object, "
                         f"got: {type_name(spec)}")
    # A clustered collection reads in _id order: buckets by their rounded time.
    ordered = sorted(docs, key=lambda d: _order_key(d.get("_id")))
    out: list[Any] = []
    for bucket in ordered:
        out.extend(unpack(bucket, spec))
    return out


query_engine.set_stage_handler(UNPACK_STAGE, _unpack_stage)


def expire_after_seconds(value: Any) -> Any:
    """expireAfterSeconds as CollectionOptions keeps it (a long)."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return Int64(value)
    return value
