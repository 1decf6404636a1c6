"""`updateDescription` and post-images from `$v:2` oplog diffs, as mongod 7.0/8.0 computes them.

Three jobs, each mirroring one piece of mongod:

* `update_description` — `change_stream_document_diff_parser.cpp` (`parseDiff`) on top of the diff
  readers of `document_diff_serialization.cpp`: the event's `updateDescription`, with the readers'
  validation errors (codes and messages as in the source).
* `legacy_update_description` — the `$v:1` / no-`$v` branch that change streams had up to 6.x.
  7.0/8.0 refuse such entries (6741200); we keep the 6.x behaviour to replay old oplogs.
* `apply_diff` — `document_diff_applier.cpp` (`applyDiff` with
  `mustCheckExistenceForInsertOperations = false`, which is what the post-image stage passes) plus
  the `_id` rule of `ObjectReplaceExecutor::applyReplacementUpdate`: the post-image for
  `fullDocument: whenAvailable|required`.

Diffs and images arrive as Mappings (`RawBSONDocument` from the oplog, or plain dicts); arrays are
lists. Values are passed through untouched, so a nested `RawBSONDocument` stays raw bytes.

The diff readers are lazy in mongod: a document diff checks its own sections when it is opened,
sub-diffs after the first are checked one at a time as the walk reaches them, and array entries
are checked as they are read. Which error a malformed diff produces depends on that order, so the
readers below are lazy in the same way.

Known deviations (none can come from a diff that mongod wrote):
* Duplicate names inside one section, or a path emitted twice, cannot be held by a Python
  Mapping: the last value wins at the first position (what a Python driver decodes from mongod's
  duplicate-field output). Duplicates *across* sections are detected as in mongod (4728000).
* Array diffs whose indexes are not ascending make mongod's applier pad nulls forever until its
  64 MB buffer limit (13548); we raise 13548 at once. Padding that would need more than 64 MB is
  refused up front with the same code; the byte count in that message is our estimate.
* Error messages print a section/prefix character as a whole character, mongod prints one byte.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from itertools import chain
from typing import Any

from bson.dbref import DBRef
from bson.raw_bson import RawBSONDocument

from pipeline_stages.errors import MongoError
from pipeline_stages.value_string import bson_obj_string

__all__ = ["apply_diff", "legacy_update_description", "update_description"]

# Document-diff sections by first character, in the only order mongod accepts them.
_SECTION_ORDER = {"d": 1, "u": 2, "i": 3, "s": 4}
_SUBDIFF_ORDER = 4

# Tags of an opened sub-diff: (tag, opened reader state).
_DOC = 0
_ARR = 1

# Kinds in the applier's per-level table.
_DELETE = 0
_UPDATE = 1
_INSERT = 2
_SUB = 3
_DELETE_MOD = (_DELETE, None)
_INSERT_MOD = (_INSERT, None)

_INT32_MIN = -(2**31)
_INT32_MAX = 2**31 - 1
_UINT32_MAX = 2**32 - 1

# mongod's BufBuilder refuses to grow past 64 MiB (error 13548).
_BUFFER_MAX_SIZE = 64 * 1024 * 1024

_Opened = tuple[Any, ...]


def _err(code: int, msg: str) -> MongoError:
    return MongoError(code, msg)


# ---------------------------------------------------------------------------------------------
# Readers (document_diff_serialization.cpp: DocumentDiffReader / ArrayDiffReader / getReader)
# ---------------------------------------------------------------------------------------------


_PLAIN_MAPPINGS = (dict, RawBSONDocument)


def _is_object(value: Any) -> bool:
    # The exact-type test skips the (slow) ABC check for the two usual classes.
    return type(value) in _PLAIN_MAPPINGS or isinstance(value, Mapping)


def _open_doc(items: Iterator[tuple[str, Any]]) -> _Opened:
    """DocumentDiffReader's constructor: check the sections up to and including the first sub-diff.

    Returns (deletes, updates, inserts, first_subdiff_or_None, remaining_items).
    """
    deletes = updates = inserts = None
    first_sub = None
    prev = 0
    empty = True
    for key, value in items:
        empty = False
        if not key:
            raise _err(4770505, "Expected sections field names in diff to be non-empty ")
        c = key[0]
        order = _SECTION_ORDER.get(c, 0)
        if order <= prev:
            raise _err(4770503, f"Unexpected section: {c} in document diff")
        if not _is_object(value):
            raise _err(4770507, f"Expected {c} section to be type object")
        if order == _SUBDIFF_ORDER:
            # The remaining entries are sub-diffs, checked lazily one by one (nextSubDiff).
            first_sub = (key, value)
            break
        if order == 1:
            deletes = value
        elif order == 2:
            updates = value
        else:
            inserts = value
        prev = order
    if empty:
        raise _err(4770500, "Expected diff to be non-empty")
    return deletes, updates, inserts, first_sub, items


def _open_array(first: tuple[str, Any], items: Iterator[tuple[str, Any]]) -> _Opened:
    """ArrayDiffReader's constructor: header `a: true`, then an optional `l: <int32>`.

    Returns (new_size_or_None, pending_first_entry_or_None, remaining_items).
    """
    name, header = first
    if name != "a":  # unreachable through _open_sub, kept for parity with the reader
        raise _err(4770504, f"Expected first field to be array header a but found {name}")
    if not isinstance(header, bool):
        raise _err(
            4770519, f"Expected array header to be bool but got {_element_str(name, header)}"
        )
    if not header:
        raise _err(
            4770520, f"Expected array header to be value true but got {_element_str(name, header)}"
        )
    pending = next(items, None)
    size = None
    if pending is not None and pending[0] == "l":
        value = pending[1]
        if not _is_int32(value):
            raise _err(4770507, "Expected l section to be type int")
        size = int(value)
        pending = None
    return size, pending, items


def _open_sub(diff: Any) -> tuple[int, _Opened]:
    """getReader: an array diff if the first field is named `a`, else a document diff."""
    items = iter(diff.items())
    first = next(items, None)
    if first is None:
        raise _err(4770500, "Expected diff to be non-empty")
    if first[0] == "a":
        return _ARR, _open_array(first, items)
    return _DOC, _open_doc(chain((first,), items))


def _iter_subdiffs(
    first: tuple[str, Any], rest: Iterator[tuple[str, Any]]
) -> Iterator[tuple[str, Mapping[str, Any]]]:
    """nextSubDiff: (field name, sub-diff) per `s<field>` entry, validated as reached.

    The caller opens each sub-diff (`_open_sub`) before asking for the next, as mongod does.
    """
    yield first[0][1:], first[1]
    for key, value in rest:
        if not key or key[0] != "s":
            raise _err(4770514, f"Did not expect more sections in diff but found one: {key}")
        if not _is_object(value):
            raise _err(470510, f"Subdiffs should be objects, got {_element_str(key, value)}")
        yield key[1:], value


def _parse_index(text: str) -> int:
    """str::parseUnsignedBase10Integer: ASCII digits only, into a 32-bit unsigned int."""
    if text and text.isascii() and text.isdigit():
        idx = int(text)
        if idx <= _UINT32_MAX:
            return idx
    raise _err(4770512, f"Expected integer but got {text}")


def _array_entries(
    pending: tuple[str, Any] | None, rest: Iterator[tuple[str, Any]]
) -> Iterator[tuple[int, tuple[int, _Opened] | None, Any]]:
    """ArrayDiffReader::next: (index, opened sub-diff or None, new value) in diff order."""
    if pending is not None:
        yield _array_entry(pending[0], pending[1])
    for name, value in rest:
        yield _array_entry(name, value)


def _array_entry(name: str, value: Any) -> tuple[int, tuple[int, _Opened] | None, Any]:
    if len(name) < 2:
        raise _err(
            4770521,
            f"expected field name to be at least two characters long, but found: {name}",
        )
    idx = _parse_index(name[1:])
    c = name[0]
    if c == "u":
        return idx, None, value
    if c == "s":
        if not _is_object(value):
            raise _err(
                4770501, f"expected sub diff at index {idx} but got {_element_str(name, value)}"
            )
        return idx, _open_sub(value), None
    raise _err(
        4770502,
        f"Expected either 'u' (update) or 's' (sub diff) at index {idx} "
        f"but got {_element_str(name, value)}",
    )


def _is_int32(value: Any) -> bool:
    # RawBSONDocument decodes int32 as int and int64 as Int64; a plain int in range is what
    # bson.encode would write as int32.
    return type(value) is int and _INT32_MIN <= value <= _INT32_MAX


# ---------------------------------------------------------------------------------------------
# updateDescription (change_stream_document_diff_parser.cpp)
# ---------------------------------------------------------------------------------------------


def _is_ambiguous_name(name: str, first: bool) -> bool:
    """A field name that could be read as something else in a dotted path.

    Dotted names always; strictly numeric names ("0", "12", not "01") unless they are the first
    component (a top-level field cannot be an array index).
    """
    if "." in name:
        return True
    return not first and name.isascii() and name.isdigit() and (len(name) == 1 or name[0] != "0")


class _Describer:
    __slots__ = ("updated", "removed", "truncated", "disambiguated")

    def __init__(self, show_expanded_events: bool) -> None:
        self.updated: dict[str, Any] = {}
        self.removed: list[str] = []
        self.truncated: list[dict[str, Any]] = []
        # Only tracked when the caller will output it.
        self.disambiguated: dict[str, list[Any]] | None = {} if show_expanded_events else None

    def doc(self, opened: _Opened, prefix: str, comps: tuple[Any, ...], ambiguous: bool) -> None:
        deletes, updates, inserts, first_sub, rest = opened
        first = not comps
        updated = self.updated
        disamb = self.disambiguated
        for section in (updates, inserts):
            if not section:
                continue
            if disamb is None:
                if first:
                    updated.update(section.items())
                else:
                    for name, value in section.items():
                        updated[prefix + name] = value
            else:
                for name, value in section.items():
                    path = prefix + name
                    updated[path] = value
                    if ambiguous or _is_ambiguous_name(name, first):
                        disamb[path] = [*comps, name]
        if deletes:
            for name in deletes:
                path = prefix + name
                self.removed.append(path)
                if disamb is not None and (ambiguous or _is_ambiguous_name(name, first)):
                    disamb[path] = [*comps, name]
        if first_sub is None:
            return
        for name, value in _iter_subdiffs(first_sub, rest):
            child_amb = disamb is not None and (ambiguous or _is_ambiguous_name(name, first))
            self.sub(value, name, prefix, comps, child_amb)

    def sub(
        self,
        value: Mapping[str, Any],
        name: str,
        prefix: str,
        comps: tuple[Any, ...],
        ambiguous: bool,
    ) -> None:
        tag, child = _open_sub(value)
        if tag == _DOC:
            self.doc(child, prefix + name + ".", (*comps, name), ambiguous)
        else:
            self.array(child, prefix + name, (*comps, name), ambiguous)

    def array(self, opened: _Opened, path: str, comps: tuple[Any, ...], ambiguous: bool) -> None:
        size, pending, rest = opened
        # Inside an array only an ambiguous parent path can make a path ambiguous.
        disamb = self.disambiguated if ambiguous else None
        if size is not None:
            self.truncated.append({"field": path, "newSize": size})
            if disamb is not None:
                disamb[path] = list(comps)
        for idx, sub, value in _array_entries(pending, rest):
            if sub is None:
                child_path = f"{path}.{idx}"
                self.updated[child_path] = value
                if disamb is not None:
                    disamb[child_path] = [*comps, idx]
            else:
                tag, child = sub
                # An array index never makes a path ambiguous by itself.
                if tag == _DOC:
                    self.doc(child, f"{path}.{idx}.", (*comps, idx), ambiguous)
                else:
                    self.array(child, f"{path}.{idx}", (*comps, idx), ambiguous)


def update_description(diff: Mapping[str, Any], show_expanded_events: bool) -> dict[str, Any]:
    """The `updateDescription` of an update event whose oplog entry is `{$v: 2, diff: <diff>}`.

    Keys in mongod's order: updatedFields, removedFields, truncatedArrays, and — only with
    `showExpandedEvents` — disambiguatedPaths (always present then, possibly `{}`).
    `updatedFields` is in traversal order: at each level the `u` entries, then `i`, then the
    sub-diffs depth-first; array entries in diff order.
    """
    d = _Describer(show_expanded_events)
    # parseDiff opens the root as a document diff directly (never as an array diff).
    d.doc(_open_doc(iter(diff.items())), "", (), False)
    out: dict[str, Any] = {
        "updatedFields": d.updated,
        "removedFields": d.removed,
        "truncatedArrays": d.truncated,
    }
    if d.disambiguated is not None:
        out["disambiguatedPaths"] = d.disambiguated
    return out


_MISSING = object()


def legacy_update_description(o: Mapping[str, Any]) -> dict[str, Any]:
    """`updateDescription` for a `$v:1` (or `$v`-less) modifier update, as MongoDB <= 6.x built it.

    `updatedFields` is `o.$set` as recorded (dotted paths allowed), `{}` if absent; `removedFields`
    the names in `o.$unset` (only if it is an object). No `truncatedArrays` and no
    `disambiguatedPaths` existed on this path. 7.0/8.0 reject such entries with 6741200; we accept
    them to replay old oplogs (documented deviation, decided by the caller).
    """
    updated = o.get("$set", _MISSING)
    unset = o.get("$unset")
    return {
        "updatedFields": {} if updated is _MISSING else updated,
        "removedFields": list(unset) if isinstance(unset, Mapping) else [],
    }


# ---------------------------------------------------------------------------------------------
# Post-image (document_diff_applier.cpp, mustCheckExistenceForInsertOperations = false)
# ---------------------------------------------------------------------------------------------


def apply_diff(pre_image: Mapping[str, Any], diff: Mapping[str, Any]) -> dict[str, Any]:
    """The post-image: `pre_image` with the `$v:2` `diff` applied, field order as mongod.

    Per document level: fields keep their pre-image order; `d` fields are dropped; `u` fields are
    replaced in place; a sub-diff rewrites its field in place (or sets it to null when the
    pre-image value is not an object/array as the sub-diff expects); then the `u` fields that were
    absent and all `i` fields are appended in diff order. A level with only inserts appends them
    without looking at the pre-image. A post-image without `_id` keeps the pre-image's `_id` first.
    """
    post = _apply_doc(pre_image, _open_doc(iter(diff.items())))
    if "_id" not in post and "_id" in pre_image:
        post = {"_id": pre_image["_id"], **post}
    return post


def _duplicate(name: str) -> MongoError:
    return _err(4728000, f"duplicate field name in diff: {name}")


def _apply_doc(pre: Mapping[str, Any], opened: _Opened) -> dict[str, Any]:
    deletes, updates, inserts, first_sub, rest = opened
    # buildObjDiffTables (7.0+): deletes, updates, sub-diffs, then inserts; a repeated name fails.
    table: dict[str, tuple[int, Any]] = {}
    if deletes:
        for name in deletes:
            if name in table:
                raise _duplicate(name)
            table[name] = _DELETE_MOD
    if updates:
        for name, value in updates.items():
            if name in table:
                raise _duplicate(name)
            table[name] = (_UPDATE, value)
    if first_sub is not None:
        for name, sub in _iter_subdiffs(first_sub, rest):
            if name in table:
                raise _duplicate(name)
            table[name] = (_SUB, _open_sub(sub))

    if not table:
        # Insert-only level: mongod appends the inserts to the unchanged pre-image without
        # checking whether they exist (so a clash would duplicate a field; here the dict keeps
        # the old position with the new value, which is what a Python driver would decode).
        out = dict(pre.items())
        if inserts:
            out.update(inserts.items())
        return out

    if inserts:
        for name in inserts:
            if name in table:
                raise _duplicate(name)
            table[name] = _INSERT_MOD

    out = {}
    for name, value in pre.items():
        mod = table.get(name)
        if mod is None:
            out[name] = value
            continue
        kind = mod[0]
        if kind == _UPDATE:
            out[name] = mod[1]
        elif kind == _SUB:
            out[name] = _apply_sub(value, mod[1])
        # _DELETE: dropped. _INSERT: dropped here, appended below.

    # Updates of fields the pre-image lacked, then every insert, in diff order.
    if updates:
        for name, value in updates.items():
            if name not in pre:
                out[name] = value
    if inserts:
        out.update(inserts.items())
    return out


def _apply_sub(value: Any, sub: tuple[int, _Opened]) -> Any:
    """A sub-diff applied to an existing value; null when the value has the wrong type."""
    tag, opened = sub
    if tag == _DOC:
        if isinstance(value, Mapping):
            return _apply_doc(value, opened)
        if isinstance(value, DBRef):  # a {$ref, $id} sub-document decoded into a plain dict
            return _apply_doc(value.as_doc(), opened)
    elif isinstance(value, (list, tuple)):
        return _apply_array(value, opened)
    # The pre-image disagrees with the diff (a later oplog entry rewrites this field anyway).
    return None


def _apply_array(pre: list[Any] | tuple[Any, ...], opened: _Opened) -> list[Any]:
    size, pending, rest = opened
    entries = _array_entries(pending, rest)
    n = len(pre)
    # mongod compares the unsigned index with the int new size, so a negative `l` never limits.
    limit = n if size is None or size < 0 else min(n, size)

    out: list[Any] = []
    pos = 0
    nxt = next(entries, None)
    # Indexes inside the (possibly truncated) pre-image: copy runs of untouched elements.
    while nxt is not None and nxt[0] < limit:
        idx = nxt[0]
        if idx < pos:
            raise _unordered_array_diff()
        out.extend(pre[pos:idx])
        out.append(nxt[2] if nxt[1] is None else _apply_sub(pre[idx], nxt[1]))
        pos = idx + 1
        nxt = next(entries, None)
    out.extend(pre[pos:limit])

    # Beyond it: entries at their indexes (a sub-diff on a missing element gives null), unmentioned
    # indexes padded with null, up to the new size if there is one.
    cur = limit
    while True:
        if nxt is not None:
            idx = nxt[0]
            if idx < cur:
                raise _unordered_array_diff()
            _check_array_length(idx + 1)
            if idx > cur:
                out.extend([None] * (idx - cur))
            out.append(nxt[2] if nxt[1] is None else None)
            cur = idx + 1
            nxt = next(entries, None)
        elif size is not None and (size < 0 or cur < size):
            if size < 0:
                raise _buffer_overflow(_BUFFER_MAX_SIZE + 1)
            _check_array_length(size)
            out.extend([None] * (size - cur))
            cur = size
        else:
            return out


def _null_array_bytes(length: int) -> int:
    """BSON bytes of `length` null elements: type byte + decimal index + NUL each."""
    total = 0
    digits = 1
    low = 0
    while low < length:
        high = min(length, 10**digits)
        total += (high - low) * (digits + 2)
        low = high
        digits += 1
    return total


def _check_array_length(length: int) -> None:
    if length > 1_000_000:  # cheap pre-check; the exact estimate only for big arrays
        needed = _null_array_bytes(length)
        if needed > _BUFFER_MAX_SIZE:
            raise _buffer_overflow(needed)


def _buffer_overflow(size: int) -> MongoError:
    return _err(13548, f"BufBuilder attempted to grow() to {size} bytes, past the 64MB limit.")


def _unordered_array_diff() -> MongoError:
    # mongod's applier never matches an index below its cursor and pads nulls until its buffer
    # limit; the outcome is this error, so raise it without the wait.
    return _buffer_overflow(_BUFFER_MAX_SIZE + 1)


# ---------------------------------------------------------------------------------------------
# BSONElement::toString, for the elements that reader errors quote
# ---------------------------------------------------------------------------------------------


def _element_str(name: str, value: Any) -> str:
    return f"{name}: {bson_obj_string(value)}"
