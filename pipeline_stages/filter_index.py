"""Filter groups: change streams that differ only in their filter share all other work.

Streams on one source with the same spec apart from their user stages (same scope, namespace,
`fullDocument`, `fullDocumentBeforeChange`, `showExpandedEvents`, ...) and no resume point form
a `FilterGroup`. One producer pipeline (the spec without user stages) matches, unwinds,
transforms, looks up images and drops non-classic events once per entry; its events, just
before the user stages, go to the `FilterIndex`, which finds the streams whose leading `$match`
can accept each event without asking the others.

Correctness does not rest on the index: it only picks *candidates*, a superset of the streams
whose `$match` accepts the event, and every candidate's whole leading `$match` then runs exactly
as its own pipeline would run it (same engine, same converted document). So a stream sees
exactly the events, bytes and post-batch tokens its own pipeline gives. The index must never
miss a stream whose `$match` would accept an event; where that is doubtful it keeps the stream
a candidate:

- indexed predicates (the *cover* of a filter): equality / `$eq` / `$in` with strings, numbers
  (int, long, double, decimal: equal values of different types share one key, as `5`, `5.0`,
  `Int64(5)` and `Decimal128("5")` are equal in a query), booleans and ObjectIds, on any field
  path (`operationType`, `ns.db`, `ns.coll`, `documentKey._id`, `fullDocument.<path>`, ...),
  plus `$exists: true` on `updateDescription.updatedFields.<path>`; a conjunction uses its most
  selective indexed predicate, an `$or` the union of its branches' covers;
- an event's keys for a path are every value reachable through it, descending through arrays
  of subdocuments and into arrays at the end (array matching), so `{"fullDocument.u": 5}`
  finds `u: [1, 5]` and `u: [{...}]` paths;
- `null` (which matches missing fields), NaN, documents, arrays, regexes, dates, numeric paths
  (`a.0`) and every other operator are not indexed: a filter without an indexed predicate, or
  with an operator whose evaluation could raise on some event (`$expr`, `$where`, `$regex`,
  ...), is evaluated on every event, as today;
- an event holding a value whose comparison can raise (a decimal NaN) is evaluated by every
  stream's filter, so the stream that would raise does.

Streams with the same filter share one *slot*: the filter runs once per event for all of them,
and an event they take as it is (no stages after the `$match`) is encoded once and queued by
reference in each. Streams with more stages run them on their own events.
"""

from __future__ import annotations

import dataclasses
import decimal
from collections.abc import Hashable, Iterable, Mapping
from typing import Any

from bson.int64 import Int64
from bson.objectid import ObjectId
from bson.timestamp import Timestamp

from pipeline_stages import bson_bytes
from pipeline_stages.image_source import ImageSource
from pipeline_stages.lookups import ExternalImages, LookupAnswers, NeedsLookup
from pipeline_stages.oplog_entry import Entry, encode_in_order
from pipeline_stages.pipeline import ChangeStreamPipeline, encode_events
from pipeline_stages.spec import ChangeStreamSpec
from pipeline_stages.unwind_transaction import TransactionHistory
from pipeline_stages.user_stages import _PLAIN, _Match, _without_missing, match_prefilter

__all__ = [
    "FilterGroup", "FilterIndex", "compile_cover", "group_key", "ready_to_join", "split_filter",
]

# -- the cover of a filter ----------------------------------------------------------------------

UPDATED_FIELDS = "updateDescription.updatedFields."
_PRESENCE = "\0updatedFields"  # the pseudo-path of `$exists: true` on updatedFields.<path>

# Types of event values looked up in a path's table: Python equality between them (what the
# query engine uses) implies equal hashes, so a dict lookup finds every equal key.
_LOOKUP_TYPES = frozenset({str, int, Int64, bool, float, decimal.Decimal, ObjectId})

Atom = tuple[str, frozenset[Hashable]]  # (path or _PRESENCE, keys)
Cover = list[Atom]  # the event can match only if some atom finds one of its keys


def _keys_for(value: Any) -> frozenset[Hashable] | None:
    """Index keys for a query value, None if it cannot be indexed."""
    t = type(value)
    if t is str or t is bool or isinstance(value, int):
        return frozenset((value,))
    if t is float:
        return None if value != value else frozenset((value,))  # NaN equals NaN in a query
    if t is decimal.Decimal:
        return None if value.is_nan() else frozenset((value,))
    if t is ObjectId:
        # The engine also takes an ObjectId as equal to an array holding its hex string.
        return frozenset((value, str(value)))
    return None


def _safe_value(value: Any) -> bool:
    """A value whose comparison with any event value cannot raise (beside a decimal NaN an
    event may hold, which `plain_event` reports)."""
    return value is None or _keys_for(value) is not None


def _path_parts(path: str) -> list[str] | None:
    """The parts of a field path the index can follow, None if doubtful (a numeric part is an
    array position to the engine)."""
    parts = path.split(".")
    for part in parts:
        if not part or part.startswith("$"):
            return None
        try:
            int(part)
        except ValueError:
            continue
        return None
    return parts


def _safe_query(query: Any) -> bool:
    """Whether every predicate in `query` is one whose evaluation cannot raise, so that a
    stream that is not a candidate may skip it: equality, `$eq`, `$ne`, `$in`, `$nin` with
    scalar values, `$exists`, `$gt`/`$gte`/`$lt`/`$lte` with a number or a string, and
    `$and`/`$or`/`$nor` of those."""
    if not isinstance(query, Mapping):
        return False
    for key, condition in query.items():
        if key in ("$and", "$or", "$nor"):
            if not isinstance(condition, list) or not condition:
                return False
            if not all(_safe_query(q) for q in condition):
                return False
        elif key == "$comment":
            continue
        elif not isinstance(key, str) or key.startswith("$") or _path_parts(key) is None:
            return False
        elif isinstance(condition, Mapping):
            if not condition or not all(str(op).startswith("$") for op in condition):
                return False  # an embedded document's equality
            for op, arg in condition.items():
                if op in ("$eq", "$ne"):
                    if not _safe_value(arg):
                        return False
                elif op in ("$in", "$nin"):
                    if not isinstance(arg, list) or not all(_safe_value(v) for v in arg):
                        return False
                elif op == "$exists":
                    if type(arg) not in (bool, int, float):
                        return False
                elif op in ("$gt", "$gte", "$lt", "$lte"):
                    # Compared only with values of the same kind; a decimal NaN, the one such
                    # value whose ordering raises, makes every filter run (`plain_event`).
                    if type(arg) is bool or _keys_for(arg) is None or type(arg) is ObjectId:
                        return False
                else:
                    return False
        elif not _safe_value(condition):
            return False
    return True


def _rank(atom: Atom) -> int:
    path = atom[0]
    if path == "documentKey._id":
        return 0
    if path in ("ns.coll", "ns.db"):
        return 3 if path == "ns.coll" else 4
    if path == "operationType":
        return 5
    if path == _PRESENCE:
        return 2
    return 1


def _score(cover: Cover) -> tuple[int, int]:
    return max(_rank(a) for a in cover) if cover else 0, sum(len(a[1]) for a in cover)


def _field_cover(path: str, condition: Any) -> Cover | None:
    if isinstance(condition, Mapping):
        options: list[Cover] = []
        for op, arg in condition.items():
            if op == "$eq":
                keys = _keys_for(arg)
                if keys is not None:
                    options.append([(path, keys)])
            elif op == "$in" and isinstance(arg, list):
                key_sets = [_keys_for(v) for v in arg]
                if all(k is not None for k in key_sets):
                    options.append([(path, frozenset().union(*key_sets))])  # type: ignore[arg-type]
            elif op == "$exists" and arg and path.startswith(UPDATED_FIELDS):
                first = path[len(UPDATED_FIELDS):].split(".")[0]
                options.append([(_PRESENCE, frozenset((first,)))])
        return min(options, key=_score) if options else None
    keys = _keys_for(condition)
    return None if keys is None else [(path, keys)]


def compile_cover(query: Mapping[str, Any]) -> Cover | None:
    """The cover of a `$match` filter: atoms such that every event the filter accepts has a
    key in one of them; None when the filter cannot be indexed (it runs on every event)."""
    if not _safe_query(query):
        return None
    return _conjunction_cover(query)


def _conjunction_cover(query: Mapping[str, Any]) -> Cover | None:
    options: list[Cover] = []
    for key, condition in query.items():
        cover: Cover | None
        if key == "$and":
            cover = _best([_conjunction_cover(q) for q in condition])
        elif key == "$or":
            branches = [_conjunction_cover(q) for q in condition]
            cover = None if any(b is None for b in branches) else _union(branches)  # type: ignore[arg-type]
        elif key.startswith("$"):
            cover = None  # $nor, $comment: imply nothing
        else:
            cover = _field_cover(key, condition)
        if cover is not None:
            options.append(cover)
    return _best(options)


def _best(covers: Iterable[Cover | None]) -> Cover | None:
    found = [c for c in covers if c is not None]
    return min(found, key=_score) if found else None


def _union(covers: list[Cover]) -> Cover:
    merged: dict[str, frozenset[Hashable]] = {}
    for cover in covers:
        for path, keys in cover:
            merged[path] = merged.get(path, frozenset()) | keys
    return list(merged.items())


# -- the event side -----------------------------------------------------------------------------


def _values_at(value: Any, parts: list[str], i: int, out: list[Any]) -> None:
    """Every value the engine may compare at `parts[i:]` of `value` (and more: a superset)."""
    n = len(parts)
    while i < n:
        if isinstance(value, dict):
            if parts[i] not in value:
                return
            value = value[parts[i]]
            i += 1
        elif isinstance(value, list):
            for item in value:
                _values_at(item, parts, i, out)
            return
        else:
            return
    out.append(value)
    if isinstance(value, list):
        out.extend(value)  # an array matches a value its elements equal


def _has_decimal_nan(value: Any) -> bool:
    if isinstance(value, dict):
        return any(_has_decimal_nan(v) for v in value.values())
    if isinstance(value, list):
        return any(_has_decimal_nan(v) for v in value)
    return type(value) is decimal.Decimal and value.is_nan()


def plain_event(event: Mapping[str, Any]) -> tuple[dict[str, Any], bool]:
    """The event as the query engine sees it (what `UserStages` converts it to), and whether it
    holds a value whose comparison can raise, a decimal NaN (then every filter must run)."""
    raw = encode_in_order(_without_missing(event))
    plain = bson_bytes.decode(raw, codec_options=_PLAIN)
    # 0x13 is the Decimal128 type byte: without it there is no decimal, so no NaN to find.
    return plain, b"\x13" in raw and _has_decimal_nan(plain)


# -- the index ----------------------------------------------------------------------------------


class Slot:
    """One distinct filter and the subscribers that have it."""

    __slots__ = ("cover", "key", "match", "prefilter", "subscribers")

    def __init__(
        self, key: bytes, query: Mapping[str, Any] | None, cover: Cover | None
    ) -> None:
        self.key = key
        self.match = None if query is None else _Match(query)  # None: every event passes
        self.cover = cover  # None: not indexed, the filter runs on every event
        # What a stream's own pipeline checks before its transform (`match_prefilter`): a
        # CRUD event it rejects never reaches the stream's $match (which might raise on it).
        self.prefilter = None if query is None else match_prefilter([{"$match": query}])
        self.subscribers: dict[Hashable, None] = {}


class FilterIndex:
    """Subscribers' leading `$match` filters, indexed by their covers (see the module doc)."""

    def __init__(self) -> None:
        self._slots: dict[bytes, Slot] = {}
        self._by_subscriber: dict[Hashable, Slot] = {}
        self._always: dict[Slot, None] = {}  # slots that see every event
        # path -> (its parts, key -> slots with that key)
        self._paths: dict[str, tuple[list[str], dict[Hashable, dict[Slot, None]]]] = {}
        self._indexed = 0  # slots with a cover
        self._filtered = 0  # slots with a filter

    def __len__(self) -> int:
        return len(self._by_subscriber)

    def subscribers(self) -> list[Hashable]:
        return list(self._by_subscriber)

    def add(self, subscriber: Hashable, query: Mapping[str, Any] | None) -> None:
        """Register `subscriber` with its leading `$match` filter (None: none). The filter was
        validated when the stream was opened."""
        key = b"" if query is None else bson_bytes.encode({"f": query})
        slot = self._slots.get(key)
        if slot is None:
            slot = Slot(key, query, None if query is None else compile_cover(query))
            self._slots[key] = slot
            if slot.match is not None:
                self._filtered += 1
            if slot.cover is None:
                self._always[slot] = None
            else:
                self._indexed += 1
                for path, keys in slot.cover:
                    parts = path.split(".") if path != _PRESENCE else []
                    table = self._paths.setdefault(path, (parts, {}))[1]
                    for k in keys:
                        table.setdefault(k, {})[slot] = None
        slot.subscribers[subscriber] = None
        self._by_subscriber[subscriber] = slot

    def remove(self, subscriber: Hashable) -> None:
        slot = self._by_subscriber.pop(subscriber, None)
        if slot is None:
            return
        slot.subscribers.pop(subscriber, None)
        if slot.subscribers:
            return
        del self._slots[slot.key]
        if slot.match is not None:
            self._filtered -= 1
        if slot.cover is None:
            self._always.pop(slot, None)
            return
        self._indexed -= 1
        for path, keys in slot.cover:
            entry = self._paths.get(path)
            if entry is None:  # emptied by another slot: this one's keys were none (`$in: []`)
                continue
            table = entry[1]
            for k in keys:
                holders = table.get(k)
                if holders is not None:
                    holders.pop(slot, None)
                    if not holders:
                        del table[k]
            if not table:
                del self._paths[path]

    def candidates(self, plain: Mapping[str, Any], hazard: bool = False) -> list[Slot]:
        """Slots whose filter may accept the event (a superset of those that do)."""
        if hazard:
            return list(self._slots.values())
        found: dict[Slot, None] = dict(self._always)
        if not self._indexed:
            return list(found)
        for path, (parts, table) in self._paths.items():
            if path == _PRESENCE:
                values = _updated_field_names(plain)
                if values is None:  # not a document: doubtful, every slot on the path
                    for holders in table.values():
                        found.update(holders)
                    continue
            else:
                values = []
                _values_at(plain, parts, 0, values)
            for value in values:
                if type(value) not in _LOOKUP_TYPES:
                    if type(value) in _NEVER_EQUAL_TYPES:
                        continue  # no indexed key can equal it
                    for holders in table.values():  # an unknown type: doubtful
                        found.update(holders)
                    break
                try:
                    hit = table.get(value)
                except TypeError:  # an unhashable decimal (signalling NaN)
                    for holders in table.values():
                        found.update(holders)
                    break
                if hit:
                    found.update(hit)
        return list(found)

    def match(
        self, plain: Mapping[str, Any], hazard: bool = False
    ) -> tuple[list[Slot], list[tuple[Slot, BaseException]]]:
        """(slots whose filter accepts the event, slots whose filter raised on it)."""
        matched: list[Slot] = []
        failed: list[tuple[Slot, BaseException]] = []
        crud = _crud_fields(plain)
        for slot in self.candidates(plain, hazard):
            if slot.match is None:
                matched.append(slot)
                continue
            if crud is not None and slot.prefilter is not None and not slot.prefilter(*crud):
                continue  # its own pipeline skips the entry before the transform
            try:
                if slot.match.matches(plain):
                    matched.append(slot)
            except Exception as exc:  # noqa: BLE001 - the stream's own pipeline raises it
                failed.append((slot, exc))
        return matched, failed

    def needs_plain(self) -> bool:
        """Whether any slot has a filter (else every event goes to every slot as it is)."""
        return self._filtered > 0

    def all_slots(self) -> list[Slot]:
        return list(self._slots.values())


_CRUD_EVENTS = frozenset({"insert", "update", "replace", "delete"})


def _crud_fields(plain: Mapping[str, Any]) -> tuple[str, Any, Any] | None:
    """(operationType, ns.db, ns.coll) of a CRUD event, as `pipeline._may_match` reads them
    from its entry; None for other events (which every stream's pipeline transforms)."""
    operation_type = plain.get("operationType")
    if operation_type not in _CRUD_EVENTS:
        return None
    ns = plain.get("ns")
    if not isinstance(ns, dict):
        return None
    coll = ns.get("coll")
    if coll == "system.views":
        return None
    return operation_type, ns.get("db"), coll


def _updated_field_names(plain: Mapping[str, Any]) -> list[str] | None:
    description = plain.get("updateDescription")
    if description is None:
        return []
    if not isinstance(description, dict):
        return None
    fields = description.get("updatedFields")
    if fields is None:
        return []
    if not isinstance(fields, dict):
        return None
    names = []
    for name in fields:
        names.append(name)
        if "." in name:
            names.append(name.split(".")[0])
    return names


def _never_equal_types() -> frozenset[type]:
    """Event value types that never equal an indexed key under Python equality (the engine's):
    documents, arrays, null, binary, dates, timestamps, regexes, code, MinKey/MaxKey, DBRef."""
    import datetime
    import re
    import uuid
    from collections import OrderedDict

    from bson.binary import Binary
    from bson.code import Code
    from bson.datetime_ms import DatetimeMS
    from bson.dbref import DBRef
    from bson.max_key import MaxKey
    from bson.min_key import MinKey
    from bson.regex import Regex

    return frozenset({
        dict, OrderedDict, list, type(None), bytes, Binary, Code, datetime.datetime,
        DatetimeMS, Timestamp, Regex, re.Pattern, MinKey, MaxKey, DBRef, uuid.UUID,
    })


_NEVER_EQUAL_TYPES = _never_equal_types()


# -- groups -------------------------------------------------------------------------------------


def group_key(spec: ChangeStreamSpec) -> bytes:
    """What must be equal for two streams to share a filter group: the spec apart from its user
    stages and its resume point (a resumed stream joins once it is past it: `ready_to_join`)."""
    fields = dataclasses.asdict(spec)
    for name in (
        "resume_after", "start_after", "start_at_operation_time", "resume_token", "user_pipeline",
        "given_options",
    ):
        fields.pop(name, None)
    return bson_bytes.encode({"group": fields})


def ready_to_join(member: ChangeStreamPipeline, position: Timestamp) -> bool:
    """Whether a stream that ran by itself and has read every entry up to `position` (its last
    entry's ts) makes from there on exactly what a group member would: it is past its resume
    point (later events' tokens have the default version and sort after the client's token, and
    the token was found), and has no per-stream state left in its stages."""
    if member.invalidated or member.error is not None:
        return False
    client = member.check_resumability.client
    if client is None:
        return True
    if position <= client.cluster_time:
        return False
    if member.ensure_token is not None and not member.ensure_token.found:
        return False  # the next event would be 280: the stream's own pipeline must say so
    return member.split is None or member.spec.resume_token is None


def split_filter(
    stages: list[dict[str, Any]],
) -> tuple[Mapping[str, Any] | None, list[dict[str, Any]]]:
    """(the leading `$match` filter or None, the stages after it)."""
    if stages and isinstance(stages[0], Mapping) and len(stages[0]) == 1:
        name, spec = next(iter(stages[0].items()))
        if name == "$match" and isinstance(spec, Mapping):
            return spec, list(stages[1:])
    return None, list(stages)


# Beyond this many distinct pre-filters, testing them all per entry costs more than it saves.
MAX_UNION_PREFILTERS = 8


class FilterGroup:
    """One producer for streams that differ only in their user stages (see the module doc).

    Members are the streams' own `ChangeStreamPipeline`s: they keep their queues, batches and
    post-batch tokens; the group queues into them what their own pipeline would have queued.
    A member joins when the group has read exactly up to the member's start.
    """

    def __init__(
        self,
        spec: ChangeStreamSpec,
        start: Timestamp,
        *,
        history: TransactionHistory | None = None,
        images: ImageSource | ExternalImages | None = None,
    ) -> None:
        base = dataclasses.replace(
            spec,
            user_pipeline=[],
            resume_after=None,
            start_after=None,
            start_at_operation_time=None,
            resume_token=None,
        )
        self.producer = ChangeStreamPipeline(base, start, history=history, images=images)
        self.producer.sink = self._fan_out
        self.index = FilterIndex()
        self._as_is: dict[ChangeStreamPipeline, bool] = {}  # member -> no stages after $match
        self._reached: dict[ChangeStreamPipeline, None] = {}
        # The members' leading-$match pre-filters on (operationType, db, coll), as each
        # stream's own pipeline checks them before the transform: while every member has one
        # and they are few, the producer skips CRUD entries none of them can accept.
        self._prefilters: dict[bytes, tuple[Any, int]] = {}  # $match bytes -> (test, members)
        self._unfiltered = 0  # members without a pre-filter
        self._with_stages = 0  # members with stages after their leading $match

    # The scan clock members read their high-water mark from.
    @property
    def scanned_ts(self) -> Timestamp | None:
        return self.producer._scanned_ts

    @property
    def invalidated(self) -> bool:
        return self.producer.invalidated

    def __len__(self) -> int:
        return len(self._as_is)

    def members(self) -> list[ChangeStreamPipeline]:
        return list(self._as_is)

    def add(self, member: ChangeStreamPipeline) -> None:
        match, rest = split_filter(member.spec.user_pipeline)
        if member.spec.collation is not None:
            # The index compares binary values; a collated $match runs in the member's stages.
            match, rest = None, list(member.spec.user_pipeline)
        self._as_is[member] = not rest
        self._with_stages += bool(rest)
        member.scan_clock = self
        self.index.add(member, match)
        self._count_prefilter(member, +1)

    def _count_prefilter(self, member: ChangeStreamPipeline, delta: int) -> None:
        test = member.prefilter
        if test is None:
            self._unfiltered += delta
        else:
            key = bson_bytes.encode({"f": member.spec.user_pipeline[0]})
            held, n = self._prefilters.get(key, (test, 0))
            if n + delta > 0:
                self._prefilters[key] = (held, n + delta)
            else:
                self._prefilters.pop(key, None)
        tests = [t for t, _ in self._prefilters.values()]
        if self._unfiltered or not tests or len(tests) > MAX_UNION_PREFILTERS:
            self.producer.prefilter = None
        elif len(tests) == 1:
            self.producer.prefilter = tests[0]
        else:
            self.producer.prefilter = lambda *v: any(t(*v) for t in tests)

    def remove(self, member: ChangeStreamPipeline) -> None:
        as_is = self._as_is.pop(member, None)
        if as_is is None:
            return
        self._with_stages -= not as_is
        self.index.remove(member)
        self._count_prefilter(member, -1)
        scanned = self.scanned_ts
        if scanned is not None and (member._scanned_ts is None or scanned > member._scanned_ts):
            member._scanned_ts = scanned  # keeps its high-water mark without the clock
        member.scan_clock = None

    def push(
        self,
        entries: Iterable[Entry],
        scanned_to: Timestamp | None = None,
        answers: LookupAnswers | None = None,
    ) -> list[ChangeStreamPipeline] | NeedsLookup:
        """Run a batch of oplog entries for every member; returns the members that got
        something (events, the invalidate, or an error), or what the producer's push needs
        looked up first (lookups.py: nothing ran; push again with `answers`)."""
        self._reached = {}
        was_invalidated = self.producer.invalidated
        # No member has a filter or stages: the producer may hand over events it wrote
        # straight to bytes (fast_path.py), each queued as it is by every member.
        self.producer.fast_sink = (
            self._enqueue_all
            if self._with_stages == 0 and not self.index.needs_plain() and self._as_is
            else None
        )
        needs = self.producer.push(entries, scanned_to, answers)
        if needs is not None:
            return needs
        if self.producer.invalidated and not was_invalidated:
            token = self.producer._invalidate_token
            for member in self._as_is:
                member.mark_invalidated(token)
                self._reached[member] = None
        reached, self._reached = list(self._reached), {}
        return reached

    def _enqueue_all(self, items: list[Any]) -> None:
        reached = self._reached
        for everyone in self._as_is:
            everyone.enqueue(items)
            reached[everyone] = None

    def _fan_out(self, events: list[dict[str, Any]]) -> None:
        if not events:
            return  # (the invalidate, if the entries held one, is `push`'s to hand on)
        index = self.index
        as_is = self._as_is
        reached = self._reached
        plain_needed = index.needs_plain()
        if not plain_needed and self._with_stages == 0:
            # No member has a filter or stages: every one takes every event as it is.
            self._enqueue_all(encode_events(events, []))
            return
        # Per event: the slots that accept it.
        accepted: list[list[Slot]] = []
        for event in events:
            if plain_needed:
                plain, hazard = plain_event(event)
                matched, failed = index.match(plain, hazard)
                for slot, error in failed:
                    for member in list(slot.subscribers):
                        self._fail(member, error)  # type: ignore[arg-type]
            else:
                matched = index.all_slots()
            accepted.append(matched)
        # Events some member takes as they are: encoded once, queued by reference.
        wanted = [
            i for i, slots in enumerate(accepted)
            if any(as_is.get(m) for slot in slots for m in slot.subscribers)  # type: ignore[call-overload]
        ]
        encoded: dict[int, Any] = {}
        if wanted:
            items = encode_events([events[i] for i in wanted], [])
            encoded = dict(zip(wanted, items))
        own: dict[ChangeStreamPipeline, list[dict[str, Any]]] = {}
        for i, slots in enumerate(accepted):
            for slot in slots:
                for member in slot.subscribers:
                    assert isinstance(member, ChangeStreamPipeline)
                    if as_is[member]:
                        member.enqueue((encoded[i],))
                    else:
                        own.setdefault(member, []).append(events[i])
                    reached[member] = None
        for member, batch in own.items():
            try:
                member.deliver(batch)
            except Exception as exc:  # noqa: BLE001 - the stream's own pipeline raises it
                self._fail(member, exc)

    def _fail(self, member: ChangeStreamPipeline, error: BaseException) -> None:
        member.fail(error)
        self._reached[member] = None
        self.remove(member)

