"""Query execution of the embedded store: collection scans that cost O(N), yield to the event
loop, and end with 50 MaxTimeMSExpired when the command's `maxTimeMS` passes.

mongod's plan executors yield between documents and check the operation's deadline there; here
each scan is a generator that pauses every few documents, driven either synchronously (inside a
write, which must not interleave with other commands) or asynchronously: the async driver gives
the loop a turn every `YIELD_AFTER_S` of work and checks the deadline at every pause.

A scan reads a list of the collection's documents taken at its start (references: the store
replaces a document on write and never changes one in place), so yielding cannot expose a
half-applied write or another session's transaction.

What a filter matches, a projection keeps and how values sort are the engine's (engine.py);
regexes are compiled once per filter (pipeline_stages/regex.py; embedded/regex.py runs the
ones RE2 cannot in a worker process when a scan is offloaded).
"""

from __future__ import annotations

import asyncio
import datetime
import math
import time
from collections.abc import (
    Awaitable,
    Callable,
    Generator,
    Iterable,
    Iterator,
    Mapping,
    Sequence,
)
from contextvars import ContextVar, Token
from typing import Any

from bson.decimal128 import Decimal128
from bson.int64 import Int64
from bson.objectid import ObjectId

from cdcserver.embedded import engine, regex
from pipeline_stages import bson_bytes, collation, keystring
from pipeline_stages.errors import MongoError

YIELD_AFTER_S = 0.005  # work between two turns of the event loop
CHECK_EVERY = 64  # documents between two looks at the clock
# Awaited at every pause of an async scan (tests use it to hold a scan part-way).
pause_hook: Callable[[], Awaitable[None]] | None = None
# Documents looked at and documents copied by scans (tests check that a scan is linear).
stats = {"examined": 0, "copied": 0, "pauses": 0}


class Deadline:
    """A command's `maxTimeMS` (none when absent or 0)."""

    def __init__(self, max_time_ms: Any = None) -> None:
        self.at: float | None = None
        if isinstance(max_time_ms, (int, float)) and not isinstance(max_time_ms, bool) and (
            max_time_ms > 0
        ):
            self.at = time.monotonic() + float(max_time_ms) / 1000

    @classmethod
    def of(cls, cmd: Mapping[str, Any]) -> Deadline:
        return cls(cmd.get("maxTimeMS"))

    def check(self, now: float | None = None) -> None:
        if self.at is not None and (time.monotonic() if now is None else now) >= self.at:
            raise MongoError(50, "operation exceeded time limit")


NO_DEADLINE = Deadline()
Scan = Iterator[None]  # a scan step by step: each `next` is a point where it may pause


# Yielded first by a scan whose filter backtracks (engine.backtracks): the rest of it runs in
# a thread, its regex matches in a worker process that its deadline can stop (regex.py).
OFFLOAD: Any = object()


def run_sync(scan: Scan, deadline: Deadline = NO_DEADLINE) -> None:
    """Run a scan to its end without pausing (inside a write), checking the deadline."""
    for n, _ in enumerate(scan):
        if deadline.at is not None and n % 8 == 0:
            deadline.check()


def _run_offloaded(scan: Scan, deadline: Deadline) -> None:
    # this thread's (copied) context only: the same regexes stay in-process everywhere else
    regex.backtracking_deadline.set(deadline.at)
    run_sync(scan, deadline)


async def run_async(scan: Scan, deadline: Deadline = NO_DEADLINE) -> None:
    """Run a scan, giving the event loop a turn every YIELD_AFTER_S of work."""
    started = time.monotonic()
    deadline.check(started)
    for step in scan:
        if step is OFFLOAD:
            await asyncio.to_thread(_run_offloaded, scan, deadline)
            return
        now = time.monotonic()
        deadline.check(now)
        if now - started >= YIELD_AFTER_S:
            await pause()
            started = time.monotonic()
            deadline.check(started)


async def pause() -> None:
    stats["pauses"] += 1
    hook = pause_hook
    if hook is not None:
        await hook()
    await asyncio.sleep(0)


# ---------------------------------------------------------------------------------------------
# Scans


def select(
    docs: Iterable[Mapping[str, Any]], filter_doc: Mapping[str, Any] | None, out: list[Any],
    stop: int | None = None, collation: Collation | None = None,
) -> Scan:
    """The documents `filter_doc` matches, appended to `out` (at most `stop`)."""
    if stop is not None and stop <= 0:
        return
    match = matcher(filter_doc, collation)
    if engine.backtracks(filter_doc):
        yield OFFLOAD
    filtering = bool(filter_doc)
    n = 0
    for doc in docs:
        n += 1
        if not filtering or match(doc):
            out.append(doc)
            if stop is not None and len(out) >= stop:
                break
        if n % CHECK_EVERY == 0:
            stats["examined"] += CHECK_EVERY
            yield
    stats["examined"] += n % CHECK_EVERY


def matcher(
    filter_doc: Mapping[str, Any] | None, collation: Collation | None
) -> Callable[[Any], bool]:
    """A predicate for `filter_doc` under `collation` (None: binary comparisons)."""
    if collation is None or not filter_doc:
        general = engine.matcher(filter_doc)  # parse errors as written, before any document
        return compile_equalities(filter_doc, general) or general
    engine.matcher(filter_doc)  # parse errors as written
    return collation.matcher(filter_doc)


# The operand types an equality is compiled for, with the document value types it can equal
# as the general matcher (mongomock's `doc_val == search`) compares them today, so that both
# decide alike: numbers across int, long and double, and booleans equal to 0 and 1 as Python
# has them (mongod keeps booleans apart: a change for the engine, not for this predicate);
# a Code is no string. Any other value in a document is not equal, but for a Decimal128 and
# an ObjectId operand's arrays (the general matcher decides those) and an array (its
# elements, one level down).
_NUMBER_TYPES = frozenset({int, Int64, float, bool})
_EQUAL_TYPES: dict[type, frozenset[type]] = {
    int: _NUMBER_TYPES, Int64: _NUMBER_TYPES, float: _NUMBER_TYPES, bool: _NUMBER_TYPES,
    str: frozenset({str}), ObjectId: frozenset({ObjectId}),
    datetime.datetime: frozenset({datetime.datetime}),
}
_MISSING: Any = object()


def compile_equalities(
    filter_doc: Mapping[str, Any] | None, general: Callable[[Any], bool],
) -> Callable[[Any], bool] | None:
    """A predicate for a filter made only of top-level equalities to scalars (`{u: 5, s:
    "x"}`), compiled once per query: one dict lookup and one comparison per field, where the
    general matcher walks the filter for every document. None for any other filter. A
    document holding a value it does not decide (a Decimal128) is matched by `general`."""
    if not filter_doc:
        return None
    tests: list[tuple[str, Any, frozenset[type]]] = []
    for path, operand in filter_doc.items():
        if not isinstance(path, str) or not path or path.startswith("$") or "." in path:
            return None
        if isinstance(operand, Mapping) and len(operand) == 1 and "$eq" in operand:
            operand = operand["$eq"]
        kinds = _EQUAL_TYPES.get(type(operand))
        if kinds is None or (type(operand) is float and math.isnan(operand)) or (
                type(operand) is datetime.datetime and operand.tzinfo is not None):
            return None  # NaN equals NaN; stored dates are naive (normalize)
        tests.append((path, operand, kinds))

    def equal(value: Any, operand: Any, kinds: frozenset[type]) -> bool | None:
        kind = type(value)
        if kind in kinds:
            return bool(value == operand)
        if kind is list:
            if type(operand) is ObjectId:
                return None  # mongomock also matches its hex string in an array
            undecided = False
            for element in value:
                inner = type(element)
                if inner in kinds:
                    if element == operand:
                        return True
                elif inner is Decimal128:
                    undecided = True
            return None if undecided else False
        return None if kind is Decimal128 else False

    if len(tests) == 1:
        ((path, operand, kinds),) = tests

        def match_one(doc: Mapping[str, Any]) -> bool:
            value = doc.get(path, _MISSING)
            kind = type(value)
            if kind in kinds:
                return bool(value == operand)
            found = equal(value, operand, kinds)
            return general(doc) if found is None else found

        return match_one

    def match_all(doc: Mapping[str, Any]) -> bool:
        for path, operand, kinds in tests:
            found = equal(doc.get(path, _MISSING), operand, kinds)
            if found is None:
                return general(doc)
            if not found:
                return False
        return True

    return match_all


def find(
    docs: Sequence[Mapping[str, Any]], filter_doc: Mapping[str, Any] | None,
    sort: list[tuple[str, int]] | None, skip: int, limit: int, out: list[Any],
    project: Callable[[Mapping[str, Any]], Any] | None = None, copy: bool = False,
    collation: Collation | None = None,
) -> Scan:
    """`find`: filter, sort, skip, limit, then project (or copy) each document into `out`."""
    matched: list[Any] = []
    stop = skip + limit if limit and not sort else None
    if filter_doc or stop is not None:
        yield from select(docs, filter_doc, matched, stop, collation)
    else:
        engine.matcher(filter_doc)
        matched = list(docs)
    if sort:
        matched = yield from sorted_documents(matched, sort, collation)
    if skip:
        matched = matched[skip:]
    if limit:
        matched = matched[:limit]
    if project is None and not copy:
        out.extend(matched)
        return
    transform = project if project is not None else engine.copy_document
    for n, doc in enumerate(matched, 1):
        out.append(transform(doc))
        if n % CHECK_EVERY == 0:
            stats["copied"] += CHECK_EVERY
            yield
    stats["copied"] += len(matched) % CHECK_EVERY


# Stages that map each document on its own: a pipeline's leading run of them runs over
# chunks of documents with pauses between chunks (the rest runs over all at once).
_PER_DOCUMENT = frozenset({
    "$match", "$project", "$addFields", "$set", "$unset", "$replaceRoot", "$replaceWith",
    "$unwind", "$redact",
})
PIPELINE_CHUNK = 256


def _per_document(stage: Any) -> bool:
    return isinstance(stage, Mapping) and len(stage) == 1 and next(iter(stage)) in _PER_DOCUMENT


def _simple_sort(stage: Any) -> list[tuple[str, int]] | None:
    """A `$sort` stage's fields when they are plain 1 / -1 (the store sorts those itself,
    as find does; anything else is the query engine's to run or refuse)."""
    if not isinstance(stage, Mapping) or len(stage) != 1 or "$sort" not in stage:
        return None
    spec = stage["$sort"]
    if not isinstance(spec, Mapping) or not spec:
        return None
    out = []
    for path, direction in spec.items():
        if type(direction) is not int or direction not in (1, -1) or not path or (
            path.startswith("$")
        ):
            return None
        out.append((path, direction))
    return out


def pipeline(docs: list[Any], database: Any, stages: list[Any], out: list[Any],
             collation: Collation | None = None) -> Scan:
    """An aggregation pipeline over `docs`, into `out`: runs of per-document stages over
    chunks of documents, `$sort` by the store's sort keys (in steps, under `collation`), the
    other stages by the query engine at once."""
    current = list(docs)
    if not stages:
        out.extend(engine.run_pipeline(current, database, []))
        return
    stages = engine.bind_system_variables(stages)  # one $$NOW for the whole command
    i = 0
    while i < len(stages):
        j = i
        while j < len(stages) and _per_document(stages[j]):
            j += 1
        if j > i:
            head, mapped = stages[i:j], []
            for start in range(0, len(current), PIPELINE_CHUNK):
                mapped.extend(engine.run_pipeline(current[start:start + PIPELINE_CHUNK],
                                                  database, head))
                yield
            if not current:  # the stages still parse (and fail) without documents
                engine.run_pipeline([], database, head)
            current, i = mapped, j
            continue
        sort = _simple_sort(stages[i])
        if sort is not None:
            current = yield from sorted_documents(current, sort, collation)
            i += 1
            continue
        j = i + 1
        while j < len(stages) and not _per_document(stages[j]) and (
            _simple_sort(stages[j]) is None
        ):
            j += 1
        current = engine.run_pipeline(current, database, stages[i:j])
        i = j
        yield
    out.extend(current)


_NULL_KEY = keystring.encode_values((None,))[0]
_EMPTY_ARRAY_KEY = bytes([keystring.UNDEFINED, 4])  # an empty array sorts before null


def sort_key(doc: Mapping[str, Any], path: str, descending: bool,
             collation: Collation | None = None) -> bytes:
    """mongod's sort key of `doc` for one field: the KeyString of the value at `path` (the
    least element of an array ascending, the greatest descending; missing is null)."""
    values: list[Any] = []
    values_along_path(doc, path.split("."), values, expand_trailing=False)
    if collation is not None:
        values = [_plain_keys(collation.value(v)) for v in values]
    keys: list[bytes] = []
    for value in values:
        if isinstance(value, list):
            if not value:
                keys.append(_EMPTY_ARRAY_KEY)
            keys.extend(keystring.encode_values((v,))[0] for v in value)
        else:
            keys.append(keystring.encode_values((value,))[0])
    if not keys:
        return _NULL_KEY
    return max(keys) if descending else min(keys)


def sorted_documents(
    docs: list[Any], sort: list[tuple[str, int]], collation: Collation | None = None,
) -> Generator[None, None, list[Any]]:
    """`docs` in `sort` order (stable: ties keep natural order). Keys are KeyStrings, computed
    in steps; the sort itself compares bytes."""
    out = list(docs)
    for path, direction in reversed(sort):
        if path == "$natural":
            if direction < 0:
                out.reverse()
            continue
        keys: list[bytes] = []
        for n, doc in enumerate(out, 1):
            keys.append(sort_key(doc, path, direction < 0, collation))
            if n % CHECK_EVERY == 0:
                yield
        order = sorted(range(len(out)), key=keys.__getitem__, reverse=direction < 0)
        out = [out[i] for i in order]
    return out


def values_along_path(
    value: Any, parts: list[str], out: list[Any], expand_trailing: bool = True
) -> None:
    """The values at a dotted path (mongod's extractAllElementsAlongPath): arrays on the way
    are traversed, a numeric component also indexes an array; an array at the end is expanded
    one level when `expand_trailing`."""
    if not parts:
        if expand_trailing and isinstance(value, list):
            out.extend(value)
        else:
            out.append(value)
        return
    head = parts[0]
    if isinstance(value, Mapping):
        if head in value:
            values_along_path(value[head], parts[1:], out, expand_trailing)
        return
    if isinstance(value, list):
        if head.isdigit() and int(head) < len(value):
            values_along_path(value[int(head)], parts[1:], out, expand_trailing)
        for element in value:
            if isinstance(element, Mapping):
                values_along_path(element, parts, out, expand_trailing)


def distinct(docs: Iterable[Mapping[str, Any]], key: str, out: list[Any],
             collation: Collation | None = None) -> Scan:
    """`distinct`'s values: equal ones (under the collation, if any) once, the first met, in
    BSON order, as mongod returns its BSONElementSet."""
    parts = key.split(".")
    seen: dict[bytes, Any] = {}
    n = 0
    for doc in docs:
        n += 1
        values: list[Any] = []
        values_along_path(doc, parts, values)
        for value in values:
            keyed = value if collation is None else _plain_keys(collation.value(value))
            seen.setdefault(keystring.encode_values((keyed,))[0], value)
        if n % CHECK_EVERY == 0:
            stats["examined"] += CHECK_EVERY
            yield
    stats["examined"] += n % CHECK_EVERY
    out.extend(seen[k] for k in sorted(seen))


# ---------------------------------------------------------------------------------------------
# Writes: a multi-document update or delete runs synchronously (its writes must not interleave
# with other commands), so the matching, the part that can be long, runs before it in steps:
# which documents match each statement's filter, remembered by identity. The write re-uses a
# document's answer only if the document is still the very same object (the store replaces a
# document on write), and matches any other document itself.

Prematched = dict[int, tuple[Any, bool]]
_prematched: ContextVar[dict[bytes, Prematched] | None] = ContextVar("prematched", default=None)


def filter_key(filter_doc: Mapping[str, Any], collation: Collation | None = None) -> bytes | None:
    try:
        return bson_bytes.encode({"q": filter_doc, "c": collation.spec if collation else None})
    except Exception:  # noqa: BLE001 - a filter the store cannot encode is matched later
        return None


def classify(docs: Iterable[Mapping[str, Any]], filter_doc: Mapping[str, Any],
             out: Prematched, collation: Collation | None = None) -> Scan:
    match = matcher(filter_doc, collation)
    if engine.backtracks(filter_doc):
        yield OFFLOAD
    n = 0
    for doc in docs:
        n += 1
        out[id(doc)] = (doc, match(doc))
        if n % CHECK_EVERY == 0:
            stats["examined"] += CHECK_EVERY
            yield
    stats["examined"] += n % CHECK_EVERY


def remember_prematched(known: dict[bytes, Prematched]) -> Token[Any]:
    return _prematched.set(known)


def forget_prematched(token: Token[Any]) -> None:
    _prematched.reset(token)


def prematched(filter_doc: Mapping[str, Any],
               collation: Collation | None = None) -> Prematched | None:
    known = _prematched.get()
    if not known:
        return None
    key = filter_key(filter_doc, collation)
    return None if key is None else known.get(key)


# ---------------------------------------------------------------------------------------------
# Collation: strings compared by their collation key where a command (or the collection's
# default) asks for an ICU collation. The key approximates ICU's: base letters case-folded,
# then diacritics (strength 2+), then case (strength 3+, or caseLevel), caseFirst "upper"
# and numericOrdering honoured; code point order within a level, where ICU has its own
# alphabet for punctuation and scripts; strengths 4 and 5 compare as 3, alternate "shifted"
# is not applied. Regexes ignore collation, as in mongod.

CollatedStr = collation.CollatedStr


class Collation(collation.Collation):
    """pipeline_stages/collation.py's (shared with change streams' $match), with a matcher
    for the store's filters."""

    def matcher(self, filter_doc: Mapping[str, Any] | None) -> Callable[[Any], bool]:
        match = engine.matcher(self.filter(filter_doc or {}))
        return lambda doc: match(self.value(doc))


def collation_of(spec: Any, default: Any = None, where: str = "find") -> Collation | None:
    """The collation a command asks for (else the collection's default), None for simple
    (binary) comparisons. An empty `{}` asks for nothing, as mongod reads it (the default)."""
    if spec is None or (isinstance(spec, Mapping) and not spec):
        spec = default
        where = "create"
    parsed = collation.parse_collation(spec, where)
    if parsed is None:
        return None
    return Collation(parsed.strength, parsed.case_level, parsed.upper_first, parsed.numeric)


def _plain_keys(value: Any) -> Any:
    if isinstance(value, CollatedStr):
        return str.__str__(value)
    if isinstance(value, dict):
        return {k: _plain_keys(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_plain_keys(v) for v in value]
    return value
