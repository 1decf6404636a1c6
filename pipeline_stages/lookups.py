"""Documents the pipeline needs and does not have: it says so, its caller answers.

mongod's stages read what they lack in the middle of a batch: `AddPostImage` runs
`lookupSingleDocument` on the event's namespace for `updateLookup`, `AddPreImage` reads
`config.system.preimages`, and the transaction unwinder follows `prevOpTime` links through the
oplog. The pipeline here never does I/O, so when those documents are somewhere else (a live
upstream) a push does not read them: `ChangeStreamPipeline.push` returns a `NeedsLookup`
naming them, changes nothing, and is pushed the same entries again with `LookupAnswers`:

* the server fetches the answers asynchronously (AsyncMongoClient) and pushes again, so a
  lookup never holds the event loop (hub.py `step_answering`);
* `cdcserver replay` and Spark answer synchronously from the recorded data (`push_answering`).

Which sources say so: an `ExternalImages` image source (every pre-image and updateLookup
document is elsewhere), and a `TransactionHistory` whose `entry_at` raises `LookupNeeded`
for an entry it does not hold. In-memory sources (a recorded oplog, `MemoryImageSource`, the
embedded store) answer directly and never make a push return a `NeedsLookup`.

Answers are keyed as the stages ask: pre-images by BSON equality of their `_id`, documents by
(db, coll, collection UUID) and BSON equality of the whole documentKey, entries by `ts`. A
failed fetch is recorded as that lookup's error and raised only when a stage asks for it, so a
stream meets exactly the error a lookup made in the stage would have raised.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from bson.timestamp import Timestamp

from pipeline_stages import resume_token
from pipeline_stages.errors import MongoError
from pipeline_stages.image_source import (
    Document,
    ImageSource,
    equality_key,
    matches_document_key,
    pre_image_equality_key,
)
from pipeline_stages.oplog_entry import Entry
from pipeline_stages.stage_chain import StageChain
from pipeline_stages.transform import PRE_IMAGE_ID
from pipeline_stages.unwind_transaction import TransactionHistory
from pipeline_stages.value_string import document_string

# (db, coll, collection UUID or None: no UUID check)
Namespace = tuple[str, str, bytes | None]

# Event types that have a pre-image (add_pre_image.PRE_IMAGE_EVENT_TYPES).
_PRE_IMAGE_EVENT_TYPES = frozenset({"update", "replace", "delete"})


def _pre_key(id_doc: Mapping[str, Any]) -> Any:
    """Equal exactly when two pre-image `_id`s are. The transform's `{nsUUID, ts,
    applyOpsIndex}` compare as (UUID bytes, Timestamp, integer), which is what BSON equality
    of those types is (cheaper than a KeyString); any other shape by its KeyString."""
    try:
        uuid = id_doc["nsUUID"]
        ts = id_doc["ts"]
        index = id_doc["applyOpsIndex"]
        if len(id_doc) == 3 and isinstance(ts, Timestamp) and isinstance(index, int):
            return (bytes(uuid.bytes if hasattr(uuid, "bytes") else uuid), ts, int(index))
    except (KeyError, TypeError):
        pass
    return pre_image_equality_key(id_doc)


@dataclass(slots=True)
class NeedsLookup:
    """What a push needs before it can run: each named once, in the order first met."""

    # config.system.preimages `_id`s (`{nsUUID, ts, applyOpsIndex}`).
    pre_images: list[dict[str, Any]] = field(default_factory=list)
    # updateLookup: documentKeys per (db, coll, collection UUID).
    documents: dict[Namespace, list[Document]] = field(default_factory=dict)
    # Transaction history: the oplog entries at these times (a `prevOpTime` chain's links).
    oplog_entries: list[Timestamp] = field(default_factory=list)
    _seen_pre: set[Any] = field(default_factory=set, repr=False)
    _seen_keys: set[tuple[Namespace, bytes]] = field(default_factory=set, repr=False)

    def __bool__(self) -> bool:
        return bool(self.pre_images or self.documents or self.oplog_entries)

    def add_pre_image(self, id_doc: dict[str, Any]) -> None:
        key = _pre_key(id_doc)
        if key not in self._seen_pre:
            self._seen_pre.add(key)
            self.pre_images.append(id_doc)

    def add_document(self, ns: Namespace, document_key: Document) -> None:
        seen = (ns, equality_key(document_key))
        if seen not in self._seen_keys:
            self._seen_keys.add(seen)
            self.documents.setdefault(ns, []).append(document_key)

    def add_oplog_entry(self, ts: Timestamp) -> None:
        if ts not in self.oplog_entries:
            self.oplog_entries.append(ts)


class LookupNeeded(Exception):  # noqa: N818 - a signal, not an error: the push returns it
    """Raised by a source that cannot answer without I/O (a `TransactionHistory` asked for an
    entry it does not hold); the pipeline turns it into the `NeedsLookup` its push returns."""

    def __init__(self, needs: NeedsLookup) -> None:
        super().__init__(needs)
        self.needs = needs


class ExternalImages:
    """An image source whose documents are elsewhere: the image stages never ask it; a push
    whose events need images returns a `NeedsLookup` until it is given `LookupAnswers` that
    hold them. (The server's upstream image fetcher is one; see `sources/mongo_images.py`.)"""


class _Unanswered(Exception):  # noqa: N818
    """A stage asked for something its answers do not hold (a bug: the push checks first)."""


def _answered(
    table: Mapping[Any, Document | None | BaseException],
    items: Sequence[Any],
    key_of: Callable[[Any], Any],
    what: str,
) -> list[Document | None]:
    """Each item's answer in `table` (a document or None); an answer that is an error is
    raised, an item never looked up is _Unanswered."""
    out: list[Document | None] = []
    for item in items:
        key = key_of(item)
        if key not in table:
            raise _Unanswered(f"{what} {document_string(item)} was not looked up")
        answer = table[key]
        if isinstance(answer, BaseException):
            raise answer
        out.append(answer)
    return out


class LookupAnswers(ImageSource):
    """What was looked up for one push: an `ImageSource` for the image stages and the first
    place the unwinder looks for transaction entries (`history`)."""

    def __init__(self) -> None:
        self._pre_images: dict[Any, Document | None | BaseException] = {}
        self._documents: dict[Namespace, dict[bytes, Document | None | BaseException]] = {}
        self._namespace_errors: dict[Namespace, BaseException] = {}
        self._gone: set[Namespace] = set()
        self._entries: dict[Timestamp, Entry | None | BaseException] = {}

    # -- filled by the one who looks up ---------------------------------------------------------

    def put_pre_image(self, id_doc: Mapping[str, Any], image: Document | None) -> None:
        self._pre_images[_pre_key(id_doc)] = image

    def fail_pre_images(self, ids: Sequence[Mapping[str, Any]], error: BaseException) -> None:
        for id_doc in ids:
            self._pre_images[_pre_key(id_doc)] = error

    def collection_gone(self, ns: Namespace) -> None:
        """The collection now at (db, coll) has another UUID (or none): every answer is null."""
        self._gone.add(ns)

    def put_document_candidates(
        self, ns: Namespace, document_key: Document, candidates: Sequence[Document]
    ) -> None:
        """The documents a `{$match: documentKey}` query found (more than one is 280 when the
        stage asks, as mongod's lookup fails)."""
        try:
            answer: Document | None | BaseException = one_match(document_key, candidates)
        except MongoError as exc:
            answer = exc
        self._documents.setdefault(ns, {})[equality_key(document_key)] = answer

    def put_document(
        self, ns: Namespace, document_key: Document, answer: Document | None | BaseException
    ) -> None:
        """The document matching `document_key` now (None: none), or the lookup's error."""
        self._documents.setdefault(ns, {})[equality_key(document_key)] = answer

    def fail_documents(self, ns: Namespace, error: BaseException) -> None:
        """Every lookup in the namespace failed (raised when a stage asks for one)."""
        self._namespace_errors[ns] = error

    def put_oplog_entry(self, ts: Timestamp, entry: Entry | None) -> None:
        self._entries[ts] = entry

    def fail_oplog_entry(self, ts: Timestamp, error: BaseException) -> None:
        self._entries[ts] = error

    # -- what is still missing ------------------------------------------------------------------

    def missing(self, needs: NeedsLookup) -> NeedsLookup:
        """The part of `needs` these answers do not hold (empty: the push can run)."""
        out = NeedsLookup()
        for id_doc in needs.pre_images:
            if _pre_key(id_doc) not in self._pre_images:
                out.add_pre_image(id_doc)
        for ns, keys in needs.documents.items():
            if ns in self._gone or ns in self._namespace_errors:
                continue
            held = self._documents.get(ns, {})
            for key in keys:
                if equality_key(key) not in held:
                    out.add_document(ns, key)
        for ts in needs.oplog_entries:
            if ts not in self._entries:
                out.add_oplog_entry(ts)
        return out

    # -- ImageSource ----------------------------------------------------------------------------

    def pre_images(self, ids: Sequence[Document]) -> list[Document | None]:
        return _answered(self._pre_images, ids, _pre_key, "pre-image")

    def current_documents(
        self, db: str, coll: str, uuid: bytes | None, keys: Sequence[Document]
    ) -> list[Document | None]:
        ns = (db, coll, None if uuid is None else bytes(uuid))
        error = self._namespace_errors.get(ns)
        if error is not None:
            raise error
        if ns in self._gone:
            return [None] * len(keys)
        return _answered(self._documents.get(ns, {}), keys, equality_key, "document")

    # -- history --------------------------------------------------------------------------------

    def history(self, source: TransactionHistory | None) -> TransactionHistory:
        """Entries from these answers first, then from `source`."""
        return _AnsweredHistory(self._entries, source)


class _AnsweredHistory:
    __slots__ = ("_entries", "_source")

    def __init__(
        self, entries: dict[Timestamp, Entry | None | BaseException],
        source: TransactionHistory | None,
    ) -> None:
        self._entries = entries
        self._source = source

    def entry_at(self, ts: Timestamp) -> Entry | None:
        if ts in self._entries:
            answer = self._entries[ts]
            if isinstance(answer, BaseException):
                raise answer
            return answer
        return None if self._source is None else self._source.entry_at(ts)


def one_match(key: Document, candidates: Sequence[Document]) -> Document | None:
    """The document among `candidates` matching the whole documentKey; 280 for two (mongod's
    `lookupSingleDocument` finds more than one)."""
    found = [d for d in candidates if matches_document_key(d, key)]
    if len(found) > 1:
        raise MongoError(
            280,
            f"found more than one document with document key "
            f"{document_string(key)} [{document_string(found[0])}, "
            f"{document_string(found[1])}]",
        )
    return found[0] if found else None


# ---------------------------------------------------------------------------------------------
# What a batch of events needs (the pipeline asks before its stages run)


def looks_up_images(pipeline: StageChain) -> bool:
    """Whether the pipeline's image stages read from elsewhere (pushes may need lookups)."""
    return isinstance(pipeline.images, ExternalImages) and (
        pipeline.add_pre_image is not None or pipeline.add_post_image is not None
    )


def _event_uuid(event: Mapping[str, Any]) -> bytes | None:
    """The collection UUID the event's resume token carries (as add_post_image reads it)."""
    shown = event.get("collectionUUID")
    if shown is not None:
        return bytes(shown)
    return resume_token.decode(event["_id"]).uuid


def images_needed(
    pipeline: StageChain, events: Sequence[Mapping[str, Any]]
) -> NeedsLookup:
    """The lookups the image stages will make for `events` (transformed, before the stages
    that may drop some: so perhaps a few more than they make, never fewer)."""
    out = NeedsLookup()
    moved = pipeline.match_before_pre
    if moved is not None:
        # The user's $match that runs ahead of both image stages: the events it drops are
        # never looked up. (Should it raise here, the stage raises it where it runs, in its
        # order: only the lookups are left unfiltered.)
        try:
            events = moved.process(list(events))
        except Exception:  # noqa: BLE001
            pass
    pre = pipeline.add_pre_image is not None
    post = pipeline.add_post_image
    update_lookup = post is not None and post.mode == "updateLookup"
    # whenAvailable/required post-images read the pre-image only when no pre-image stage ran.
    post_from_pre = post is not None and not pre and post.mode in ("whenAvailable", "required")
    for event in events:
        kind = event.get("operationType")
        if kind not in _PRE_IMAGE_EVENT_TYPES:
            continue
        if (pre or (post_from_pre and kind == "update")) and PRE_IMAGE_ID in event:
            out.add_pre_image(event[PRE_IMAGE_ID])
        if update_lookup and kind == "update":
            assert post is not None
            ns = event["ns"]
            uuid = _event_uuid(event) if post.match_uuid else None
            out.add_document((ns["db"], ns["coll"], uuid), event["documentKey"])
    return out


# ---------------------------------------------------------------------------------------------
# Answering synchronously (replay, Spark, tests)


Answerer = Callable[[NeedsLookup, LookupAnswers], None]


class Pushes(Protocol):
    """What `push_answering` calls: `ChangeStreamPipeline.push` (pipeline.py)."""

    def push(
        self,
        entries: Iterable[Entry],
        scanned_to: Timestamp | None,
        answers: LookupAnswers | None,
    ) -> NeedsLookup | None: ...


def answer_from(
    history: TransactionHistory | None, images: ImageSource | None
) -> Answerer:
    """An answerer reading in-memory data: transaction entries from `history`, images from
    `images` (None: there are none, every image is null)."""

    def answer(needs: NeedsLookup, answers: LookupAnswers) -> None:
        for ts in needs.oplog_entries:
            answers.put_oplog_entry(ts, None if history is None else history.entry_at(ts))
        if needs.pre_images:
            found = images.pre_images(needs.pre_images) if images is not None else None
            for i, id_doc in enumerate(needs.pre_images):
                answers.put_pre_image(id_doc, None if found is None else found[i])
        for ns, keys in needs.documents.items():
            db, coll, uuid = ns
            for key in keys:
                answer: Document | None | BaseException = None
                if images is not None:
                    try:
                        answer = images.current_documents(db, coll, uuid, [key])[0]
                    except MongoError as exc:  # 280: raised when the stage asks for it
                        answer = exc
                answers.put_document(ns, key, answer)

    return answer


def push_answering(
    pipeline: Pushes,
    entries: Sequence[Entry],
    scanned_to: Timestamp | None,
    answer: Answerer,
) -> None:
    """`pipeline.push`, answering what it says it needs with `answer` (synchronously) and
    pushing again, until it has run."""
    answers: LookupAnswers | None = None
    while True:
        needs = pipeline.push(entries, scanned_to, answers)
        if needs is None:
            return
        if answers is None:
            answers = LookupAnswers()
        answer(needs, answers)
        if answers.missing(needs):
            raise RuntimeError(f"the answerer left lookups unanswered: {needs!r}")
