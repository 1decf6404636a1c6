"""Update operators mongomock lacks ($mul, $bit, dotted $rename) and BSON numeric types of
$inc, driven with pymongo against the embedded store: values with their BSON types, mongod's
errors (codes, codeNames, messages), and the `$v:2` diffs of their oplog entries."""

from __future__ import annotations

from typing import Any

import bson
import pytest
from bson.codec_options import CodecOptions
from bson.decimal128 import Decimal128
from bson.int64 import Int64
from bson.raw_bson import RawBSONDocument
from pymongo import errors

from pipeline_stages.update_description import apply_diff

RAW = CodecOptions(document_class=RawBSONDocument)


@pytest.fixture
def coll(client, request):
    name = request.node.originalname + str(abs(hash(request.node.name)) % 10**8)
    c = client.upd[name]
    c.drop()
    return c


def _types(raw: RawBSONDocument) -> dict[str, int]:
    """Field name -> BSON type byte of each top-level field, read from the raw document."""
    out: dict[str, int] = {}
    data = raw.raw
    i = 4
    while data[i] != 0:
        kind = data[i]
        end = data.index(b"\x00", i + 1)
        out[data[i + 1:end].decode()] = kind
        i = end + 1 + _value_len(kind, data, end + 1)
    return out


def _value_len(kind: int, data: bytes, at: int) -> int:
    fixed = {0x01: 8, 0x10: 4, 0x12: 8, 0x13: 16, 0x08: 1, 0x0A: 0, 0x09: 8, 0x11: 8, 0x07: 12}
    if kind in fixed:
        return fixed[kind]
    if kind == 0x02:
        return 4 + int.from_bytes(data[at:at + 4], "little")
    if kind in (0x03, 0x04):
        return int.from_bytes(data[at:at + 4], "little")
    if kind == 0x05:
        return 5 + int.from_bytes(data[at:at + 4], "little")
    raise AssertionError(f"type {kind:#x} not expected here")


INT32, INT64, DOUBLE, DECIMAL = 0x10, 0x12, 0x01, 0x13


def _after(coll: Any, doc: dict[str, Any], update: dict[str, Any]) -> tuple[dict, dict]:
    """(document, {field: BSON type}) after applying `update` to `doc`."""
    coll.insert_one(doc)
    coll.update_one({"_id": doc["_id"]}, update)
    raw = coll.with_options(codec_options=RAW).find_one({"_id": doc["_id"]})
    return bson.decode(raw.raw), _types(raw)


def _write_error(coll: Any, doc: dict[str, Any], update: dict[str, Any]) -> dict[str, Any]:
    coll.insert_one(doc)
    with pytest.raises(errors.WriteError) as info:
        coll.update_one({"_id": doc["_id"]}, update)
    assert coll.find_one({"_id": doc["_id"]}) == doc  # nothing applied
    return {"code": info.value.code, "errmsg": info.value.details["errmsg"]}


def _command_error(coll: Any, update: dict[str, Any]) -> dict[str, Any]:
    with pytest.raises(errors.PyMongoError) as info:
        coll.update_one({"_id": 1}, update)
    err = info.value
    details = getattr(err, "details", None) or {}
    return {"code": err.code, "errmsg": details.get("errmsg")}


# ---------------------------------------------------------------------------------------------
# $mul


@pytest.mark.parametrize(
    ("start", "factor", "value", "kind"),
    [
        (3, 4, 12, INT32),
        (2**30, 4, 2**32, INT64),  # int32 overflow widens to a long
        (Int64(3), 2, 6, INT64),  # a long stays a long, however small
        (3, Int64(2), 6, INT64),
        (3, 2.5, 7.5, DOUBLE),
        (Int64(4), 0.5, 2.0, DOUBLE),
        (3, Decimal128("1.5"), Decimal128("4.5"), DECIMAL),
        (1.5, Decimal128("2"), Decimal128("3.00000000000000"), DECIMAL),
    ],
)
def test_mul_keeps_bson_numeric_types(coll, start, factor, value, kind):
    doc, types = _after(coll, {"_id": 1, "a": start}, {"$mul": {"a": factor}})
    assert doc["a"] == value and types["a"] == kind


@pytest.mark.parametrize(
    ("factor", "kind", "zero"),
    [(5, INT32, 0), (Int64(5), INT64, 0), (2.5, DOUBLE, 0.0), (-2.5, DOUBLE, -0.0),
     (Decimal128("2.5"), DECIMAL, Decimal128("0.0"))],
)
def test_mul_on_a_missing_field_stores_a_zero_of_the_factors_type(coll, factor, kind, zero):
    doc, types = _after(coll, {"_id": 1}, {"$mul": {"a": factor}})
    assert doc["a"] == zero and types["a"] == kind
    assert str(doc["a"]) == str(zero)


def test_mul_creates_nested_paths_and_pads_arrays(coll):
    doc, _ = _after(coll, {"_id": 1, "arr": [1]}, {"$mul": {"s.t": 2, "arr.3": 2}})
    assert doc == {"_id": 1, "arr": [1, None, None, 0], "s": {"t": 0}}


def test_mul_errors_as_mongod(coll):
    assert _write_error(coll, {"_id": 1, "a": "x"}, {"$mul": {"a": 2}}) == {
        "code": 14,
        "errmsg": "Plan executor error during update :: caused by :: Cannot apply $mul to a "
        "value of non-numeric type. {_id: 1} has the field 'a' of non-numeric type string",
    }
    assert _command_error(coll, {"$mul": {"a": "2"}}) == {
        "code": 14, "errmsg": 'Cannot multiply with non-numeric argument: {a: "2"}',
    }


def test_mul_long_overflow_is_bad_value(coll):
    got = _write_error(coll, {"_id": 1, "a": Int64(2**62)}, {"$mul": {"a": 4}})
    assert got == {
        "code": 2,
        "errmsg": "Plan executor error during update :: caused by :: Failed to apply $mul "
        "operations to current value ((NumberLong)4611686018427387904) for document {_id: 1}",
    }


def test_inc_keeps_a_long_a_long_and_widens_int32(coll):
    doc, types = _after(coll, {"_id": 1, "a": Int64(1), "b": 2**31 - 1, "c": 1},
                        {"$inc": {"a": 1, "b": 1, "c": 1.5, "d": Int64(7)}})
    assert doc == {"_id": 1, "a": 2, "b": 2**31, "c": 2.5, "d": 7}
    assert (types["a"], types["b"], types["c"], types["d"]) == (INT64, INT64, DOUBLE, INT64)


def test_inc_errors_as_mongod(coll):
    assert _write_error(coll, {"_id": "k", "a": [1]}, {"$inc": {"a": 1}}) == {
        "code": 14,
        "errmsg": "Plan executor error during update :: caused by :: Cannot apply $inc to a "
        "value of non-numeric type. {_id: \"k\"} has the field 'a' of non-numeric type array",
    }
    coll.drop()
    got = _write_error(coll, {"_id": 1, "a": Int64(2**63 - 1)}, {"$inc": {"a": 1}})
    assert got["code"] == 2 and got["errmsg"].endswith(
        "Failed to apply $inc operations to current value ((NumberLong)9223372036854775807) for "
        "document {_id: 1}"
    )
    assert _command_error(coll, {"$inc": {"a": None}}) == {
        "code": 14, "errmsg": "Cannot increment with non-numeric argument: {a: null}",
    }


def test_path_through_a_scalar_is_not_viable(coll):
    assert _write_error(coll, {"_id": 1, "a": 5}, {"$inc": {"a.b": 1}}) == {
        "code": 28,
        "errmsg": "Plan executor error during update :: caused by :: Cannot create field 'b' "
        "in element {a: 5}",
    }
    coll.drop()
    got = _write_error(coll, {"_id": 1, "a": [1, 2]}, {"$set": {"a.x": 1}})
    assert got["code"] == 28 and got["errmsg"].endswith(
        "Cannot create field 'x' in element {a: [ 1, 2 ]}"
    )


# ---------------------------------------------------------------------------------------------
# $bit


@pytest.mark.parametrize(
    ("start", "spec", "value", "kind"),
    [
        (13, {"and": 10}, 8, INT32),
        (13, {"or": 2}, 15, INT32),
        (13, {"xor": 5}, 8, INT32),
        (13, {"and": Int64(10)}, 8, INT64),  # int32 with a long gives a long
        (Int64(13), {"or": 2}, 15, INT64),
        (12, {"and": 14, "or": 1, "xor": 3}, 14, INT32),  # applied in order
    ],
)
def test_bit(coll, start, spec, value, kind):
    doc, types = _after(coll, {"_id": 1, "a": start}, {"$bit": {"a": spec}})
    assert doc["a"] == value and types["a"] == kind


def test_bit_on_a_missing_field_starts_from_int32_zero(coll):
    doc, types = _after(coll, {"_id": 1}, {"$bit": {"a": {"or": 5}, "b": {"or": Int64(5)}}})
    assert (doc["a"], types["a"], doc["b"], types["b"]) == (5, INT32, 5, INT64)


def test_bit_errors_as_mongod(coll):
    assert _write_error(coll, {"_id": 1, "a": 1.5}, {"$bit": {"a": {"and": 1}}}) == {
        "code": 2,
        "errmsg": "Plan executor error during update :: caused by :: Cannot apply $bit to a "
        "value of non-integral type._id: 1 has the field a of non-integer type double",
    }
    assert _command_error(coll, {"$bit": {"a": 5}}) == {
        "code": 2, "errmsg": "The $bit modifier is not compatible with a int. You must pass in "
        "an embedded document: {$bit: {field: {and/or/xor: #}}",
    }
    assert _command_error(coll, {"$bit": {"a": {"nand": 1}}}) == {
        "code": 2, "errmsg": "The $bit modifier only supports 'and', 'or', and 'xor', not "
        "'nand' which is an unknown operator: {nand: 1}",
    }
    assert _command_error(coll, {"$bit": {"a": {"and": 1.0}}}) == {
        "code": 2, "errmsg": "The $bit modifier field must be an Integer(32/64 bit); a 'double' "
        "is not supported here: {and: 1.0}",
    }
    assert _command_error(coll, {"$bit": {"a": {}}}) == {
        "code": 2, "errmsg": "You must pass in at least one bitwise operation. The format is: "
        "{$bit: {field: {and/or/xor: #}}",
    }


# ---------------------------------------------------------------------------------------------
# $rename


def test_rename_dotted_paths(coll):
    doc, _ = _after(coll, {"_id": 1, "a": {"b": 1, "c": 2}, "z": 0},
                    {"$rename": {"a.b": "x.y", "z": "a.d"}})
    assert doc == {"_id": 1, "a": {"c": 2, "d": 0}, "x": {"y": 1}}


def test_rename_missing_source_is_a_noop(coll):
    coll.insert_one({"_id": 1, "a": 1})
    r = coll.update_one({"_id": 1}, {"$rename": {"nope": "b", "s.t": "u"}})
    assert (r.matched_count, r.modified_count) == (1, 0)


def test_rename_overwrites_the_destination(coll):
    doc, _ = _after(coll, {"_id": 1, "a": 1, "b": [1, 2]}, {"$rename": {"a": "b"}})
    assert doc == {"_id": 1, "b": 1}


def test_rename_parse_errors(coll):
    assert _command_error(coll, {"$rename": {"a": "a.b"}}) == {
        "code": 2, "errmsg": "The source and target field for $rename must not be on the same "
        'path: a: "a.b"',
    }
    assert _command_error(coll, {"$rename": {"a": "a"}}) == {
        "code": 2, "errmsg": 'The source and target field for $rename must differ: a: "a"',
    }
    assert _command_error(coll, {"$rename": {"a": 1}}) == {
        "code": 2, "errmsg": "The 'to' field for $rename must be a string: a: 1",
    }
    assert _command_error(coll, {"$rename": {"a.$": "b"}}) == {
        "code": 2, "errmsg": "The source field for $rename may not be dynamic: a.$",
    }
    assert _command_error(coll, {"$rename": {"a": "b"}, "$set": {"b.c": 1}}) == {
        "code": 40, "errmsg": "Updating the path 'b.c' would create a conflict at 'b'",
    }


def test_rename_through_arrays_errors(coll):
    assert _write_error(coll, {"_id": 1, "a": [{"b": 1}]}, {"$rename": {"a.0.b": "c"}}) == {
        "code": 2,
        "errmsg": "Plan executor error during update :: caused by :: The source field cannot "
        "be an array element, 'a.0.b' in doc with _id: 1 has an array field called 'a'",
    }
    coll.drop()
    assert _write_error(coll, {"_id": 1, "a": 1, "d": [{}]}, {"$rename": {"a": "d.0.x"}}) == {
        "code": 2,
        "errmsg": "Plan executor error during update :: caused by :: The destination field "
        "cannot be an array element, 'd.0.x' in doc with _id: 1 has an array field called 'd'",
    }
    coll.drop()
    assert _write_error(coll, {"_id": 1, "a": 5}, {"$rename": {"a.b": "c"}}) == {
        "code": 28,
        "errmsg": "Plan executor error during update :: caused by :: cannot use the part (a of "
        "a.b) to traverse the element ({a: 5})",
    }


# ---------------------------------------------------------------------------------------------
# Parse errors of any update


def test_parse_errors(coll):
    assert _command_error(coll, {"$foo": {"a": 1}}) == {
        "code": 9, "errmsg": "Unknown modifier: $foo. Expected a valid update modifier or "
        "pipeline-style update specified as an array",
    }
    assert _command_error(coll, {"$set": {"a": 1}, "$inc": {"a": 1}}) == {
        "code": 40, "errmsg": "Updating the path 'a' would create a conflict at 'a'",
    }
    assert _command_error(coll, {"$set": {"a.b": 1}, "$inc": {"a": 1}}) == {
        "code": 40, "errmsg": "Updating the path 'a' would create a conflict at 'a'",
    }
    assert _command_error(coll, {"$set": {"a..b": 1}}) == {
        "code": 56, "errmsg": "An update path 'a..b' contains an empty field name, which is not "
        "allowed.",
    }


def test_id_is_immutable(coll):
    assert _write_error(coll, {"_id": 1}, {"$set": {"_id": 2}}) == {
        "code": 66,
        "errmsg": "Plan executor error during update :: caused by :: Performing an update on "
        "the path '_id' would modify the immutable field '_id'",
    }


def test_find_and_modify_errors_carry_its_context(coll):
    coll.insert_one({"_id": 1, "a": "x"})
    with pytest.raises(errors.OperationFailure) as info:
        coll.find_one_and_update({"_id": 1}, {"$mul": {"a": 2}})
    assert info.value.code == 14
    assert info.value.details["errmsg"].startswith(
        "Plan executor error during findAndModify :: caused by :: Cannot apply $mul"
    )


# ---------------------------------------------------------------------------------------------
# The oplog


@pytest.mark.parametrize(
    ("doc", "update", "diff"),
    [
        ({"_id": 1, "a": 2}, {"$mul": {"a": 3}}, {"u": {"a": 6}}),
        ({"_id": 1, "a": 2}, {"$mul": {"b": 3}}, {"i": {"b": 0}}),
        ({"_id": 1, "a": 6}, {"$bit": {"a": {"and": 3}}}, {"u": {"a": 2}}),
        ({"_id": 1, "a": 1, "b": 2}, {"$rename": {"a": "c"}}, {"d": {"a": False}, "i": {"c": 1}}),
        ({"_id": 1, "s": {"x": 1, "y": 2}}, {"$rename": {"s.x": "s.z"}},
         {"ss": {"d": {"x": False}, "i": {"z": 1}}}),
        ({"_id": 1, "a": Int64(1)}, {"$inc": {"a": 1}}, {"u": {"a": Int64(2)}}),
    ],
)
def test_oplog_diffs(server, coll, doc, update, diff):
    coll.insert_one(doc)
    mark = len(server.entries())
    coll.update_one({"_id": 1}, update)
    entries = server.entries()[mark:]
    assert len(entries) == 1 and entries[0]["op"] == "u"
    o = entries[0]["o"]
    assert o == {"$v": 2, "diff": diff}
    post = coll.with_options(codec_options=RAW).find_one({"_id": 1})
    assert bson.encode(apply_diff(doc, o["diff"])) == post.raw


def test_noop_mul_writes_no_entry(server, coll):
    coll.insert_one({"_id": 1, "a": 2, "b": 1.5, "c": 6})
    mark = len(server.entries())
    r = coll.update_one({"_id": 1}, {"$mul": {"a": 1, "b": 1}, "$bit": {"c": {"or": 2}}})
    assert r.modified_count == 0
    assert server.entries()[mark:] == []


# ---------------------------------------------------------------------------------------------
# Errors mongomock gives as Python errors (or not at all), as mongod gives them


@pytest.mark.parametrize(
    ("update", "code", "errmsg"),
    [
        ({"$push": {"a": 1}}, 2, "The field 'a' must be an array but is of type int in document "
         "{_id: 1}"),
        ({"$addToSet": {"a": 1}}, 2, "Cannot apply $addToSet to non-array field. Field named "
         "'a' has non-array type int"),
        ({"$pull": {"a": 1}}, 2, "Cannot apply $pull to a non-array value"),
        ({"$pullAll": {"a": [1]}}, 2, "Cannot apply $pull to a non-array value"),
        ({"$pop": {"a": 1}}, 14, "Path 'a' contains an element of non-array type 'int'"),
    ],
)
def test_array_operators_on_a_non_array(coll, update, code, errmsg):
    got = _write_error(coll, {"_id": 1, "a": 5}, update)
    assert got == {"code": code,
                   "errmsg": f"Plan executor error during update :: caused by :: {errmsg}"}


@pytest.mark.parametrize(
    ("update", "code", "errmsg"),
    [
        ({"$pullAll": {"a": 1}}, 2, "$pullAll requires an array argument but was given a int"),
        ({"$push": {"a": {"$each": 1}}}, 2,
         "The argument to $each in $push must be an array but it was of type: int"),
        ({"$pop": {"a": 2}}, 9, "$pop expects 1 or -1, found: a: 2"),
        ({"$currentDate": {"a": "x"}}, 2, "string is not valid type for $currentDate. Please use "
         "a boolean ('true') or a $type expression ({$type: 'timestamp/date'})."),
    ],
)
def test_operator_argument_errors(coll, update, code, errmsg):
    assert _command_error(coll, update) == {"code": code, "errmsg": errmsg}


@pytest.mark.parametrize(
    ("filter_doc", "errmsg"),
    [
        ({"a": {"$foo": 1}}, "unknown operator: $foo"),
        ({"$foo": 1}, "unknown top level operator: $foo. If you have a field name that starts "
         "with a '$' symbol, consider using $getField or $setField."),
        ({"$and": 1}, "$and must be an array"),
        ({"$or": []}, "$and/$or/$nor must be a nonempty array"),
        ({"$nor": [1]}, "$or/$and/$nor entries need to be full objects"),
        ({"a": {"$in": 1}}, "$in needs an array"),
        ({"a": {"$regex": 1}}, "$regex has to be a string"),
        ({"a": {"$size": "x"}}, "$size needs a number"),
        ({"a": {"$elemMatch": 1}}, "$elemMatch needs an Object"),
        ({"a": {"$mod": [1]}}, "malformed mod, not enough elements"),
        ({"a": {"$type": "nope"}}, "Unknown type name alias: nope"),
    ],
)
def test_bad_query_operators(coll, filter_doc, errmsg):
    coll.insert_one({"_id": 1, "a": 1})
    for run in (lambda: coll.find_one(filter_doc), lambda: coll.delete_many(filter_doc)):
        with pytest.raises(errors.OperationFailure) as info:
            run()
        assert info.value.code == 2
        assert info.value.details["errmsg"] == errmsg
