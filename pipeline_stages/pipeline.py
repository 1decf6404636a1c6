"""The expanded `$changeStream`: the stage chain for one spec, fed with oplog batches.

    oplog match -> unwind transaction -> transform -> check invalidate -> check resumability
    -> add pre-image -> add post-image -> ensure resume token present -> classic-type filter
    -> user stages -> split large event

`push(entries, scanned_to)` runs the chain over a batch of oplog entries (in `ts` order) and
queues the events; `next_batch(batch_size)` takes up to `batch_size` of them (within the 16 MiB
reply budget) with the post-batch resume token mongod would report (§9.3). Events leave the
pipeline encoded once, as `RawBSONDocument`s, ready to be copied into a reply.
"""

from __future__ import annotations

from bisect import bisect_right
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from itertools import accumulate, islice
from operator import attrgetter, itemgetter
from typing import Any, cast

from bson.raw_bson import RawBSONDocument
from bson.timestamp import Timestamp

from pipeline_stages import resume_token
from pipeline_stages.add_post_image import AddPostImage, strip_internal_fields
from pipeline_stages.add_pre_image import AddPreImage
from pipeline_stages.check_invalidate import CheckInvalidate
from pipeline_stages.check_resumability import CheckResumability, check_history
from pipeline_stages.ensure_resume_token_present import EnsureResumeTokenPresent
from pipeline_stages.errors import MongoError
from pipeline_stages.fast_path import encode_crud, fast_eligible
from pipeline_stages.image_source import ImageSource
from pipeline_stages.lookups import (
    ExternalImages,
    LookupAnswers,
    LookupNeeded,
    NeedsLookup,
    images_needed,
)
from pipeline_stages.oplog_entry import (
    Entry,
    EntryDocument,
    encode_in_order,
    encode_many_in_order,
    split_ns,
)
from pipeline_stages.oplog_match import OplogFilter
from pipeline_stages.resume_token import ResumeTokenData
from pipeline_stages.spec import ChangeStreamSpec
from pipeline_stages.split_large_event import SplitLargeEvent, check_event_size
from pipeline_stages.transform import CLASSIC_EVENT_TYPES, ChangeStreamTransform
from pipeline_stages.unwind_transaction import TransactionHistory, unwind
from pipeline_stages.user_stages import UserStages, match_prefilter

# A reply's cursor batch may hold up to 16 MiB of documents (BSONObjMaxUserSize).
MAX_BATCH_BYTES = 16 * 1024 * 1024

# Queued events looked at per step when a batch is taken or its size summed.
SCAN_CHUNK = 4096
_EVENT = itemgetter(0)  # of a queued (event, token, clusterTime)
_RAW = attrgetter("raw")  # an encoded event's bytes (a TooLargeEvent's are empty)




@dataclass(slots=True)
class Batch:
    events: list[RawBSONDocument]
    post_batch_resume_token: dict[str, Any]
    invalidated: bool  # the cursor is closed after this batch


class ChangeStreamPipeline:
    def __init__(
        self,
        spec: ChangeStreamSpec,
        start: Timestamp,
        *,
        history: TransactionHistory | None = None,
        images: ImageSource | ExternalImages | None = None,
    ) -> None:
        """`start`: the first `ts` to read. For a stream resumed from a token or started at an
        operation time that is the token's/operation's time; for a new stream, the source's
        last applied time plus one increment."""
        self.spec = spec
        self.start = start
        self.filter = OplogFilter(spec)
        self.history = history
        self.transform = ChangeStreamTransform(spec)
        self.check_invalidate = CheckInvalidate(spec)
        # The point to skip to: the client's token, a high-water mark at startAtOperationTime,
        # or nothing for a new stream.
        client = spec.resume_token
        if client is None and spec.start_at_operation_time is not None:
            client = ResumeTokenData.high_water_mark(start, spec.token_version)
        self.check_resumability = CheckResumability(client)
        if images is None and (
            spec.full_document != "default" or spec.full_document_before_change != "off"
        ):
            from pipeline_stages.image_source import MemoryImageSource

            images = MemoryImageSource()  # no source of images: every lookup finds nothing
        self.images = images
        # With images elsewhere the stages read the answers each push is given (lookups.py).
        stage_images: ImageSource | None = (
            LookupAnswers() if isinstance(images, ExternalImages) else images
        )
        self.add_pre_image = (
            AddPreImage(spec, stage_images)
            if stage_images is not None and spec.full_document_before_change != "off"
            else None
        )
        self.add_post_image = (
            # mongod 8.0 always matches the collection UUID on a replica set (the option only
            # exists on master), so a re-created collection gives null.
            AddPostImage(spec, stage_images, match_collection_uuid=True)
            if stage_images is not None and spec.full_document != "default"
            else None
        )
        self.ensure_token = (
            EnsureResumeTokenPresent(client)
            if client is not None and not client.is_high_water_mark
            else None
        )
        stages = spec.user_pipeline
        split = bool(stages) and next(iter(stages[-1])) == "$changeStreamSplitLargeEvent"
        collation = spec.collation
        self.user_stages = (
            UserStages(stages[:-1] if split else stages, collation) if stages else None
        )
        # mongod moves the user's leading $match stages ahead of EnsureResumeTokenPresent
        # (SERVER-71565): a resume point they filter out is never seen, and the stream fails
        # with 280 (jstests/change_streams/filter_excludes_resume_point.js).
        leading: list[dict[str, Any]] = []
        for stage in stages:
            if next(iter(stage)) != "$match":
                break
            leading.append(stage)
        # Resuming after an invalidate (startAfter), mongod hands the regenerated invalidate to
        # EnsureResumeTokenPresent directly (ChangeStreamStartAfterInvalidate), past any $match.
        self.ensure_match = (
            UserStages(leading, collation)
            if client is not None and self.ensure_token is not None and leading
            and not client.from_invalidate
            else None
        )
        # mongod moves a $match ahead of a stage that writes no field it reads (AddPostImage
        # writes fullDocument, AddPreImage fullDocumentBeforeChange): the events it drops are
        # never looked up, so `required` cannot fail on them
        # (change_stream_pre_image_lookup_whole_db_whole_cluster.js).
        self.match_before_pre: UserStages | None = None
        self.match_before_post: UserStages | None = None
        if leading and (self.add_pre_image is not None or self.add_post_image is not None) and (
            client is None or not client.from_invalidate
        ):
            reads = _match_fields(leading)
            if reads is not None and "fullDocument" not in reads:
                moved = UserStages(leading, collation)
                if "fullDocumentBeforeChange" not in reads:
                    self.match_before_pre = moved
                else:
                    self.match_before_post = moved
        self.split = SplitLargeEvent(resume_after=spec.resume_token) if split else None
        # A leading $match on operationType/ns, checked on CRUD entries before the transform
        # (mongod rewrites it into the oplog filter). DDL entries always go through: they may
        # invalidate the stream, and the invalidate is produced before the user's $match.
        self.prefilter = match_prefilter(stages, collation) if stages else None

        # The initial post-batch resume token: the client's token re-encoded, else a
        # high-water mark at the start.
        if spec.resume_token is not None:
            self._pbrt = spec.resume_token.to_document()
            self._pbrt_ts = spec.resume_token.cluster_time
        else:
            self._pbrt = ResumeTokenData.high_water_mark(start, spec.token_version).to_document()
            self._pbrt_ts = start
        # (encoded event, its resume token, its clusterTime)
        self._pending: deque[tuple[RawBSONDocument, dict[str, Any], Timestamp]] = deque()
        # `pending_fills`: how many leading queued events it has summed, and their bytes (the
        # queue only grows at its end until a batch is taken, so each event is summed once).
        self._sized = (0, 0)
        self._scanned_ts: Timestamp | None = None
        self.invalidated = False
        # The invalidate event's token: the post-batch token once the stream has ended, even
        # when a user stage filtered the invalidate out (mongod takes it from the
        # ChangeStreamInvalidated exception, not from the returned events).
        self._invalidate_token: dict[str, Any] | None = None
        # Filter groups (filter_index.py): a producer hands its events, before the user's
        # stages, to `sink`; a member reads how far the group scanned from `scan_clock` (so an
        # entry that reaches no member costs nothing per member) and may be failed by the group
        # with the error its own $match or stages raised.
        self.sink: Callable[[list[dict[str, Any]]], None] | None = None
        # A producer whose group's members all take every event as it is: the encoded events
        # of a fast-path push go here instead of `sink` (every member queues them).
        self.fast_sink: Callable[[list[Any]], None] | None = None
        self.scan_clock: Any = None  # has `scanned_ts`
        self.error: BaseException | None = None
        # A push that returned a NeedsLookup for images: (its batch, its events, its last ts),
        # taken up when the same batch is pushed again (its events are not made twice).
        self._suspended: tuple[tuple[Any, ...], list[dict[str, Any]], Timestamp | None] | None
        self._suspended = None
        # Every CRUD event goes out as the transform made it: written straight to bytes
        # (fast_path.py) once past the resume point.
        self._fast = fast_eligible(self)
        self.fast_ns: dict[str, bytes | None] = {}  # its `ns` elements (fast_path._ns_parts)
        # A high-water-mark start (startAtOperationTime, a post-batch token) sorts before every
        # event at or after its time, and the pipeline reads nothing before `start`: check
        # resumability passes every event from the first one.
        self._from_high_water_mark = (
            client is not None and client.is_high_water_mark and client.cluster_time <= start
        )

    @property
    def pending_count(self) -> int:
        """Events produced and not yet returned."""
        return len(self._pending)

    def pending_fills(self, budget: int = MAX_BATCH_BYTES) -> bool:
        """Whether the queued events fill a reply of `budget` bytes (one of them would not fit,
        or one is too large to return): a getMore without batchSize reads no further, so a
        large backlog is not read into memory at once."""
        counted, size = self._sized
        pending = self._pending
        if counted > len(pending):  # a batch was taken meanwhile
            counted, size = 0, 0
        # Whole-chunk operations in C rather than a Python loop per event.
        while True:
            new = list(map(_EVENT, islice(pending, counted, counted + SCAN_CHUNK)))
            if not new:
                self._sized = (counted, size)
                return False
            # sums[i]: the bytes with the chunk's first i events on top of those counted before
            sums = list(accumulate(map(len, map(_RAW, new)), initial=size))
            fit = bisect_right(sums, budget) - 1  # how many of them fit
            if TooLargeEvent in map(type, new[: fit + 1]):
                return True  # reached before the budget ran out: the batch ends there (10334)
            counted, size = counted + fit, sums[fit]
            if fit < len(new):
                self._sized = (counted, size)
                return True

    @property
    def post_batch_resume_token(self) -> dict[str, Any]:
        """The token the last batch reported (the start token before any batch)."""
        return self._pbrt

    def take_pending(self) -> list[tuple[RawBSONDocument, dict[str, Any], Timestamp]]:
        """Remove and return every queued (event, token, clusterTime): a producer shared by
        identical cursors hands them on with `share`."""
        items = list(self._pending)
        self._pending.clear()
        self._sized = (0, 0)
        return items

    def share(
        self,
        items: list[tuple[RawBSONDocument, dict[str, Any], Timestamp]],
        producer: ChangeStreamPipeline,
    ) -> None:
        """Queue what `producer` (same spec, same start) made of the oplog, instead of running
        the stages again: identical cursors share transform and encoding work."""
        self._pending.extend(items)
        scanned = producer._scanned_ts
        if scanned is not None and (self._scanned_ts is None or scanned > self._scanned_ts):
            self._scanned_ts = scanned
        if producer.invalidated and not self.invalidated:
            self.invalidated = True
            self._invalidate_token = producer._invalidate_token

    def check_history(self, oldest: Entry | None) -> None:
        """286 ChangeStreamHistoryLost if the source no longer reaches back to the start."""
        check_history(oldest, self.start)

    # -- feeding --------------------------------------------------------------------------------

    def push(
        self,
        entries: Iterable[Entry],
        scanned_to: Timestamp | None = None,
        answers: LookupAnswers | None = None,
    ) -> NeedsLookup | None:
        """Run a batch of oplog entries (ascending `ts`) through the chain and queue the events.

        `scanned_to`: how far the source has read (at least the last entry's ts); it lets
        idle streams' post-batch tokens advance past entries no stream matched.

        When the batch needs documents the pipeline does not have (lookups.py: images from an
        `ExternalImages` source, transaction entries its history does not hold), nothing is
        run or queued: the return value names them, and the caller pushes the same entries
        (a list, then) again with `answers` holding them. None: the batch ran.
        """
        if self.invalidated:
            return None
        if (
            self._fast
            and self._suspended is None
            and (self.sink is None or self.fast_sink is not None)
            and self.prefilter is None
            and (self.check_resumability.passed or self._from_high_water_mark)
            and (self.ensure_token is None or self.ensure_token.done)
        ):
            if type(entries) is not list:
                entries = list(entries)  # read twice if the fast path hands them back
            items = encode_crud(self, entries, self.start)
            if items is not None:  # every entry the filter keeps was plain CRUD
                self._advance_scanned(scanned_to, entries[-1]["ts"] if entries else None)
                if self.sink is None:
                    self._pending.extend(items)
                elif items and self.fast_sink is not None:
                    self.fast_sink(items)
                return None
        suspended, self._suspended = self._suspended, None
        if suspended is not None and _same_batch(suspended[0], entries):
            # The batch the last push said needs lookups: its events are still good (nothing
            # ran, and match, unwind and transform depend only on the entries).
            events, last_ts = suspended[1], suspended[2]
        else:
            history = self.history if answers is None else answers.history(self.history)
            try:
                events, last_ts = self._transform(entries, history)
            except LookupNeeded as needed:
                return needed.needs
        if events and isinstance(self.images, ExternalImages):
            needs = images_needed(self, events)
            if answers is not None:
                needs = answers.missing(needs)
            if needs:
                self._suspended = (_batch_key(entries), events, last_ts)
                return needs
        self._advance_scanned(scanned_to, last_ts)
        if events:
            self._run_stages(events, answers)
        return None

    def _advance_scanned(self, scanned_to: Timestamp | None, last_ts: Timestamp | None) -> None:
        if scanned_to is None or (last_ts is not None and last_ts > scanned_to):
            scanned_to = last_ts
        if scanned_to is not None and (self._scanned_ts is None or scanned_to > self._scanned_ts):
            self._scanned_ts = scanned_to

    def _transform(
        self, entries: Iterable[Entry], history: TransactionHistory | None
    ) -> tuple[list[dict[str, Any]], Timestamp | None]:
        """Match, unwind and transform: the batch's events and its last entry's ts."""
        start = self.start
        matches = self.filter.matches
        op_filter = self.filter.matches_transaction_op
        transform = self.transform.transform
        prefilter = self.prefilter
        events: list[dict[str, Any]] = []
        last = None
        before_start = True  # `ts` ascends: once one entry is at/after start, all the rest are
        for entry in entries:
            last = entry
            if before_start:
                if entry["ts"] < start:
                    continue
                before_start = False
            if not matches(entry):
                continue
            if entry.get("op") != "c":  # unwind() passes anything but a command through as is
                if prefilter is not None and not _may_match(prefilter, entry):
                    continue
                event = transform(entry)
                if event is not None:
                    events.append(event)
                continue
            for op in unwind(entry, op_filter, history):
                if prefilter is not None and not _may_match(prefilter, op):
                    continue
                event = transform(op)
                if event is not None:
                    events.append(event)
        return events, None if last is None else last["ts"]

    def _run_stages(
        self, events: list[dict[str, Any]], answers: LookupAnswers | None = None
    ) -> None:
        events = self.check_invalidate.process(events)
        if self.check_invalidate.invalidated and self._invalidate_token is None:
            self._invalidate_token = events[-1]["_id"]  # the invalidate is always last
        events = self.check_resumability.process(events)
        if isinstance(self.images, ExternalImages):
            # The image stages read what was looked up for this push (push checked it holds
            # every lookup they make; without answers it made sure they make none).
            given = answers if answers is not None else LookupAnswers()
            if self.add_pre_image is not None:
                self.add_pre_image.source = given
            if self.add_post_image is not None:
                self.add_post_image.source = given
        if self.match_before_pre is not None:
            events = self.match_before_pre.process(events)
        if self.add_pre_image is not None:
            events = self.add_pre_image.process(events)
        if self.match_before_post is not None:
            events = self.match_before_post.process(events)
        if self.add_post_image is not None:
            events = self.add_post_image.process(events)
        elif self.add_pre_image is not None:
            for event in events:
                strip_internal_fields(event)
        # else: without image stages the transform adds no internal field to strip.
        if self.ensure_token is not None:
            if self.ensure_match is not None and not self.ensure_token.done:
                events = self.ensure_match.process(events)  # the user's stages filter again
            events = self.ensure_token.process(events)
        if not self.spec.show_expanded_events:
            events = [e for e in events if e["operationType"] in CLASSIC_EVENT_TYPES]
        if self.sink is not None:
            self.sink(events)  # a filter group's producer: the members run their own stages
            if self.check_invalidate.invalidated:
                self.invalidated = True
            return
        self.deliver(events)

    def deliver(self, events: list[Any]) -> None:
        """The user's stages, the split and the encoding of events that passed every stage
        before them; queues the results (a filter group calls this for members with stages of
        their own after their leading $match)."""
        if self.user_stages is not None and self.split is not None:
            # mongod splits by each event's original token and checks the `_id` afterwards.
            applied, tokens = self.user_stages.apply(events)
            events = self.split.process(cast("list[Any]", applied), tokens)
        elif self.user_stages is not None:
            events = self.user_stages.process(events)  # 280 if a stage changed `_id`
        elif self.split is not None:
            events = self.split.process(events)
        if self.split is not None and self.ensure_token is not None:
            events = self.ensure_token.after_split(events)  # it follows the split in mongod
        encode_events(events, self._pending)
        if self.check_invalidate.invalidated:
            self.invalidated = True

    def enqueue(self, items: Iterable[tuple[RawBSONDocument, dict[str, Any], Timestamp]]) -> None:
        """Queue events a filter group encoded once for every member that takes them as is."""
        self._pending.extend(items)

    def mark_invalidated(self, token: dict[str, Any] | None) -> None:
        """The group's producer met the invalidate: this member ends with it."""
        if not self.invalidated:
            self.invalidated = True
            self._invalidate_token = token

    def fail(self, error: BaseException) -> None:
        """The member's own $match or stages raised on an event: its next batch raises it."""
        if self.error is None:
            self.error = error

    # -- draining -------------------------------------------------------------------------------

    def next_batch(self, batch_size: int | None = None) -> Batch:
        """Up to `batch_size` queued events (None: no limit) within the reply budget."""
        if self.error is not None:
            raise self.error  # what the stream's own push would have raised
        pending = self._pending
        self._sized = (0, 0)  # the queue's head moves
        limit = len(pending) if batch_size is None else min(batch_size, len(pending))
        # The first event is taken whatever its size; each next one while the batch stays
        # within the budget (the rest stay queued for the next getMore, the token does not move
        # past them). Whole-chunk operations in C rather than a loop per event; a chunk at a
        # time, so a long queue of large events is not all looked at for one batch.
        head: list[tuple[RawBSONDocument, dict[str, Any], Timestamp]] = []
        out: list[RawBSONDocument] = []
        size = 0
        while len(out) < limit and size <= MAX_BATCH_BYTES:
            chunk = list(islice(pending, len(out), min(limit, len(out) + SCAN_CHUNK)))
            events = list(map(_EVENT, chunk))
            # sums[i]: the batch's bytes with the chunk's first i events
            sums = list(accumulate(map(len, map(_RAW, events)), initial=size))
            fit = max(bisect_right(sums, MAX_BATCH_BYTES) - 1, 0 if out else 1)
            if TooLargeEvent in map(type, events[:fit]):
                # The batch that reaches an event too large to return fails (the events before
                # it in this batch with it), as mongod's does when it builds that batch.
                event = events[list(map(type, events)).index(TooLargeEvent)]
                assert isinstance(event, TooLargeEvent)
                pending.clear()
                self.error = event.error
                raise event.error
            head += chunk[:fit]
            out += events[:fit]
            size = sums[fit]
            if fit < len(chunk):
                break
        if out:
            taken = len(out)
            if taken == len(pending):
                pending.clear()
            else:
                popleft = pending.popleft
                for _ in range(taken):
                    popleft()
            _event, self._pbrt, self._pbrt_ts = head[-1]
        # mongod stops asking for events once the batch is full, so only a batch that ran out of
        # events (EOF for now) may report a high-water mark or the end of an invalidated stream;
        # a batch filled exactly by the last queued event reports that event's token, and the
        # next getMore the rest (§9.3, §5).
        eof = not pending and (batch_size is None or len(out) < batch_size)
        if eof and self.invalidated and self._invalidate_token is not None:
            self._pbrt = self._invalidate_token
        elif eof:
            # Nothing more to return for now: the token may move up to what was scanned.
            scanned = self._scanned_ts
            clock = self.scan_clock
            if clock is not None and clock.scanned_ts is not None and (
                scanned is None or clock.scanned_ts > scanned
            ):
                scanned = clock.scanned_ts
            if scanned is not None and scanned > self._pbrt_ts and not self.invalidated:
                version = resume_token.version_for_event(
                    scanned, self.spec.resume_token, self.spec.token_version
                )
                self._pbrt = _high_water_mark(scanned, version)
                self._pbrt_ts = scanned
        return Batch(out, self._pbrt, self.invalidated and eof)

    def process(self, entries: Iterable[Entry], batch_size: int | None = None) -> Batch:
        """`push` then `next_batch`: events of this oplog batch and the post-batch token.
        LookupNeeded when the batch needs lookups (answer them with lookups.push_answering)."""
        needs = self.push(entries)
        if needs is not None:
            raise LookupNeeded(needs)
        return self.next_batch(batch_size)


def _match_fields(stages: list[dict[str, Any]]) -> set[str] | None:
    """The top-level fields `$match` stages read; None when they may read any ($expr...)."""
    fields: set[str] = set()

    def walk(query: Any) -> bool:
        if not isinstance(query, dict):
            return False
        for key, value in query.items():
            if key in ("$and", "$or", "$nor"):
                if not isinstance(value, list) or not all(walk(q) for q in value):
                    return False
            elif key == "$comment":
                continue
            elif key.startswith("$"):
                return False
            else:
                fields.add(key.split(".", 1)[0])
        return True

    return fields if all(walk(s.get("$match")) for s in stages) else None


_last_high_water_mark: tuple[Timestamp, int, dict[str, Any]] | None = None


def _high_water_mark(ts: Timestamp, version: int) -> dict[str, Any]:
    """The high-water-mark token at `ts`: idle streams report the same one after each write,
    so the last one made is kept (about 10 us of KeyString encoding per idle getMore)."""
    global _last_high_water_mark
    last = _last_high_water_mark
    if last is not None and last[0] == ts and last[1] == version:
        return last[2]
    doc = ResumeTokenData.high_water_mark(ts, version).to_document()
    _last_high_water_mark = (ts, version, doc)
    return doc


class TooLargeEvent:
    """Queued in place of an event too large to return: the batch that reaches it fails with
    its BSONObjectTooLarge error; the events queued before it are returned first."""

    __slots__ = ("error",)
    raw = b""

    def __init__(self, error: MongoError) -> None:
        self.error = error


def encode_events(events: list[dict[str, Any]], out: Any) -> Any:
    """Append (encoded event, its resume token, its clusterTime) for each event to `out` (and
    return it), in one codec call when there are several."""
    try:
        encoded = encode_many_in_order(events) if len(events) > 1 else None
    except Exception:  # noqa: BLE001 - the one-by-one loop raises it at its own event
        encoded = None
    for i, event in enumerate(events):
        token = event["_id"]
        ts = event["clusterTime"] if "clusterTime" in event else None
        if not isinstance(ts, Timestamp):
            # a stage removed or changed clusterTime (SERVER-65497): read it from the token
            ts = resume_token.decode(token).cluster_time
        raw = encoded[i] if encoded is not None else encode_in_order(event)
        try:
            check_event_size(raw, event)  # over 16 MiB + 16 KiB: 10334 when a batch reaches it
        except MongoError as exc:
            out.append((TooLargeEvent(exc), token, ts))
            continue
        # The encoder just made these bytes: RawBSONDocument's own checks (~0.6 us) are skipped.
        out.append((EntryDocument(raw), token, ts))
    return out


def _batch_key(entries: Iterable[Entry]) -> tuple[Any, ...]:
    """The same entries of an oplog (ts ascending and unique) give the same key."""
    if isinstance(entries, list) and entries:
        return (entries[0]["ts"], entries[-1]["ts"], len(entries))
    return (id(entries),)


def _same_batch(key: tuple[Any, ...], entries: Iterable[Entry]) -> bool:
    return len(key) == 3 and key == _batch_key(entries)


_CRUD_TYPES = {"i": "insert", "d": "delete"}


def _may_match(prefilter: Any, op: Entry) -> bool:
    """False only for CRUD entries whose event the user's leading $match must reject."""
    kind = op["op"]
    if kind == "u":
        o = op["o"]
        operation_type = "update" if "$v" in o else ("replace" if "_id" in o else None)
    else:
        operation_type = _CRUD_TYPES.get(kind)
        if operation_type is None:
            return True
    db, coll = split_ns(op["ns"])
    if coll == "system.views":
        return True  # view DDL, not CRUD
    return bool(prefilter(operation_type, db, coll))
