"""The update operators mongomock lacks or gets wrong, with mongod's semantics.

mongomock 4.3 has no `$mul`, `$bit` or dotted `$rename`, and its `$inc` loses BSON's numeric
types (a long incremented by 1 comes back as a Python int, i.e. an int32 on the wire). montydb
2.5 has `$mul` and `$rename` but not `$bit`, and its `$mul` gives a double for a missing field.
So these four follow mongod's own nodes (ArithmeticNode, BitNode, RenameNode over SafeNum):

* numbers keep their BSON type: int32 op int32 widens to a long on overflow, a long that
  overflows is an error, a double or a decimal operand makes the result one;
* a missing field is created: `$inc` stores the operand, `$mul` a zero of the operand's type,
  `$bit` the operations applied to an int32 zero;
* paths are created as mongod creates them (arrays padded with nulls), and a path through a
  scalar is 28 PathNotViable, with mongod's messages.
"""

from __future__ import annotations

import decimal
from collections.abc import Mapping
from typing import Any

from bson.decimal128 import Decimal128, create_decimal128_context
from bson.int64 import Int64

from pipeline_stages.errors import MongoError
from pipeline_stages.value_string import bson_obj_string, type_name

INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
_DEC = create_decimal128_context()


class _Missing:
    pass


MISSING = _Missing()


# ---------------------------------------------------------------------------------------------
# SafeNum


def is_number(value: Any) -> bool:
    return isinstance(value, (int, float, Decimal128)) and not isinstance(value, bool)


def _kind(value: Any) -> str:
    if isinstance(value, Int64):
        return "long"
    if isinstance(value, int):
        return "int" if INT32_MIN <= value <= INT32_MAX else "long"
    if isinstance(value, float):
        return "double"
    return "decimal"


def _as_decimal(value: Any) -> decimal.Decimal:
    if isinstance(value, Decimal128):
        return value.to_decimal()
    if isinstance(value, float):  # Decimal128(double, kRoundTo15Digits)
        if value != value or value in (float("inf"), float("-inf")):
            return decimal.Decimal(repr(value).replace("inf", "Infinity"))
        return _DEC.create_decimal(format(value, ".14e"))
    return decimal.Decimal(int(value))


def _make(kind: str, value: Any) -> Any:
    if kind == "int":
        return int(value)
    if kind == "long":
        return Int64(value)
    if kind == "double":
        return float(value)
    return Decimal128(_DEC.create_decimal(value))


def arith(op: str, left: Any, right: Any) -> Any:
    """SafeNum `left op right` (op "add" | "mul"); None when a long overflows (mongod's
    invalid SafeNum)."""
    lk, rk = _kind(left), _kind(right)
    if lk in ("int", "long") and rk in ("int", "long"):
        result = int(left) + int(right) if op == "add" else int(left) * int(right)
        if lk == rk == "int" and INT32_MIN <= result <= INT32_MAX:
            return result
        if not INT64_MIN <= result <= INT64_MAX:
            return None
        return Int64(result)
    if "decimal" in (lk, rk):
        a, b = _as_decimal(left), _as_decimal(right)
        return Decimal128(_DEC.add(a, b) if op == "add" else _DEC.multiply(a, b))
    return float(left) + float(right) if op == "add" else float(left) * float(right)


def identical(a: Any, b: Any) -> bool:
    """SafeNum::isIdentical: same type and value (NaN is never identical)."""
    if _kind(a) != _kind(b):
        return False
    if isinstance(a, Decimal128):
        x, y = a.to_decimal(), b.to_decimal()
        return not x.is_nan() and not y.is_nan() and x == y
    return bool(a == b)


def _debug_string(value: Any) -> str:
    kind = _kind(value)
    names = {"int": "NumberInt", "long": "NumberLong", "double": "NumberDouble",
             "decimal": "NumberDecimal"}
    return f"({names[kind]}){value}"


# ---------------------------------------------------------------------------------------------
# Paths


def _bson_string(value: Any) -> str:
    return bson_obj_string(value)


def _element_string(name: str, value: Any) -> str:
    """BSONElement::toString: `name: value`."""
    return f"{name}: {_bson_string(value)}"


def _id_string(doc: Mapping[str, Any]) -> str:
    return _element_string("_id", doc["_id"]) if "_id" in doc else "no id"


def _is_index(part: str) -> bool:
    return part.isdigit() and part.isascii()


def _child(value: Any, part: str) -> Any:
    if isinstance(value, dict):
        return value.get(part, MISSING)
    if isinstance(value, list) and _is_index(part) and int(part) < len(value):
        return value[int(part)]
    return MISSING


def _walk(doc: dict[str, Any], parts: list[str]) -> tuple[list[Any], list[str]]:
    """The chain of existing elements along `parts` (the document first) and their names."""
    chain: list[Any] = [doc]
    names: list[str] = []
    for part in parts:
        nxt = _child(chain[-1], part)
        if nxt is MISSING:
            break
        chain.append(nxt)
        names.append(part)
    return chain, names


def get_path(doc: dict[str, Any], path: str) -> Any:
    parts = path.split(".")
    chain, _ = _walk(doc, parts)
    return chain[-1] if len(chain) == len(parts) + 1 else MISSING


def _not_viable(names: list[str], element: Any, part: str) -> MongoError:
    return MongoError(
        28, f"Cannot create field '{part}' in element {{{_element_string(names[-1], element)}}}"
    )


def check_creatable(doc: dict[str, Any], path: str) -> None:
    """Raise PathNotViable when `path` does not exist and cannot be created."""
    parts = path.split(".")
    chain, names = _walk(doc, parts)
    if len(chain) == len(parts) + 1:
        return
    last, part = chain[-1], parts[len(chain) - 1]
    if isinstance(last, dict) or (isinstance(last, list) and _is_index(part)):
        return
    raise _not_viable(names, last, part)


def set_path(doc: dict[str, Any], path: str, value: Any) -> None:
    """Store `value` at `path`, creating it as mongod does (new sub-documents; an array index
    past the end pads the array with nulls)."""
    parts = path.split(".")
    check_creatable(doc, path)
    cur: Any = doc
    for i, part in enumerate(parts):
        last = i == len(parts) - 1
        if isinstance(cur, list):
            index = int(part)
            while len(cur) <= index:
                cur.append(None)
            if last:
                cur[index] = value
            elif not isinstance(cur[index], (dict, list)):
                cur[index] = {}
            cur = cur[index]
            continue
        if last:
            cur[part] = value
        else:
            if part not in cur:
                cur[part] = {}
            cur = cur[part]


def unset_path(doc: dict[str, Any], path: str) -> None:
    parts = path.split(".")
    chain, _ = _walk(doc, parts)
    if len(chain) != len(parts) + 1:
        return
    parent = chain[-2]
    if isinstance(parent, dict):
        del parent[parts[-1]]
    else:  # $unset of an array element sets it to null, as mongod does
        parent[int(parts[-1])] = None


# ---------------------------------------------------------------------------------------------
# Parse-time checks (the leaf nodes' init)


def check_argument(op: str, path: str, value: Any) -> None:
    """What mongod's leaf node `init` refuses for `{op: {path: value}}`."""
    if op in ("$inc", "$mul") and not is_number(value):
        verb = "increment" if op == "$inc" else "multiply"
        raise MongoError(
            14, f"Cannot {verb} with non-numeric argument: {{{_element_string(path, value)}}}"
        )
    if op == "$bit":
        bit_operations(path, value)
    if op == "$rename":
        check_rename(path, value)
    if op == "$pop":
        if not is_number(value):
            raise MongoError(9, f"Expected a number in: {_element_string(path, value)}")
        if value not in (1, -1):
            raise MongoError(9, f"$pop expects 1 or -1, found: {_element_string(path, value)}")
    if op == "$pullAll" and not isinstance(value, list):
        raise MongoError(
            2, f"$pullAll requires an array argument but was given a {type_name(value)}"
        )
    if op in ("$push", "$addToSet") and isinstance(value, Mapping) and "$each" in value:
        each = value["$each"]
        if not isinstance(each, list):
            sep = ":" if op == "$push" else ""
            raise MongoError(
                2, f"The argument to $each in {op} must be an array but it was of type{sep} "
                f"{type_name(each)}",
            )
    if op == "$currentDate":
        _check_current_date(value)


def _check_current_date(value: Any) -> None:
    if isinstance(value, bool):
        return
    if not isinstance(value, Mapping):
        raise MongoError(
            2, f"{type_name(value)} is not valid type for $currentDate. Please use a boolean "
            "('true') or a $type expression ({$type: 'timestamp/date'}).",
        )
    for name, kind in value.items():
        if name != "$type":
            raise MongoError(2, f"Unrecognized $currentDate option: {name}")
        if kind not in ("date", "timestamp"):
            raise MongoError(
                2, "The '$type' string field is required to be 'date' or 'timestamp': "
                "{$currentDate: {field : {$type: 'date'}}}",
            )


def check_array_target(doc: dict[str, Any], op: str, path: str) -> None:
    """The errors of the array operators on a field that is not an array (mongomock raises
    Python errors or does nothing there)."""
    current = get_path(doc, path)
    if current is MISSING or isinstance(current, list):
        return
    field = path.split(".")[-1]
    kind = type_name(current)
    if op == "$push":
        raise MongoError(
            2, f"The field '{field}' must be an array but is of type {kind} in document "
            f"{{{_id_string(doc)}}}",
        )
    if op == "$addToSet":
        raise MongoError(
            2, "Cannot apply $addToSet to non-array field. Field named "
            f"'{field}' has non-array type {kind}",
        )
    if op in ("$pull", "$pullAll"):
        raise MongoError(2, "Cannot apply $pull to a non-array value")
    if op == "$pop":
        raise MongoError(
            14, f"Path '{path}' contains an element of non-array type '{kind}'"
        )


def bit_operations(path: str, spec: Any) -> list[tuple[str, Any]]:
    if not isinstance(spec, Mapping):
        raise MongoError(
            2, f"The $bit modifier is not compatible with a {type_name(spec)}. You must pass in "
            "an embedded document: {$bit: {field: {and/or/xor: #}}",
        )
    ops: list[tuple[str, Any]] = []
    for name, operand in spec.items():
        if name not in ("and", "or", "xor"):
            raise MongoError(
                2, f"The $bit modifier only supports 'and', 'or', and 'xor', not '{name}' which "
                f"is an unknown operator: {{{_element_string(name, operand)}}}",
            )
        if not isinstance(operand, int) or isinstance(operand, bool):
            raise MongoError(
                2, "The $bit modifier field must be an Integer(32/64 bit); a "
                f"'{type_name(operand)}' is not supported here: "
                f"{{{_element_string(name, operand)}}}",
            )
        ops.append((name, operand))
    if not ops:
        raise MongoError(
            2, "You must pass in at least one bitwise operation. The format is: "
            "{$bit: {field: {and/or/xor: #}}",
        )
    return ops


def check_rename(source: str, dest: Any) -> None:
    if not isinstance(dest, str):
        raise MongoError(
            2, f"The 'to' field for $rename must be a string: {_element_string(source, dest)}"
        )
    if "\0" in dest:
        raise MongoError(2, "The 'to' field for $rename cannot contain an embedded null byte")
    shown = _element_string(source, dest)
    a, b = source.split("."), dest.split(".")
    if a == b:
        raise MongoError(2, f"The source and target field for $rename must differ: {shown}")
    n = min(len(a), len(b))
    if a[:n] == b[:n]:
        raise MongoError(
            2, f"The source and target field for $rename must not be on the same path: {shown}"
        )
    if any(p == "$" or (p.startswith("$[") and p.endswith("]")) for p in a):
        raise MongoError(2, f"The source field for $rename may not be dynamic: {source}")
    if any(p == "$" or (p.startswith("$[") and p.endswith("]")) for p in b):
        raise MongoError(2, f"The destination field for $rename may not be dynamic: {dest}")


# ---------------------------------------------------------------------------------------------
# Application (one operator on one path of a document, in place)


def apply_arithmetic(doc: dict[str, Any], op: str, path: str, operand: Any) -> None:
    """`$inc` / `$mul` (ArithmeticNode)."""
    current = get_path(doc, path)
    name = "add" if op == "$inc" else "mul"
    if current is MISSING:
        check_creatable(doc, path)
        value = operand if op == "$inc" else arith("mul", operand, 0)
        set_path(doc, path, value)
        return
    if not is_number(current):
        field = path.split(".")[-1]
        raise MongoError(
            14, f"Cannot apply {op} to a value of non-numeric type. {{{_id_string(doc)}}} has "
            f"the field '{field}' of non-numeric type {type_name(current)}",
        )
    result = arith(name, operand, current)
    if result is not None and identical(result, current):
        return
    if result is None:
        raise MongoError(
            2, f"Failed to apply {op} operations to current value ({_debug_string(current)}) "
            f"for document {{{_id_string(doc)}}}",
        )
    set_path(doc, path, result)


def _bitwise(name: str, left: Any, right: Any) -> Any:
    a, b = int(left), int(right)
    result = a & b if name == "and" else a | b if name == "or" else a ^ b
    if _kind(left) == "int" and _kind(right) == "int":
        return result
    return Int64(result)


def apply_bit(doc: dict[str, Any], path: str, spec: Any) -> None:
    """`$bit` (BitNode): and / or / xor on an int32 or a long."""
    ops = bit_operations(path, spec)
    current = get_path(doc, path)
    if current is MISSING:
        check_creatable(doc, path)
        value: Any = 0
        for name, operand in ops:
            value = _bitwise(name, value, operand)
        set_path(doc, path, value)
        return
    if not isinstance(current, int) or isinstance(current, bool):
        field = path.split(".")[-1]
        raise MongoError(
            2, f"Cannot apply $bit to a value of non-integral type.{_id_string(doc)} has the "
            f"field {field} of non-integer type {type_name(current)}",
        )
    value = current
    for name, operand in ops:
        value = _bitwise(name, value, operand)
    if not identical(value, current):
        set_path(doc, path, value)


def apply_rename(doc: dict[str, Any], source: str, dest: str) -> None:
    """`$rename` (RenameNode): a $set of the source's value at the destination, then an $unset
    of the source; neither path may run through an array."""
    src_parts = source.split(".")
    chain, names = _walk(doc, src_parts)
    if len(chain) != len(src_parts) + 1:
        last = chain[-1]
        part = src_parts[len(chain) - 1]
        # findLongestPrefix: a path through a scalar is not viable (an error), a missing
        # field is a no-op.
        if not isinstance(last, (dict, list)) or (isinstance(last, list) and not _is_index(part)):
            raise _path_not_viable_lookup(names, last, source)
        return
    for name, element in zip(names[:-1], chain[1:-1], strict=False):
        if isinstance(element, list):
            raise MongoError(
                2, f"The source field cannot be an array element, '{source}' in doc with "
                f"{_id_string(doc)} has an array field called '{name}'",
            )
    value = chain[-1]
    dest_parts = dest.split(".")
    dchain, dnames = _walk(doc, dest_parts)
    check_creatable(doc, dest)
    exists = len(dchain) == len(dest_parts) + 1
    # The elements the destination runs through: the existing prefix (but the element itself
    # when it is overwritten).
    through = list(zip(dnames, dchain[1:], strict=False))
    if exists:
        through = through[:-1]
    for name, element in through:
        if isinstance(element, list):
            raise MongoError(
                2, f"The destination field cannot be an array element, '{dest}' in doc with "
                f"{_id_string(doc)} has an array field called '{name}'",
            )
    set_path(doc, dest, value)
    unset_path(doc, source)


def _path_not_viable_lookup(names: list[str], element: Any, path: str) -> MongoError:
    """pathsupport::findLongestPrefix's PathNotViable (it names the element it stopped at)."""
    return MongoError(
        28, f"cannot use the part ({names[-1]} of {path}) to traverse the element "
        f"({{{_element_string(names[-1], element)}}})",
    )
