"""The row of one change event, as `spark-replay` writes it and the streaming source reads it.

| column | type | what |
|---|---|---|
| `_id` | string | the resume token's `_data` (hex; sorts as mongos merges) |
| `clusterTime` | struct<t, i: bigint> | the event's (from the token if a stage removed it) |
| `operationType` | string | |
| `db`, `coll` | string | `ns.db`, `ns.coll` (null when absent) |
| `documentKey` | string | canonical Extended JSON, null when absent |
| `event` | binary | the whole event as BSON, byte for byte what a driver receives |
| `eventJson` | string | the whole event as canonical Extended JSON: a `cdcserver replay` line |
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from bson import json_util
from bson.codec_options import CodecOptions
from bson.raw_bson import RawBSONDocument
from bson.timestamp import Timestamp

from pipeline_stages import bson_bytes, resume_token

if TYPE_CHECKING:
    from pyspark.sql.types import StructType

CANONICAL = json_util.JSONOptions(json_mode=json_util.JSONMode.CANONICAL)
# What a RawBSONDocument inflates with (pymongo's DEFAULT_RAW_BSON_OPTIONS), as plain dicts.
_DECODE: CodecOptions[dict[str, Any]] = bson_bytes.codec_options(document_class=dict)

COLUMNS = (
    "_id", "clusterTime", "operationType", "db", "coll", "documentKey", "event", "eventJson",
)

SCHEMA_DDL = (
    "_id string, clusterTime struct<t: bigint, i: bigint>, operationType string, db string, "
    "coll string, documentKey string, event binary, eventJson string"
)


def spark_schema() -> StructType:
    """The schema as a `pyspark.sql.types.StructType`."""
    from pyspark.sql.types import (
        BinaryType,
        LongType,
        StringType,
        StructField,
        StructType,
    )

    return StructType(
        [
            StructField("_id", StringType(), False),
            StructField(
                "clusterTime",
                StructType([StructField("t", LongType()), StructField("i", LongType())]),
                True,
            ),
            StructField("operationType", StringType(), True),
            StructField("db", StringType(), True),
            StructField("coll", StringType(), True),
            StructField("documentKey", StringType(), True),
            StructField("event", BinaryType(), False),
            StructField("eventJson", StringType(), False),
        ]
    )


def arrow_schema(fmt: str = "parquet") -> Any:  # a pyarrow.Schema (pyarrow is untyped)
    """The pyarrow schema of the rows (`fmt="jsonl"`: the one column `eventJson`)."""
    import pyarrow as pa

    if fmt == "jsonl":
        return pa.schema([pa.field("eventJson", pa.string(), False)])
    return pa.schema([
        pa.field("_id", pa.string(), False),
        pa.field("clusterTime", pa.struct([("t", pa.int64()), ("i", pa.int64())])),
        pa.field("operationType", pa.string()),
        pa.field("db", pa.string()),
        pa.field("coll", pa.string()),
        pa.field("documentKey", pa.string()),
        pa.field("event", pa.binary(), False),
        pa.field("eventJson", pa.string(), False),
    ])


def _convert(obj: Any) -> Any:
    """`json_util._json_convert` in canonical mode, with the common types first (the same
    output: everything else goes through `json_util.default`, as there)."""
    kind = type(obj)
    if kind is dict:
        return {k: _convert(v) for k, v in obj.items()}
    if kind is str or kind is bool or obj is None:
        return obj
    if kind is list:
        return [_convert(v) for v in obj]
    if hasattr(obj, "items"):
        return {k: _convert(v) for k, v in obj.items()}
    try:
        return json_util.default(obj, CANONICAL)
    except TypeError:
        return obj


def canonical_json(doc: Any) -> str:
    """`json_util.dumps(doc, json_options=CANONICAL)` of a decoded document."""
    return json.dumps(_convert(doc))


def event_row(event: RawBSONDocument) -> tuple[Any, ...]:
    """The row of one event (a `RawBSONDocument`, as the pipeline and pymongo give them)."""
    raw = event.raw
    doc = bson_bytes.decode(raw, _DECODE)
    token = doc["_id"]
    ts = doc.get("clusterTime")
    if not isinstance(ts, Timestamp):
        ts = resume_token.decode(token).cluster_time
    op = doc.get("operationType")
    ns = doc.get("ns")
    db = coll = None
    if isinstance(ns, Mapping):
        db, coll = ns.get("db"), ns.get("coll")
    key = doc.get("documentKey")
    return (
        token["_data"],
        {"t": ts.time, "i": ts.inc},
        op if isinstance(op, str) else None,
        db if isinstance(db, str) else None,
        coll if isinstance(coll, str) else None,
        None if key is None else canonical_json(key),
        raw,
        canonical_json(doc),
    )


def event_line(event: RawBSONDocument) -> str:
    """The event as canonical Extended JSON: the `eventJson` column, a `cdcserver replay` line."""
    return canonical_json(bson_bytes.decode(event.raw, _DECODE))
