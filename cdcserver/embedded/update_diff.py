"""The `$v:2` update diffs that mongod 8.0 writes to the oplog (`o: {$v: 2, diff: ...}`).

Two producers, as in mongod (`src/mongo/db/update/`):

* Modifier updates (`{$set: ..., $inc: ..., ...}`) — `UpdateTreeExecutor` applies a tree of
  update nodes (`update_object_node.cpp`, `update_array_node.cpp`, the `*_node.cpp` leaves) and
  each leaf reports what it did to the `$v:2` log builder (`v2_log_builder.cpp`): a field it
  updated (`u`), created (`i`, whole new sub-objects folded into one insert), deleted (`d`),
  nested changes as `s<field>` sub-diffs, array elements as array diffs (`a: true`, `u<idx>`).
  `modifier_update_diff` replays that walk over the pre-image (for paths, positions, array
  filters and the create/update/no-op decisions) and takes the logged values from the post-image.
  No size check: a modifier update is always logged as a delta.
* Pipeline updates (`update: [...]`) — `PipelineExecutor` compares the documents with
  `doc_diff::computeOplogDiff(pre, post, 15)` (`document_diff_calculator.cpp`): a delta if it is
  smaller than the post-image, otherwise the whole document as a replacement.

Values in the diff are the post-image's own objects, so BSON types (int / Int64 / float / ...)
are what the caller stored. Sizes are measured on the BSON encoding of the caller's values.

Known differences from mongod (see also the notes on each function):
* `$addToSet` on an existing array logs the whole array (`u`), as 8.0 does; newer servers
  (8.2+) log only the appended elements.
* Whether a `$set`/`$min`/`$max`/`$addToSet`/`$pull`/`$pullAll`/`$pop` changed anything is read
  from the images (binary comparison), so a post-image that is not mongod's result gives a diff
  that follows that post-image.
* `$[<id>]` needs the command's `arrayFilters` (matched with the query engine's matcher) or a
  predicate; without them an element counts as matched exactly when the update changed it. The
  positional `$` needs the query's matched array index (`matched_field`); without it the first
  element that changed is used.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from decimal import Decimal
from functools import cmp_to_key, reduce
from typing import Any

from bson.binary import UuidRepresentation
from bson.codec_options import CodecOptions
from bson.dbref import DBRef
from bson.decimal128 import Decimal128
from bson.int64 import Int64
from bson.raw_bson import RawBSONDocument

from pipeline_stages import bson_bytes

__all__ = [
    "DELTA_OPLOG_ENTRY_METADATA_SIZE",
    "PipelineUpdateOplog",
    "classify_pipeline_update",
    "compute_doc_diff",
    "compute_oplog_diff",
    "modifier_update_diff",
    "pipeline_update_diff",
]

# update_oplog_entry::kSizeOfDeltaOplogEntryMetadata: the padding PipelineExecutor passes to
# computeOplogDiff for the `$v` and `diff` fields around the diff.
DELTA_OPLOG_ENTRY_METADATA_SIZE = 15

# Approximate-size constants of document_diff_serialization.h.
_EMPTY_DOC_DIFF_SIZE = 5  # kSizeOfEmptyDocumentDiffBuilder
_EMPTY_ARRAY_DIFF_SIZE = 9  # kSizeOfEmptyArrayDiffBuilder: {} + "a" + NUL + type + bool
_SECTION_WRAP_SIZE = 8  # type + one-char name + NUL + empty object
_RESIZE_ENTRY_SIZE = 7  # "l" + int32 + type + NUL

_CODEC: CodecOptions[dict[str, Any]] = bson_bytes.codec_options(
    uuid_representation=UuidRepresentation.STANDARD
)

_T_DOUBLE, _T_STRING, _T_OBJECT, _T_ARRAY = 0x01, 0x02, 0x03, 0x04
_T_BOOL, _T_NULL, _T_INT32, _T_INT64, _T_DECIMAL = 0x08, 0x0A, 0x10, 0x12, 0x13


# --------------------------------------------------------------------------------------------
# BSON helpers


def _encoded(value: Any) -> bytes:
    """The BSON document `{"": value}`: type byte at [4], value bytes at [6:-1]."""
    return bson_bytes.encode({"": value}, codec_options=_CODEC)


def _value_size(value: Any) -> int:
    # BSONElement::valuesize(): the encoding minus length, type, empty name, terminator.
    return len(_encoded(value)) - 7


def _obj_size(doc: Any) -> int:
    # BSONObj::objsize(). Measured inside a wrapper so a top-level `_id` is not moved first.
    return _value_size(doc)


def _btype(value: Any) -> int:
    if isinstance(value, bool):
        return _T_BOOL
    if isinstance(value, Int64):
        return _T_INT64
    if isinstance(value, int):
        return _T_INT32 if -(2**31) <= value < 2**31 else _T_INT64
    if isinstance(value, float):
        return _T_DOUBLE
    if isinstance(value, str):
        return _T_STRING
    if value is None:
        return _T_NULL
    if isinstance(value, (list, tuple)):
        return _T_ARRAY
    if isinstance(value, Mapping):
        return _T_OBJECT
    return _encoded(value)[4]


def _same(a: Any, b: Any) -> bool:
    """BSONElement::binaryEqualValues: same type and same value bytes."""
    if a is b:
        return True
    return _encoded(a) == _encoded(b)


def _is_container_type(t: int) -> bool:
    return t in (_T_OBJECT, _T_ARRAY)


def _as_mapping(value: Any) -> Mapping[str, Any]:
    # A DBRef is a BSON object; the diff walks its fields like any other sub-document.
    if isinstance(value, DBRef):
        return value.as_doc()
    mapping: Mapping[str, Any] = value
    return mapping


def _utf8_key(name: str) -> bytes:
    return name.encode("utf-8", "surrogatepass")


# --------------------------------------------------------------------------------------------
# The diff tree (document_diff_serialization.h, diff_tree::*), shared by both producers.


class _Update:
    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value


class _Insert:
    __slots__ = ("value",)

    def __init__(self, value: Any) -> None:
        self.value = value


class _Delete:
    __slots__ = ()


class _DocSub:
    """DocumentSubDiffNode: a sub-document that exists in the pre-image."""

    __slots__ = ("size", "children", "deletes", "updates", "inserts", "subs")

    def __init__(self, padding: int = 0) -> None:
        self.size = padding + _EMPTY_DOC_DIFF_SIZE
        self.children: dict[str, Any] = {}
        self.deletes: list[str] = []
        self.updates: list[str] = []
        self.inserts: list[str] = []
        self.subs: list[str] = []

    def get(self, name: str) -> Any:
        return self.children.get(name)

    def add(self, name: str, node: Any, entry_size: int = 0) -> Any:
        if name in self.children:
            raise ValueError(f"Document already has a field named '{name}'")  # 7693400
        self.children[name] = node
        self.size += len(_utf8_key(name)) + 2 + entry_size
        if isinstance(node, (_DocSub, _Array)):
            self.size += 1  # the 's' prefix
            self.subs.append(name)
        elif isinstance(node, (_Insert, _DocInsert)):
            if not self.inserts:
                self.size += _SECTION_WRAP_SIZE
            self.inserts.append(name)
        elif isinstance(node, _Delete):
            if not self.deletes:
                self.size += _SECTION_WRAP_SIZE
            self.deletes.append(name)
        else:
            if not self.updates:
                self.size += _SECTION_WRAP_SIZE
            self.updates.append(name)
        return node

    def serialize(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.deletes:
            out["d"] = {name: False for name in self.deletes}
        if self.updates:
            out["u"] = {name: self.children[name].value for name in self.updates}
        if self.inserts:
            out["i"] = {name: _serialize_insert(self.children[name]) for name in self.inserts}
        for name in self.subs:
            out["s" + name] = self.children[name].serialize()
        return out


class _DocInsert:
    """DocumentInsertionNode: a sub-document created by the update (serialized whole)."""

    __slots__ = ("children",)

    def __init__(self) -> None:
        self.children: dict[str, Any] = {}

    def get(self, name: str) -> Any:
        return self.children.get(name)

    def add(self, name: str, node: Any, entry_size: int = 0) -> Any:
        if not isinstance(node, (_Insert, _DocInsert)) or name in self.children:
            raise ValueError(f"invalid insert of '{name}' under a created document")
        self.children[name] = node
        return node

    def serialize(self) -> dict[str, Any]:
        return {name: _serialize_insert(child) for name, child in self.children.items()}


class _Array:
    """ArrayNode: entries by index (serialized in ascending numeric order) and an optional
    new length."""

    __slots__ = ("size", "children", "resize")

    def __init__(self) -> None:
        self.size = _EMPTY_ARRAY_DIFF_SIZE
        self.children: dict[int, Any] = {}
        self.resize: int | None = None

    def get(self, name: str) -> Any:
        return self.children.get(int(name))

    def add(self, name: str | int, node: Any, entry_size: int = 0) -> Any:
        idx = int(name)
        if idx in self.children:
            raise ValueError(f"array index {idx} logged twice")
        self.size += 1 + len(str(idx)) + 2 + entry_size
        self.children[idx] = node
        return node

    def set_resize(self, length: int) -> None:
        self.resize = length
        self.size += _RESIZE_ENTRY_SIZE

    def serialize(self) -> dict[str, Any]:
        out: dict[str, Any] = {"a": True}
        if self.resize is not None:
            out["l"] = self.resize
        for idx in sorted(self.children):
            child = self.children[idx]
            if isinstance(child, (_Update, _Insert)):
                out[f"u{idx}"] = child.value
            elif isinstance(child, _DocInsert):
                out[f"u{idx}"] = child.serialize()
            else:
                out[f"s{idx}"] = child.serialize()
        return out


def _serialize_insert(node: Any) -> Any:
    return node.value if isinstance(node, _Insert) else node.serialize()


# --------------------------------------------------------------------------------------------
# computeOplogDiff (document_diff_calculator.cpp)


def _sub_diff(pre_val: Any, post_val: Any, ident: str | int, parent: Any, ignore: bool) -> None:
    # calculateSubDiffHelper: a sub-diff if it fits, else the whole new value as an update.
    if _btype(pre_val) == _T_OBJECT:
        sub: Any = _doc_diff(_as_mapping(pre_val), _as_mapping(post_val), ignore)
    else:
        sub = _array_diff(pre_val, post_val, ignore)
    if sub is None:
        parent.add(ident, _Update(post_val), _value_size(post_val))
    else:
        parent.add(ident, sub, sub.size)


def _array_diff(pre: Sequence[Any], post: Sequence[Any], ignore: bool) -> _Array | None:
    node = _Array()
    post_size = _obj_size(post)
    n = 0
    while n < len(pre) and n < len(post):
        if not ignore and post_size < node.size:
            return None
        pre_val, post_val = pre[n], post[n]
        if not _same(pre_val, post_val):
            t = _btype(pre_val)
            if t == _btype(post_val) and _is_container_type(t):
                _sub_diff(pre_val, post_val, n, node, ignore)
            else:
                node.add(n, _Update(post_val), _value_size(post_val))
        n += 1
    for idx in range(n, len(post)):
        node.add(idx, _Update(post[idx]), _value_size(post[idx]))
    if len(pre) > len(post):
        node.set_resize(len(post))
    return node if ignore or post_size > node.size else None


def _doc_diff(
    pre: Mapping[str, Any], post: Mapping[str, Any], ignore: bool, padding: int = 0
) -> _DocSub | None:
    node = _DocSub(padding)
    post_size = _obj_size(post)
    pre_items = list(pre.items())
    post_items = list(post.items())
    i = j = 0
    deletes: set[str] = set()
    while i < len(pre_items) and j < len(post_items):
        if not ignore and post_size < node.size:
            return None
        pre_name, pre_val = pre_items[i]
        post_name, post_val = post_items[j]
        if pre_name == post_name:
            if not _same(pre_val, post_val):
                t = _btype(pre_val)
                if t == _btype(post_val) and _is_container_type(t):
                    _sub_diff(pre_val, post_val, pre_name, node, ignore)
                else:
                    node.add(pre_name, _Update(post_val), _value_size(post_val))
            i += 1
            j += 1
        else:
            # Gone from here: deleted, unless it shows up later in the post-image (an insert).
            deletes.add(pre_name)
            i += 1
    for name, _ in pre_items[i:]:
        node.add(name, _Delete(), 1)
    for name, value in post_items[j:]:
        node.add(name, _Insert(value), _value_size(value))
        deletes.discard(name)
    for name in sorted(deletes, key=_utf8_key):  # a std::set<StringData>: byte order
        node.add(name, _Delete(), 1)
    return node if ignore or post_size > node.size else None


def compute_doc_diff(pre: Mapping[str, Any], post: Mapping[str, Any]) -> dict[str, Any]:
    """computeOplogDiff_forTest: the full document diff, with no size limits."""
    node = _doc_diff(pre, post, True)
    assert node is not None
    return node.serialize()


def compute_oplog_diff(
    pre: Mapping[str, Any],
    post: Mapping[str, Any],
    padding: int = DELTA_OPLOG_ENTRY_METADATA_SIZE,
) -> dict[str, Any] | None:
    """doc_diff::computeOplogDiff(pre, post, padding).

    The diff, or None when it is not worth it. While walking, a (sub-)diff whose approximate
    size (the tree's running estimate, plus `padding` at the top) passes the size of its
    post-image is abandoned: a sub-document or sub-array is then logged whole as an update, the
    top level gives None. At the end the serialized diff must also be strictly smaller than the
    post-image (`diff.objsize() < post.objsize()`), else None. Identical documents give `{}`
    (mongod's caller never asks: it treats them as a no-op first).
    """
    node = _doc_diff(pre, post, False, padding)
    if node is not None:
        diff = node.serialize()
        if _obj_size(diff) < _obj_size(post):
            return diff
    return None


@dataclass(frozen=True)
class PipelineUpdateOplog:
    """What mongod logs for a pipeline-style update: `kind` is "noop" (nothing written),
    "delta" (`o = {$v: 2, diff: diff}`) or "replacement" (`o` = the whole post-image)."""

    kind: str
    diff: dict[str, Any] | None = None


def classify_pipeline_update(
    pre: Mapping[str, Any], post: Mapping[str, Any]
) -> PipelineUpdateOplog:
    """PipelineExecutor::applyUpdate: a no-op when the transformed document is binary-equal to
    the original (ObjectReplaceExecutor's check), else computeOplogDiff with the 15-byte padding,
    else a replacement."""
    if _same(pre, post):
        return PipelineUpdateOplog("noop")
    diff = compute_oplog_diff(pre, post, DELTA_OPLOG_ENTRY_METADATA_SIZE)
    if diff is None:
        return PipelineUpdateOplog("replacement")
    return PipelineUpdateOplog("delta", diff)


def pipeline_update_diff(pre: Mapping[str, Any], post: Mapping[str, Any]) -> dict[str, Any] | None:
    """The `diff` mongod logs for a pipeline-style update (or any update it logs by comparing
    the documents), or None when it logs something else: either nothing at all (`pre` and
    `post` are binary-identical, a no-op) or a full-document replacement (the delta would not be
    smaller than `post`). `classify_pipeline_update` tells the two apart."""
    return classify_pipeline_update(pre, post).diff


# --------------------------------------------------------------------------------------------
# Modifier updates: the update tree (update_object_node.cpp, update_array_node.cpp)

_CREATING_OPS = frozenset(
    {"$set", "$inc", "$mul", "$min", "$max", "$push", "$addToSet", "$currentDate", "$bit"}
)
_OTHER_OPS = frozenset({"$unset", "$pop", "$pull", "$pullAll", "$setOnInsert", "$rename"})
_PLACEHOLDER = "$rename source"  # ConflictPlaceholderNode


class _Leaf:
    __slots__ = ("op", "arg", "path", "source")

    def __init__(self, op: str, arg: Any, path: str, source: str | None = None) -> None:
        self.op = op
        self.arg = arg
        self.path = path
        self.source = source


class _ObjNode:
    __slots__ = ("children", "positional")

    def __init__(self) -> None:
        self.children: dict[str, Any] = {}
        self.positional: Any = None


class _ArrNode:
    __slots__ = ("children",)

    def __init__(self) -> None:
        self.children: dict[str, Any] = {}  # identifier ("" for $[]) -> node


def _conflict(path: str) -> ValueError:
    return ValueError(f"Updating the path '{path}' would create a conflict")  # 40


def _is_identifier(part: str) -> bool:
    return part.startswith("$[") and part.endswith("]")


def _less(a: str, b: str) -> bool:
    """pathsupport::cmpPathsAndArrayIndexes: numeric-looking names by magnitude, else bytes."""
    ab, bb = _utf8_key(a), _utf8_key(b)

    def digit(c: int) -> bool:
        return 0x30 <= c <= 0x39

    if (
        not ab
        or not bb
        or not digit(ab[0])
        or not digit(bb[0])
        or (ab[0] == 0x30 and len(ab) > 1)
        or (bb[0] == 0x30 and len(bb) > 1)
    ):
        return ab < bb
    if len(ab) != len(bb):
        return len(ab) < len(bb)
    for ca, cb in zip(ab, bb):
        if not (digit(ca) and digit(cb)):
            break
        if ca != cb:
            return ca < cb
    return ab < bb


def _cmp(a: str, b: str) -> int:
    return -1 if _less(a, b) else (1 if _less(b, a) else 0)


_ORDER = cmp_to_key(_cmp)


def _get_child(node: Any, key: str) -> Any:
    if isinstance(node, _ObjNode) and key == "$":
        return node.positional
    return node.children.get(key)


def _set_child(node: Any, key: str, child: Any) -> None:
    if isinstance(node, _ObjNode) and key == "$":
        node.positional = child
    else:
        node.children[key] = child


def _add_path(root: _ObjNode, path: str, leaf: _Leaf) -> None:
    # UpdateObjectNode::parseAndMerge.
    parts = path.split(".")
    if any(part == "" for part in parts):
        raise ValueError(f"The update path '{path}' contains an empty field name")
    current: Any = root
    for i, part in enumerate(parts[:-1]):
        key = part[2:-1] if _is_identifier(part) else part
        child = _get_child(current, key)
        want_array = _is_identifier(parts[i + 1])
        if child is None:
            child = _ArrNode() if want_array else _ObjNode()
            _set_child(current, key, child)
        elif not isinstance(child, _ArrNode if want_array else _ObjNode):
            raise _conflict(path)
        current = child
    last = parts[-1]
    key = last[2:-1] if _is_identifier(last) else last
    if _get_child(current, key) is not None:
        raise _conflict(path)
    _set_child(current, key, leaf)


def _parse_update(update: Mapping[str, Any]) -> _ObjNode:
    root = _ObjNode()
    for op, fields in update.items():
        if op not in _CREATING_OPS and op not in _OTHER_OPS:
            raise ValueError(f"Unknown modifier: {op}")
        if not isinstance(fields, Mapping):
            raise ValueError(f"Modifiers operate on fields but we found type for {op}")
        for path, arg in fields.items():
            if op == "$rename":
                if not isinstance(arg, str):
                    raise ValueError(f"The 'to' field for $rename must be a string: {arg!r}")
                _add_path(root, path, _Leaf(_PLACEHOLDER, None, path))
                _add_path(root, arg, _Leaf(op, None, arg, source=path))
            else:
                _add_path(root, path, _Leaf(op, arg, path))
    return root


def _merge(left: Any, right: Any) -> Any:
    # UpdateNode::createUpdateNodeByMerging.
    if isinstance(left, _ObjNode) and isinstance(right, _ObjNode):
        merged: Any = _ObjNode()
        if left.positional is not None and right.positional is not None:
            merged.positional = _merge(left.positional, right.positional)
        else:
            merged.positional = left.positional or right.positional
    elif isinstance(left, _ArrNode) and isinstance(right, _ArrNode):
        merged = _ArrNode()
    else:
        raise ValueError("Update created a conflict")
    for key in {**left.children, **right.children}:
        if key in left.children and key in right.children:
            merged.children[key] = _merge(left.children[key], right.children[key])
        else:
            merged.children[key] = left.children.get(key) or right.children[key]
    return merged


# --------------------------------------------------------------------------------------------
# Modifier updates: replaying the walk


_MISSING = object()


def _plain(value: Any) -> Any:
    """A mutable copy for the working document (only its shape matters)."""
    if isinstance(value, (Mapping, RawBSONDocument)) and not isinstance(value, DBRef):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, DBRef):
        return {k: _plain(v) for k, v in value.as_doc().items()}
    return value


def _index(name: str) -> int | None:
    # str::parseUnsignedBase10Integer: ASCII digits only.
    if name and all("0" <= c <= "9" for c in name):
        return int(name)
    return None


def _numeric_identical(a: Any, b: Any) -> bool:
    """SafeNum::isIdentical: same numeric type and equal value."""
    ta, tb = _btype(a), _btype(b)
    if ta != tb or ta not in (_T_INT32, _T_INT64, _T_DOUBLE, _T_DECIMAL):
        return False
    if ta == _T_DECIMAL:
        da: Decimal = a.to_decimal() if isinstance(a, Decimal128) else Decimal(a)
        db: Decimal = b.to_decimal() if isinstance(b, Decimal128) else Decimal(b)
        return not da.is_nan() and not db.is_nan() and da == db
    return bool(a == b)


ArrayFilters = Sequence[Mapping[str, Any]] | Callable[[str, Any], bool]

_Ref = tuple[Any, Any]  # (container, key) into the working document; (None, None) = root
_ROOT: _Ref = (None, None)


class _Replay:
    def __init__(
        self,
        pre: Mapping[str, Any],
        post: Mapping[str, Any],
        array_filters: ArrayFilters | None,
        matched_field: str | None,
    ) -> None:
        self.work = _plain(pre)
        self.post = post
        self.matched_field = matched_field
        self.filters = _compile_filters(array_filters)
        self.taken: list[tuple[str, bool]] = []  # RuntimeUpdatePath: (name, is array index)
        self.create: list[str] = []  # pathToCreate
        self.logging = True
        self.root = _DocSub()

    # -- working document ------------------------------------------------------------------

    def value(self, ref: _Ref) -> Any:
        container, key = ref
        return self.work if container is None else container[key]

    def child(self, ref: _Ref, name: str) -> _Ref | None:
        value = self.value(ref)
        if isinstance(value, dict):
            return (value, name) if name in value else None
        if isinstance(value, list):
            idx = _index(name)
            return (value, idx) if idx is not None and idx < len(value) else None
        return None

    def post_at(self, path: Sequence[tuple[str, bool]]) -> Any:
        value: Any = self.post
        for name, _ in path:
            if isinstance(value, DBRef):
                value = value.as_doc()
            if isinstance(value, (list, tuple)):
                idx = _index(name)
                if idx is None or idx >= len(value):
                    return _MISSING
                value = value[idx]
            elif isinstance(value, (Mapping, RawBSONDocument)):
                if name not in value:
                    return _MISSING
                value = value[name]
            else:
                return _MISSING
        return value

    def post_required(self, path: Sequence[tuple[str, bool]]) -> Any:
        value = self.post_at(path)
        if value is _MISSING:
            dotted = ".".join(name for name, _ in path)
            raise ValueError(f"the post-image has no value at '{dotted}' set by the update")
        return value

    def create_in_work(self, ref: _Ref, parts: Sequence[str], value: Any) -> None:
        # pathsupport::createPathAt: pad arrays with nulls, create objects, then the value.
        parent = self.value(ref)
        for k, part in enumerate(parts):
            last = k == len(parts) - 1
            new = _plain(value) if last else {}
            if isinstance(parent, list):
                idx = _index(part)
                if idx is None:
                    raise ValueError(f"Cannot create field '{part}' in an array")
                parent.extend([None] * (idx - len(parent)))
                parent.append(new)
            elif isinstance(parent, dict):
                parent[part] = new
            else:
                raise ValueError(f"Cannot create field '{part}' in a non-object element")
            parent = new

    def set_in_work(self, ref: _Ref, value: Any) -> None:
        container, key = ref
        if container is None:
            raise ValueError("cannot replace the whole document with a modifier")
        container[key] = _plain(value)

    # -- log builder (v2_log_builder.cpp) --------------------------------------------------

    def log(self, path: Sequence[tuple[str, bool]], node: Any, first_new: int | None) -> None:
        if not self.logging:
            return
        current: Any = self.root
        for k, (name, _) in enumerate(path):
            if k == len(path) - 1:
                current.add(name, node)
                return
            found = current.get(name)
            if found is None:
                is_new = first_new is not None and k >= first_new
                if path[k + 1][1]:
                    found = _Array()
                elif is_new:
                    found = _DocInsert()
                else:
                    found = _DocSub()
                current.add(name, found)
            current = found

    # -- update nodes ----------------------------------------------------------------------

    def apply(self, node: Any, ref: _Ref) -> bool:
        """Applies one update node; True when it was a no-op."""
        if isinstance(node, _ObjNode):
            return self.apply_object(node, ref)
        if isinstance(node, _ArrNode):
            return self.apply_array(node, ref)
        return self.apply_leaf(node, ref)

    def apply_child(self, child: Any, field: str, ref: _Ref) -> tuple[_Ref, bool]:
        # update_object_node.cpp applyChild(): returns the parent's (possibly advanced) element.
        before = len(self.taken)
        found = None if self.create else self.child(ref, field)
        if found is not None:
            self.taken.append((field, isinstance(self.value(ref), list)))
            child_ref = found
        else:
            self.create.append(field)
            child_ref = ref
        noop = self.apply(child, child_ref)
        if self.create:
            self.create.pop()
        else:
            self.taken.pop()
        if len(self.taken) > before:
            for name, _ in self.taken[before:]:
                next_ref = self.child(ref, name)
                assert next_ref is not None
                ref = next_ref
        elif self.create:
            first = self.child(ref, self.create[0])
            if first is not None:
                self.taken.append((self.create[0], isinstance(self.value(ref), list)))
                ref = first
                for part in self.create[1:]:
                    parent_is_array = isinstance(self.value(ref), list)
                    next_ref = self.child(ref, part)
                    assert next_ref is not None
                    ref = next_ref
                    self.taken.append((part, parent_is_array))
                self.create.clear()
        return ref, noop

    def apply_object(self, node: _ObjNode, ref: _Ref) -> bool:
        noop = True
        positional = node.positional
        matched = self.positional_field(ref) if positional is not None else ""
        matched_b = _utf8_key(matched)
        for name in sorted(node.children, key=_ORDER):
            child = node.children[name]
            if positional is not None and name == matched:
                ref, child_noop = self.apply_child(_merge(positional, child), name, ref)
                noop = noop and child_noop
                positional = None
                continue
            if positional is not None and matched_b < _utf8_key(name):
                ref, child_noop = self.apply_child(positional, matched, ref)
                noop = noop and child_noop
                positional = None
            ref, child_noop = self.apply_child(child, name, ref)
            noop = noop and child_noop
        if positional is not None:
            ref, child_noop = self.apply_child(positional, matched, ref)
            noop = noop and child_noop
        return noop

    def positional_field(self, ref: _Ref) -> str:
        if self.matched_field is not None:
            return self.matched_field
        # Not told which element the query matched: take the first one the update changed.
        array = None if self.create else self.value(ref)
        if not isinstance(array, list) or not array:
            raise ValueError(
                "The positional operator did not find the match needed from the query."
            )
        for idx, value in enumerate(array):
            post_value = self.post_at([*self.taken, (str(idx), True)])
            if post_value is _MISSING or not _same(value, post_value):
                return str(idx)
        return "0"

    def apply_array(self, node: _ArrNode, ref: _Ref) -> bool:
        # UpdateArrayNode::apply.
        if self.create:
            raise ValueError("The path must exist in the document in order to apply array updates.")
        array = self.value(ref)
        if not isinstance(array, list):
            raise ValueError("Cannot apply array updates to non-array element")
        identifiers = sorted(node.children, key=_ORDER)
        matching: dict[int, list[Any]] = {}
        for idx, element in enumerate(array):
            for ident in identifiers:
                if ident == "" or self.filter_matches(ident, element, idx):
                    matching.setdefault(idx, []).append(node.children[ident])
        log_themselves = len(matching) <= 1
        noop = True
        modified: list[int] = []
        was_logging = self.logging
        for idx in range(len(array)):
            if idx not in matching:
                continue
            merged = reduce(_merge, matching[idx])
            self.taken.append((str(idx), True))
            if not log_themselves:
                self.logging = False
            try:
                child_noop = self.apply(merged, (array, idx))
            finally:
                self.logging = was_logging
                self.taken.pop()
            noop = noop and child_noop
            if not child_noop:
                modified.append(idx)
        if not log_themselves:
            if len(modified) > 1:
                self.log(self.taken, _Update(self.post_required(self.taken)), None)
            elif len(modified) == 1:
                path = [*self.taken, (str(modified[0]), True)]
                self.log(path, _Update(self.post_required(path)), None)
        return noop

    def filter_matches(self, ident: str, element: Any, idx: int) -> bool:
        if self.filters is None:
            # No arrayFilters given: an element matched if the update changed it.
            post_value = self.post_at([*self.taken, (str(idx), True)])
            return post_value is _MISSING or not _same(element, post_value)
        return self.filters(ident, element)

    def apply_leaf(self, leaf: _Leaf, ref: _Ref) -> bool:
        op = leaf.op
        if op in ("$setOnInsert", _PLACEHOLDER):
            return True  # kInsertOnly on an update; the $rename source placeholder
        if op == "$rename":
            return self.apply_rename(leaf, ref)
        if self.create:
            if op not in _CREATING_OPS:
                return True  # $unset/$pop/$pull/$pullAll of a missing path
            path = self.created_path(ref)
            value = self.post_required(path)
            self.log(path, _Insert(value), len(self.taken))
            self.create_in_work(ref, self.create, value)
            return False
        path = list(self.taken)
        current = self.value(ref)
        if op == "$unset":
            container, key = ref
            if path[-1][1]:
                # $unset of an array element sets it to null.
                self.log(path, _Update(None), None)
                container[key] = None
            else:
                self.log(path, _Delete(), None)
                del container[key]
            return False
        new = self.post_required(path)
        if op == "$push":
            kind, appended = _push_result(leaf.arg, current)
            if kind == "noop":
                return True
            if kind == "append":
                start = len(current)
                for offset in range(appended):
                    element_path = [*path, (str(start + offset), True)]
                    value = self.post_required(element_path)
                    self.log(element_path, _Insert(value), len(path))
                self.set_in_work(ref, new)
                return False
        elif op == "$currentDate":
            pass  # always a new value
        elif op in ("$inc", "$mul", "$bit"):
            if _numeric_identical(current, new):
                return True
        elif _same(current, new):
            return True  # $set $min $max $addToSet $pop $pull $pullAll that changed nothing
        self.log(path, _Update(new), None)
        self.set_in_work(ref, new)
        return False

    def created_path(self, ref: _Ref) -> list[tuple[str, bool]]:
        parent_is_array = isinstance(self.value(ref), list)
        path = [*self.taken, (self.create[0], parent_is_array)]
        path.extend((part, False) for part in self.create[1:])
        return path

    def apply_rename(self, leaf: _Leaf, ref: _Ref) -> bool:
        # RenameNode::apply: a $set of the destination, then an $unset of the source.
        assert leaf.source is not None
        source_parts = leaf.source.split(".")
        container: Any = None
        key: Any = None
        value: Any = self.work
        for part in source_parts:
            if not isinstance(value, dict) or part not in value:
                return True  # no source (through arrays mongod refuses the update)
            container, key, value = value, part, value[part]
        if self.create:
            path = self.created_path(ref)
            new = self.post_required(path)
            self.log(path, _Insert(new), len(self.taken))
            self.create_in_work(ref, self.create, new)
        else:
            path = list(self.taken)
            new = self.post_required(path)
            self.log(path, _Update(new), None)  # no no-op check (SetElementNode)
            self.set_in_work(ref, new)
        self.log([(part, False) for part in source_parts], _Delete(), None)
        del container[key]
        return False


def _push_result(arg: Any, current: Any) -> tuple[str, int]:
    """PushNode::performPush's result: ("noop" | "normal" | "append", number appended)."""
    if not isinstance(current, list):
        raise ValueError("The field must be an array for $push")
    position: int | None = None
    slice_: int | None = None
    sort = False
    if isinstance(arg, Mapping) and "$each" in arg:
        values = list(arg["$each"])
        if "$position" in arg:
            position = int(arg["$position"])
        if "$slice" in arg:
            slice_ = int(arg["$slice"])
        sort = "$sort" in arg
    else:
        values = [arg]
    size = len(current)
    if not values:
        kind = "noop"
    elif size == 0:
        kind = "normal"
    elif position is None or position > size:
        kind = "append"
    else:
        kind = "normal"
    if sort:
        kind = "normal"
    if slice_ is not None and size + len(values) > abs(slice_):
        kind = "normal"
    return kind, len(values)


def _filter_identifier(spec: Mapping[str, Any]) -> str | None:
    for key, value in spec.items():
        if key in ("$and", "$or", "$nor") and isinstance(value, (list, tuple)):
            for sub in value:
                if isinstance(sub, Mapping):
                    found = _filter_identifier(sub)
                    if found is not None:
                        return found
        elif not key.startswith("$"):
            return key.split(".", 1)[0]
    return None


def _compile_filters(filters: ArrayFilters | None) -> Callable[[str, Any], bool] | None:
    if filters is None or callable(filters):
        return filters
    by_identifier: dict[str, Mapping[str, Any]] = {}
    for spec in filters:
        ident = _filter_identifier(spec)
        if ident is None:
            raise ValueError(f"Cannot use an expression without a top-level field name: {spec}")
        by_identifier[ident] = spec

    def matches(ident: str, element: Any) -> bool:
        from pipeline_stages.query_engine import filter_applies

        spec = by_identifier.get(ident)
        if spec is None:
            raise ValueError(f"No array filter found for identifier '{ident}'")
        return bool(filter_applies(spec, {ident: copy.deepcopy(element)}))

    return matches


def modifier_update_diff(
    pre: Mapping[str, Any],
    post: Mapping[str, Any],
    update: Mapping[str, Any],
    *,
    array_filters: ArrayFilters | None = None,
    matched_field: str | None = None,
) -> dict[str, Any] | None:
    """The `diff` of the `$v:2` oplog entry mongod 8.0 writes for the modifier-style `update`
    that turned `pre` into `post`; None when mongod would find it a no-op (no oplog entry).

    `array_filters`: the update command's `arrayFilters` (a list of filter documents, matched
    with the query engine's matcher) or a predicate `(identifier, element) -> bool`; needed for
    `$[<id>]` paths. `matched_field`: the array index (as a string) the query matched, for the
    positional `$`. Both default to a guess from the images (see the module notes).
    """
    tree = _parse_update(update)
    replay = _Replay(pre, post, array_filters, matched_field)
    replay.apply(tree, _ROOT)
    diff = replay.root.serialize()
    return diff or None
