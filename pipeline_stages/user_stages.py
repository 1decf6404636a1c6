"""The user's stages after `$changeStream`: `$match`, `$project`, `$addFields`/`$set`, `$unset`,
`$replaceRoot`/`$replaceWith`, `$redact` (reference oplog_to_events.md §9.1).

Query and expression semantics are not written here: the engine is the query engine
(`query_engine.py`, mongomock behind one adapter: its filter matcher for `$match`, its
aggregation for projections and expressions). This module only

- validates each stage's argument when the stream is opened, with mongod's codes and messages
  for the common mistakes (a wrong argument type, an empty or mixed projection, bad field
  paths, malformed `$and`/`$or`/`$nor`, unknown query operators);
- desugars the stages mongod itself desugars (`$unset` is an exclusion `$project`,
  `$replaceWith` is `$replaceRoot`) and normalises specs to the one shape mongomock reads
  (nested sub-projections as dotted paths, numbers/bools in `$project` as 1/0);
- walks the document for `$redact` (the traversal is the stage; the expression is mongomock's)
  and checks `$replaceRoot`'s result is an object;
- converts values: events may hold `RawBSONDocument`s and `MISSING` slots; a batch is decoded
  once (with `Decimal128` as `decimal.Decimal` and documents as order-sensitive `OrderedDict`s,
  which is what BSON equality is) only when there are stages, and re-encoded once at the end;
- checks the result's `_id` against the event's resume token (280, `plan_executor_pipeline.cpp`).

`match_prefilter` derives, from a leading `$match`, a cheap conservative test on
(operationType, ns.db, ns.coll) to run before the transform (like mongod's oplog-filter rewrite,
§9.2); the user's `$match` still runs on every event that passes it.
"""

from __future__ import annotations

import copy
import decimal
import re
from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, cast

from bson.codec_options import CodecOptions, DatetimeConversion, TypeCodec, TypeRegistry
from bson.decimal128 import Decimal128
from bson.raw_bson import RawBSONDocument
from pymongo.errors import OperationFailure

from pipeline_stages import bson_bytes, query_engine
from pipeline_stages.collation import Collation, parse_collation
from pipeline_stages.dotted_path import set_document_value
from pipeline_stages.errors import MongoError
from pipeline_stages.oplog_entry import encode_in_order

# The one $regex matcher (RE2 where it means what PCRE does; here the in-process fallback for
# the rest: the embedded store's scans pass a worker-process one, cdcserver/embedded/regex.py).
from pipeline_stages.spec import ALLOWED_USER_STAGES, KNOWN_STAGES
from pipeline_stages.transform import MISSING
from pipeline_stages.value_string import (
    bson_obj_string,
    document_string,
    type_name,
    value_string,
)

__all__ = [
    "ID_MODIFIED_MESSAGE",
    "UserStages",
    "bsonobj_string",
    "check_resume_token",
    "match_prefilter",
]

SPLIT_STAGE = "$changeStreamSplitLargeEvent"

ID_MODIFIED_MESSAGE = (
    "Encountered an event whose _id field, which contains the resume token, was modified by the "
    "pipeline. Modifying the _id field of an event makes it impossible to resume the stream from "
    "that point. Only transformations that retain the unmodified _id field are allowed. "
)

_REDACT_VALUES = {"DESCEND": "descend", "PRUNE": "prune", "KEEP": "keep"}


# -- value conversion ---------------------------------------------------------------------------


class _DecimalCodec(TypeCodec):
    """Decimal128 <-> decimal.Decimal: mongomock compares numbers with Python operators, which
    Decimal128 does not support (it would neither equal 1.5 nor sort)."""

    python_type = decimal.Decimal
    bson_type = Decimal128

    def transform_python(self, value: decimal.Decimal) -> Decimal128:
        return Decimal128(value)

    def transform_bson(self, value: Decimal128) -> decimal.Decimal:
        return value.to_decimal()


# A document as the stages see it: an OrderedDict (order-sensitive ==), typed as a dict.
_Doc = dict[str, Any]

_REGISTRY = TypeRegistry([_DecimalCodec()])
# Documents as OrderedDicts: their == is order-sensitive, as BSON document equality is.
_PLAIN = bson_bytes.codec_options(
    document_class=OrderedDict,
    datetime_conversion=DatetimeConversion.DATETIME_AUTO,
    type_registry=_REGISTRY,
)
_ENCODE: CodecOptions[dict[str, Any]] = bson_bytes.codec_options(type_registry=_REGISTRY)
_RAW = bson_bytes.codec_options(
    document_class=RawBSONDocument, datetime_conversion=DatetimeConversion.DATETIME_AUTO
)


def _without_missing(event: Mapping[str, Any]) -> Mapping[str, Any]:
    if any(v is MISSING for v in event.values()):
        return {k: v for k, v in event.items() if v is not MISSING}
    return event


def _to_plain(event: Mapping[str, Any]) -> _Doc:
    """The event as plain Python values (one C encode + decode)."""
    return bson_bytes.decode(encode_in_order(_without_missing(event)), codec_options=_PLAIN)


def _from_plain(doc: Mapping[str, Any]) -> dict[str, Any]:
    """Back to an event: a dict whose nested documents are RawBSONDocuments."""
    raw = RawBSONDocument(encode_in_order(doc, _ENCODE), codec_options=_RAW)
    return dict(raw.items())


def _to_bson_value(value: Any) -> Any:
    """A single engine value back to BSON types (for error messages)."""
    if value is MISSING:
        return value
    return bson_bytes.decode(bson_bytes.encode({"v": value}, codec_options=_ENCODE))["v"]


def _plain_spec(value: Any) -> Any:
    """A stage argument as plain Python values, the way documents are decoded."""
    return bson_bytes.decode(bson_bytes.encode({"v": value}), codec_options=_PLAIN)["v"]


# -- errors -------------------------------------------------------------------------------------


def _engine_error(exc: BaseException, stage: str) -> MongoError:
    """A mongomock failure as a MongoError."""
    if isinstance(exc, MongoError):
        return exc
    if isinstance(exc, OperationFailure):
        message = str(exc)
        if message.startswith("BadValue "):
            message = message[len("BadValue ") :]
        if message.startswith("unknown top level operator: "):
            message += (
                ". If you have a field name that starts with a '$' symbol, consider using "
                "$getField or $setField."
            )
        code = exc.code
        if code is None:
            code = 2
            unknown = re.fullmatch(r"Unrecognized expression '\$(\w+)'", message)
            if unknown:
                if unknown.group(1) not in EXPRESSION_NAMES:
                    return MongoError(168, message)
                return MongoError(
                    238, f"{stage}: the expression ${unknown.group(1)} is not supported by "
                    "cdcserver's expression engine"
                )
        return MongoError(code, message)
    if isinstance(exc, NotImplementedError):
        # mongod would run it; the expression engine cannot. 238 NotImplemented.
        return MongoError(238, f"{stage} is not supported by cdcserver's expression engine: {exc}")
    return MongoError(2, f"Failed to evaluate {stage}: {type(exc).__name__}: {exc}")


def _element_string(name: str, value: Any) -> str:
    return f"{name}: {bson_obj_string(value)}"


def bsonobj_string(doc: Mapping[str, Any]) -> str:
    """`BSONObj::toString()` as mongod streams a BSONObj into an error message: `{ a: 1 }`."""
    return bson_obj_string(doc)


def _raw_value_equal(a: Any, b: Any) -> bool:
    return bson_bytes.encode({"": a}) == bson_bytes.encode({"": b})


def check_resume_token(event: Mapping[str, Any], token: Mapping[str, Any]) -> None:
    """mongod's `_validateChangeStreamsResumeToken`: the `_id` a client receives must be the
    event's resume token (its sort key), else 280 — also when a stage removed `_id`.

    Compared as BSON bytes (7.0's `binaryEqual`); 8.x compares values, which differs only for
    a token rewritten with numerically equal values of another numeric type."""
    found = event.get("_id", MISSING)
    if found is not MISSING and _raw_value_equal(found, token):
        return
    raise MongoError(
        280,
        ID_MODIFIED_MESSAGE
        + "Expected: "
        + bsonobj_string({"_id": token})
        + " but found: "
        + ("{}" if found is MISSING else bsonobj_string({"_id": _to_bson_value(found)})),
    )


# -- argument validation ------------------------------------------------------------------------

# The aggregation expression operators mongod 8.0 parses (names only; mongomock evaluates them or
# fails with NotImplemented). A name outside this set is 168 InvalidPipelineOperator when the
# stream is opened, as mongod's Expression::parseExpression reports it.
EXPRESSION_NAMES = frozenset(
    """
    abs acos acosh add allElementsTrue and anyElementTrue arrayElemAt arrayToObject asin asinh
    atan atan2 atanh avg binarySize bitAnd bitNot bitOr bitXor bsonSize ceil cmp concat
    concatArrays cond convert cos cosh dateAdd dateDiff dateFromParts dateFromString
    dateSubtract dateToParts dateToString dateTrunc dayOfMonth dayOfWeek dayOfYear
    degreesToRadians divide eq exp filter first firstN floor function getField gt gte hour
    ifNull in indexOfArray indexOfBytes indexOfCP isArray isNumber isoDayOfWeek isoWeek
    isoWeekYear last lastN let literal ln log log10 lt lte ltrim map max maxN median
    mergeObjects meta millisecond min minN minute mod month multiply ne not objectToArray or
    percentile pow radiansToDegrees rand range reduce regexFind regexFindAll regexMatch
    replaceAll replaceOne reverseArray round rtrim sampleRate second setDifference setEquals
    setField setIntersection setIsSubset setUnion sin sinh size slice sortArray split sqrt
    stdDevPop stdDevSamp strLenBytes strLenCP strcasecmp substr substrBytes substrCP subtract
    sum switch tan tanh toBool toDate toDecimal toDouble toHashedIndexKey toInt toLong toLower
    toObjectId toString toUUID toUpper trim trunc tsIncrement tsSecond type unsetField week
    year zip
    """.split()
)


def _check_expression(expression: Any) -> None:
    """Operator names in an aggregation expression must be known (168 otherwise)."""
    if isinstance(expression, list):
        for item in expression:
            _check_expression(item)
    elif isinstance(expression, Mapping):
        if len(expression) == 1 and next(iter(expression)).startswith("$"):
            name, argument = next(iter(expression.items()))
            if name[1:] not in EXPRESSION_NAMES:
                raise MongoError(168, f"Unrecognized expression '{name}'")
            if name != "$literal":
                _check_expression(argument)
        else:
            for value in expression.values():
                _check_expression(value)


def _check_query_expressions(query: Any) -> None:
    """The `$expr` parts of a query."""
    if not isinstance(query, Mapping):
        return
    for key, value in query.items():
        if key == "$expr":
            _check_expression(value)
        elif key in ("$and", "$or", "$nor") and isinstance(value, list):
            for sub in value:
                _check_query_expressions(sub)



def _check_field_path(path: str) -> None:
    """FieldPath's constructor checks (field_path.cpp)."""
    if not path:
        raise MongoError(40352, "FieldPath cannot be constructed with empty string")
    if path.endswith("."):
        raise MongoError(40353, "FieldPath must not end with a '.'.")
    for name in path.split("."):
        if not name:
            raise MongoError(15998, "FieldPath field names may not be empty strings.")
        if name.startswith("$"):
            raise MongoError(
                16410,
                "FieldPath field names may not start with '$'. Consider using $getField or "
                "$setField.",
            )


def _is_expression_object(value: Any) -> bool:
    return isinstance(value, Mapping) and len(value) == 1 and next(iter(value)).startswith("$")


def _is_flag(value: Any) -> bool:
    return isinstance(value, (bool, int, float, decimal.Decimal))


class _PathTree:
    """projection_ast's path tree, for its path-collision errors (31249, 31250)."""

    def __init__(self) -> None:
        self.children: dict[str, _PathTree | None] = {}

    def add(self, path: str, leaf: bool) -> _PathTree | None:
        parts = path.split(".")
        node = self
        for i, part in enumerate(parts):
            child = node.children.get(part, MISSING)
            if i == len(parts) - 1:
                if child is not MISSING:
                    raise MongoError(31250, f"Path collision at {path}")
                node.children[part] = None if leaf else _PathTree()
                return node.children[part]
            if child is MISSING:
                child = node.children[part] = _PathTree()
            elif child is None:
                rest = ".".join(parts[1:])
                raise MongoError(31249, f"Path collision at {path} remaining portion {rest}")
            node = child
        return None  # pragma: no cover


def _with_context(stage: str, fn: Callable[[], Any]) -> Any:
    try:
        return fn()
    except MongoError as exc:
        raise MongoError(exc.code, f"Invalid {stage} :: caused by :: {exc.errmsg}") from None


def _parse_projection(spec: Mapping[str, Any]) -> tuple[_Doc, bool]:
    """Validate a `$project` spec (projection_parser.cpp); returns the flattened spec for
    mongomock (dotted paths -> 1 / 0 / expression) and whether it is an inclusion."""
    if not spec:
        raise MongoError(51272, "projection specification must have at least one field")
    kind: list[bool | None] = [None]  # True: inclusion
    flat: _Doc = OrderedDict()

    def walk(obj: Mapping[str, Any], prefix: str, tree: _PathTree, root: bool) -> None:
        for name, value in obj.items():
            full = prefix + name
            top_id = root and name == "_id"
            if isinstance(value, Mapping) and not value:
                raise MongoError(
                    51270,
                    "An empty sub-projection is not a valid value. Found empty object at path",
                )
            if isinstance(value, Mapping) and value and not _is_expression_object(value):
                _check_field_path(name)
                sub = tree.add(name, leaf=False)
                assert sub is not None
                walk(value, full + ".", sub, False)
                continue
            _check_field_path(name)
            tree.add(name, leaf=True)
            if _is_expression_object(value):
                _check_expression(value)
                if kind[0] is False:
                    raise MongoError(
                        31252, "Cannot use expression other than $meta in exclusion projection"
                    )
                kind[0] = True
                flat[full] = value
            elif _is_flag(value):
                included = bool(value)
                flat[full] = 1 if included else 0
                if top_id:
                    continue
                if included and kind[0] is False:
                    raise MongoError(
                        31253, f"Cannot do inclusion on field {name} in exclusion projection"
                    )
                if not included and kind[0] is True:
                    raise MongoError(
                        31254, f"Cannot do exclusion on field {name} in inclusion projection"
                    )
                kind[0] = included
            else:
                if kind[0] is False:
                    raise MongoError(
                        31310,
                        f"Cannot use an expression {_element_string(name, _to_bson_value(value))}"
                        " in an exclusion projection",
                    )
                _check_expression(value)
                kind[0] = True
                flat[full] = {"$literal": value} if not isinstance(value, str) else value

    walk(spec, "", _PathTree(), True)
    inclusion = kind[0]
    if inclusion is None:
        # Only _id was named: {_id: 1} is an inclusion, {_id: 0} an exclusion.
        inclusion = bool(flat.get("_id", 0))
    return flat, inclusion


def _parse_add_fields(spec: Mapping[str, Any]) -> _Doc:
    """Flatten nested field objects to dotted paths (they merge into existing documents)."""
    flat: _Doc = OrderedDict()

    def walk(obj: Mapping[str, Any], prefix: str, tree: _PathTree) -> None:
        for name, value in obj.items():
            _check_field_path(name)
            if isinstance(value, Mapping) and value and not _is_expression_object(value):
                sub = tree.add(name, leaf=False)
                assert sub is not None
                walk(value, prefix + name + ".", sub)
            else:
                tree.add(name, leaf=True)
                _check_expression(value)
                flat[prefix + name] = value

    walk(spec, "", _PathTree())
    return flat


def _check_logical(query: Any) -> None:
    """MatchExpressionParser's shape checks for $and / $or / $nor (and top-level $not)."""
    if not isinstance(query, Mapping):
        return
    for key, value in query.items():
        if key == "$not":  # mongomock would take it as a logical operator
            raise MongoError(
                2,
                "unknown top level operator: $not. If you are trying to negate an entire "
                "expression, use $nor.",
            )
        if key in ("$and", "$or", "$nor"):
            if not isinstance(value, list):
                raise MongoError(2, f"{key} must be an array")
            if not value:
                raise MongoError(2, "$and/$or/$nor must be a nonempty array")
            for sub in value:
                if not isinstance(sub, Mapping):
                    raise MongoError(2, "$or/$and/$nor entries need to be full objects")
                _check_logical(sub)


# -- stages -------------------------------------------------------------------------------------

_Docs = list[_Doc | None]  # None: dropped by the stage


class _Stage:
    name: str
    transforms = True

    def run(self, docs: _Docs) -> _Docs:
        raise NotImplementedError


class _Match(_Stage):
    transforms = False

    def __init__(self, spec: Any, collation: Collation | None = None) -> None:
        self.name = "$match"
        if not isinstance(spec, Mapping):
            raise MongoError(15959, "the match filter must be an expression in an object")
        _check_logical(spec)
        query_engine.check_match_stage(spec)
        _check_query_expressions(spec)
        self.spec = query_engine.normalize(_plain_spec(spec))
        # The aggregate's collation: compared strings (filter and event) become their keys.
        self.collation = collation
        if collation is not None:
            self.spec = collation.filter(self.spec)
        # Regexes compiled once, as the embedded store's queries compile them (PCRE's meaning,
        # linear time where RE2 can run the pattern); invalid ones fail here (51091, 51108).
        # ... and equality operands compared in field order: the store's find's own filter.
        self._compiled = query_engine.match_filter(self.spec)
        self._filter_applies = query_engine.filter_function()
        try:  # syntax errors mongomock finds without data: unknown operators, $in arguments...
            self._filter_applies(self._compiled, {})
        except OperationFailure as exc:
            raise _engine_error(exc, self.name) from None
        except Exception:  # data-dependent: decided per event
            pass

    def matches(self, doc: Mapping[str, Any]) -> bool:
        if self.collation is not None:
            doc = self.collation.value(doc)
        try:
            return bool(self._filter_applies(self._compiled, doc))
        except KeyError:
            # mongomock's $expr raises on a missing field; count it as no match.
            return False
        except Exception as exc:
            raise _engine_error(exc, self.name) from None

    def run(self, docs: _Docs) -> _Docs:
        return [d if d is not None and self.matches(d) else None for d in docs]


def _process(docs: list[Any], stage: Mapping[str, Any], name: str) -> list[Any]:
    try:
        return query_engine.process_pipeline(docs, None, [stage])
    except Exception as exc:
        raise _engine_error(exc, name) from None


def _evaluate(
    expression: Any, doc: Mapping[str, Any], user_vars: dict[str, Any] | None = None
) -> Any:
    """An aggregation expression on `doc` (mongomock's parser); MISSING when it is missing."""
    try:
        return query_engine.evaluate(expression, doc, user_vars)
    except KeyError:
        return MISSING


class _Project(_Stage):
    def __init__(self, spec: Any, name: str = "$project") -> None:
        self.name = name
        if name == "$unset":
            if not isinstance(spec, (str, list)):
                raise MongoError(31002, "$unset specification must be a string or an array")
            fields = [spec] if isinstance(spec, str) else spec
            if not fields:
                raise MongoError(
                    31119,
                    "$unset specification must be a string or an array with at least one field",
                )
            if not all(isinstance(f, str) for f in fields):
                raise MongoError(
                    31120,
                    "$unset specification must be a string or an array containing only string "
                    "values",
                )
            spec = OrderedDict((f, 0) for f in fields)
        elif not isinstance(spec, Mapping):
            raise MongoError(15969, "$project specification must be an object")
        flat, self.inclusion = _with_context(name, lambda: _parse_projection(_plain_spec(spec)))
        if self.inclusion and not any(k == "_id" or k.startswith("_id.") for k in flat):
            flat["_id"] = 1  # an inclusion keeps _id unless told otherwise
        # mongomock sets computed dotted paths as literal keys: evaluate those here instead.
        self.nested_computed = OrderedDict(
            (k, v) for k, v in flat.items() if "." in k and not isinstance(v, int)
        )
        self.spec = OrderedDict((k, v) for k, v in flat.items() if k not in self.nested_computed)
        # mongomock cannot read an inclusion that names nothing but a kept or dropped _id.
        only_id = self.inclusion and list(self.spec) == ["_id"] and self.spec["_id"] in (0, 1)
        self.keep_id_only = only_id and self.spec["_id"] == 1
        self.nothing = only_id and self.spec["_id"] == 0

    def run(self, docs: _Docs) -> _Docs:
        live = [d for d in docs if d is not None]
        if self.keep_id_only:
            projected = [OrderedDict([("_id", d["_id"])]) if "_id" in d else OrderedDict()
                         for d in live]
        elif self.nothing:
            projected = [OrderedDict() for _ in live]
        elif self.spec:
            projected = _process(live, {"$project": self.spec}, self.name)
        else:
            projected = [OrderedDict() for _ in live]
        if self.nested_computed:
            for src, out in zip(live, projected):
                for path, expression in self.nested_computed.items():
                    value = self._eval(expression, src)
                    if value is not MISSING:
                        set_document_value(out, path, value)
        it = iter(projected)
        return [None if d is None else next(it) for d in docs]

    def _eval(self, expression: Any, doc: Mapping[str, Any]) -> Any:
        try:
            return _evaluate(expression, doc)
        except Exception as exc:
            raise _engine_error(exc, self.name) from None


class _AddFields(_Stage):
    def __init__(self, spec: Any, name: str) -> None:
        self.name = name
        if not isinstance(spec, Mapping):
            raise MongoError(
                40272, f"{name} specification stage must be an object, got {type_name(spec)}"
            )
        self.spec = _with_context(name, lambda: _parse_add_fields(_plain_spec(spec)))
        self.nested = any("." in k for k in self.spec)

    def run(self, docs: _Docs) -> _Docs:
        if not self.spec:
            return docs
        live = [d for d in docs if d is not None]
        if self.nested:
            # mongomock writes dotted paths into the nested documents it was given; every
            # expression must still see the input document as it was.
            live = copy.deepcopy(live)
        out = iter(_process(live, {"$addFields": self.spec}, self.name))
        return [None if d is None else next(out) for d in docs]


class _ReplaceRoot(_Stage):
    def __init__(self, spec: Any, name: str) -> None:
        self.name = "$replaceRoot"
        if name == "$replaceWith":
            _check_expression(spec)
            self.expression = _plain_spec(spec)
            self.context = "'replacement document' "
            return
        if not isinstance(spec, Mapping):
            raise MongoError(
                40229,
                "expected an object as specification for $replaceRoot stage, got "
                + type_name(spec),
            )
        for key in spec:
            if key != "newRoot":
                raise MongoError(40415, f"BSON field '$replaceRoot.{key}' is an unknown field.")
        if "newRoot" not in spec:
            raise MongoError(
                40414, "BSON field '$replaceRoot.newRoot' is missing but a required field"
            )
        _check_expression(spec["newRoot"])
        self.expression = _plain_spec(spec["newRoot"])
        self.context = "'newRoot' expression "

    def run(self, docs: _Docs) -> _Docs:
        out: _Docs = []
        for doc in docs:
            if doc is None:
                out.append(None)
                continue
            try:
                new_root = _evaluate(self.expression, doc)
            except Exception as exc:
                raise _engine_error(exc, self.name) from None
            if not isinstance(new_root, dict):
                value = _to_bson_value(new_root)
                raise MongoError(
                    40228,
                    f"{self.context} must evaluate to an object, but resulting value was: "
                    f"{'MISSING' if value is MISSING else value_string(value)}. Type of "
                    f"resulting value: "
                    f"'{'missing' if value is MISSING else type_name(value)}'. "
                    f"Input document: {document_string(_to_bson_value(doc))}",
                )
            out.append(new_root)
        return out


class _Redact(_Stage):
    def __init__(self, spec: Any) -> None:
        self.name = "$redact"
        _check_expression(spec)
        self.expression = _plain_spec(spec)

    def run(self, docs: _Docs) -> _Docs:
        return [None if d is None else self._object(d, d) for d in docs]

    def _object(self, current: _Doc, root: _Doc) -> _Doc | None:
        variables = dict(_REDACT_VALUES, ROOT=root, CURRENT=current)
        try:
            result = _evaluate(self.expression, current, variables)
        except Exception as exc:
            raise _engine_error(exc, self.name) from None
        if isinstance(result, str):
            if result == "keep":
                return current
            if result == "prune":
                return None
            if result == "descend":
                out: _Doc = OrderedDict()
                for key, value in current.items():
                    value = self._value(value, root)
                    if value is not MISSING:
                        out[key] = value
                return out
        value = _to_bson_value(result)
        raise MongoError(
            17053,
            "$redact's expression should not return anything aside from the variables $$KEEP, "
            "$$DESCEND, and $$PRUNE, but returned "
            + ("MISSING" if value is MISSING else value_string(value)),
        )

    def _value(self, value: Any, root: _Doc) -> Any:
        if isinstance(value, dict):
            result = self._object(value, root)
            return MISSING if result is None else result
        if isinstance(value, list):
            out = []
            for item in value:
                if isinstance(item, (dict, list)):
                    item = self._value(item, root)
                    if item is MISSING:
                        continue
                out.append(item)
            return out
        return value


def _build_stage(stage: Any, collation: Collation | None = None) -> _Stage | None:
    if not isinstance(stage, Mapping) or len(stage) != 1:
        raise MongoError(
            40323, "A pipeline stage specification object must contain exactly one field."
        )
    name, spec = next(iter(stage.items()))
    if name not in KNOWN_STAGES:
        raise MongoError(40324, f"Unrecognized pipeline stage name: '{name}'")
    if name not in ALLOWED_USER_STAGES:
        raise MongoError(20, f"{KNOWN_STAGES[name]} is not permitted in a $changeStream pipeline")
    if name == "$match":
        return _Match(spec, collation)
    if name in ("$project", "$unset"):
        return _Project(spec, name)
    if name in ("$addFields", "$set"):
        return _AddFields(spec, name)
    if name in ("$replaceRoot", "$replaceWith"):
        return _ReplaceRoot(spec, name)
    if name == "$redact":
        return _Redact(spec)
    return None  # $changeStreamSplitLargeEvent: SplitLargeEvent's job


class UserStages:
    """The user's stages, validated at construction (when the stream is opened).

    `process(events)`: the surviving events, each `_id` checked against the event's resume token
    (280, as mongod's plan executor checks every event it returns). `apply(events)`: the same
    without that check, with each output's original token, for a caller that runs
    `$changeStreamSplitLargeEvent` first (mongod checks after the split; fragments carry their
    own tokens) — see `split_large_event.SplitLargeEvent.process(events, tokens)`.

    With no stages, or only `$match` stages, events come back as the same objects.
    """

    def __init__(
        self, stages: Iterable[Mapping[str, Any]], collation: Mapping[str, Any] | None = None
    ) -> None:
        """`collation`: the aggregate's (None: simple), which `$match` compares strings by."""
        collator = parse_collation(collation, "aggregate")
        built = [_build_stage(s, collator) for s in stages]
        self.stages: list[_Stage] = [s for s in built if s is not None]
        self.transforms = any(s.transforms for s in self.stages)

    def __bool__(self) -> bool:
        return bool(self.stages)

    def apply(
        self, events: Sequence[Mapping[str, Any]]
    ) -> tuple[list[dict[str, Any]], list[Mapping[str, Any]]]:
        """(output events, the resume token of each) — no `_id` check."""
        if not self.stages or not events:
            # the events are the transform's dicts (typed as Mappings by the stages before)
            ids = cast("list[Mapping[str, Any]]", [e.get("_id") for e in events])
            return cast("list[dict[str, Any]]", list(events)), ids
        docs: _Docs = [_to_plain(e) for e in events]
        for stage in self.stages:
            docs = stage.run(docs)
        out: list[Any] = []  # the events' dicts, or new ones
        tokens: list[Mapping[str, Any]] = []
        for event, doc in zip(events, docs):
            if doc is None:
                continue
            token = event["_id"]
            if self.transforms:
                result = _from_plain(doc)
                if "_id" in result and _raw_value_equal(result["_id"], token):
                    result["_id"] = token  # the event's own token object, not a re-decoded copy
                out.append(result)
            else:
                out.append(event)
            tokens.append(token)
        return out, tokens

    def process(self, events: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
        out, tokens = self.apply(events)
        if self.transforms:
            for event, token in zip(out, tokens):
                check_resume_token(event, token)
        return out


# -- $match pre-filter --------------------------------------------------------------------------

Prefilter = Callable[[Any, Any, Any], bool]
_FIELDS = {"operationType": 0, "ns.db": 1, "ns.coll": 2}


def _string_set(value: Any) -> frozenset[str] | None:
    if isinstance(value, list) and all(type(v) is str for v in value):
        return frozenset(value)
    return None


def _field_test(index: int, condition: Any) -> Callable[[tuple[Any, ...]], bool] | None:
    """A test of one of (operationType, db, coll) implied by `condition`, or None."""
    if type(condition) is str:
        return lambda v: v[index] is None or v[index] == condition
    if not isinstance(condition, Mapping) or not condition:
        return None
    if not all(isinstance(k, str) and k.startswith("$") for k in condition):
        return None  # an embedded-document equality: a string field never equals it
    tests: list[Callable[..., bool]] = []  # (v, a=<the bound argument>)
    for op, arg in condition.items():
        if op == "$eq" and type(arg) is str:
            tests.append(lambda v, a=arg: v[index] is None or v[index] == a)
        elif op == "$in" and (allowed := _string_set(arg)) is not None:
            tests.append(lambda v, a=allowed: v[index] is None or v[index] in a)
        elif op == "$ne" and type(arg) is str:
            tests.append(lambda v, a=arg: v[index] is None or v[index] != a)
        elif op == "$nin" and (banned := _string_set(arg)) is not None:
            tests.append(lambda v, a=banned: v[index] is None or v[index] not in a)
    if not tests:
        return None
    return lambda v: all(t(v) for t in tests)


def _query_test(query: Any) -> Callable[[tuple[Any, ...]], bool] | None:
    """A conservative test implied by a query document (None: nothing usable)."""
    if not isinstance(query, Mapping):
        return None
    tests: list[Callable[[tuple[Any, ...]], bool]] = []
    for key, condition in query.items():
        if key in _FIELDS:
            test = _field_test(_FIELDS[key], condition)
        elif key == "ns" and isinstance(condition, Mapping) and condition and not any(
            str(k).startswith("$") for k in condition
        ):
            # {ns: {db: "a", coll: "b"}} matches exactly that document; its parts are implied.
            parts = [
                _field_test(_FIELDS["ns." + k], v)
                for k, v in condition.items()
                if k in ("db", "coll") and type(v) is str
            ]
            parts = [p for p in parts if p is not None]
            test = (lambda v, ps=parts: all(p(v) for p in ps)) if parts else None
        elif key == "$and" and isinstance(condition, list):
            parts = [t for t in (_query_test(q) for q in condition) if t is not None]
            test = (lambda v, ps=parts: all(p(v) for p in ps)) if parts else None
        elif key == "$or" and isinstance(condition, list) and condition:
            parts = [_query_test(q) for q in condition]
            if any(p is None for p in parts):
                test = None  # a branch that may match anything
            else:
                test = lambda v, ps=parts: any(p(v) for p in ps)  # noqa: E731
        else:
            test = None
        if test is not None:
            tests.append(test)
    if not tests:
        return None
    return lambda v: all(t(v) for t in tests)


def match_prefilter(
    stages: Iterable[Mapping[str, Any]], collation: Mapping[str, Any] | None = None
) -> Prefilter | None:
    """From a leading `$match`, a cheap `(operation_type, db, coll) -> bool` that is False only
    for events the `$match` cannot accept; None when it implies nothing.

    Pass the values the *event* will have (its `operationType`, `ns.db`, `ns.coll`); pass None
    for one that is unknown or that the event will not have — None never causes a rejection.
    Only equality, `$eq`, `$in`, `$ne`, `$nin` with strings, `$and`, `$or` and `ns: {db, coll}`
    are used; predicates on other fields (`documentKey`, `fullDocument`, ...) are left to the
    full `$match`. A non-simple collation disables it (string equality would differ).
    """
    if collation and collation.get("locale", "simple") != "simple":
        return None
    stages = list(stages)
    if not stages or not isinstance(stages[0], Mapping) or len(stages[0]) != 1:
        return None
    name, spec = next(iter(stages[0].items()))
    if name != "$match" or not isinstance(spec, Mapping):
        return None
    test = _query_test(spec)
    if test is None:
        return None

    def prefilter(operation_type: Any, db: Any, coll: Any) -> bool:
        return test((operation_type, db, coll))

    return prefilter
