"""The pipeline says what it needs instead of looking it up (pipeline_stages/lookups.py).

Pure: no source, no server. A pipeline whose images are elsewhere (`ExternalImages`) or whose
transaction history does not hold an entry returns a `NeedsLookup` from `push`, runs and
queues nothing, and, pushed again with the answers, makes exactly the events (byte for byte)
that a pipeline reading the same documents from memory makes.
"""

from __future__ import annotations

from typing import Any

import pytest
from bson.timestamp import Timestamp

from pipeline_stages.errors import MongoError
from pipeline_stages.image_source import MemoryImageSource, pre_image_id
from pipeline_stages.lookups import (
    ExternalImages,
    LookupAnswers,
    LookupNeeded,
    NeedsLookup,
    answer_from,
    push_answering,
)
from pipeline_stages.oplog_entry import Entry
from pipeline_stages.pipeline import ChangeStreamPipeline
from pipeline_stages.spec import parse_aggregate
from tests.support.oplog_builders import MemoryHistory, Oplog, make_lsid

NS = "shop.items"


def spec(**options: Any) -> Any:
    cmd = {"aggregate": "items", "pipeline": [{"$changeStream": options}], "cursor": {}}
    return parse_aggregate(cmd, "shop")


def raws(pipeline: ChangeStreamPipeline) -> list[bytes]:
    return [event.raw for event in pipeline.next_batch(None).events]


def workload() -> tuple[Oplog, MemoryImageSource, Timestamp]:
    """Inserts, updates, a replace and a delete on one collection, with the pre-images mongod
    would have recorded and the collection's documents as they are now."""
    log = Oplog()
    start = log.peek_ts()
    images = MemoryImageSource()
    uuid = log.uuid(NS)
    images.create_collection("shop", "items", uuid)
    docs = {i: {"_id": i, "v": 0} for i in range(3)}
    for doc in docs.values():
        log.insert(NS, doc)
    for i in range(3):
        entry = log.update(NS, i, {"u": {"v": i + 1}})
        images.add_pre_image(uuid, entry["ts"], 0, dict(docs[i]))
        docs[i] = {"_id": i, "v": i + 1}
    entry = log.replace(NS, {"_id": 1, "w": 1})
    images.add_pre_image(uuid, entry["ts"], 0, dict(docs[1]))
    docs[1] = {"_id": 1, "w": 1}
    entry = log.delete(NS, 2)
    images.add_pre_image(uuid, entry["ts"], 0, dict(docs[2]))
    del docs[2]
    for doc in docs.values():
        images.put_document("shop", "items", doc)
    return log, images, start


IMAGE_SPECS = [
    {"fullDocument": "updateLookup"},
    {"fullDocumentBeforeChange": "whenAvailable"},
    {"fullDocument": "required"},
    {"fullDocument": "whenAvailable", "fullDocumentBeforeChange": "required"},
    {"fullDocument": "updateLookup", "fullDocumentBeforeChange": "whenAvailable"},
]


@pytest.mark.parametrize("options", IMAGE_SPECS)
def test_push_names_the_images_it_needs_and_runs_nothing(options):
    log, images, start = workload()
    pipeline = ChangeStreamPipeline(spec(**options), start, images=ExternalImages())
    needs = pipeline.push(log.entries)
    assert isinstance(needs, NeedsLookup) and needs
    assert pipeline.pending_count == 0  # nothing ran
    uuid = bytes(log.uuid(NS))
    updates = [e for e in log.entries if e["op"] == "u" and "$v" in e["o"]]
    if options.get("fullDocument") == "updateLookup":
        assert needs.documents == {("shop", "items", uuid): [e["o2"] for e in updates]}
    else:
        assert needs.documents == {}
    if "fullDocumentBeforeChange" in options:
        changed = [e for e in log.entries if e["op"] in ("u", "d")]
    elif options.get("fullDocument") in ("whenAvailable", "required"):
        changed = updates
    else:
        changed = []
    assert needs.pre_images == [pre_image_id(uuid, e["ts"], 0) for e in changed]
    assert needs.oplog_entries == []

    # The answers, from the same documents a pipeline reading them in memory has.
    answers = LookupAnswers()
    answer_from(None, images)(needs, answers)
    assert not answers.missing(needs)
    assert pipeline.push(log.entries, None, answers) is None
    expected = ChangeStreamPipeline(spec(**options), start, images=images)
    expected.push(log.entries)
    got, want = raws(pipeline), raws(expected)
    assert got == want and len(got) == len(log.entries)


def test_a_push_without_events_needing_images_runs_at_once():
    log = Oplog()
    start = log.peek_ts()
    log.insert(NS, {"_id": 1})
    log.delete(NS, 1)  # a pre-image would be needed, but only fullDocument is asked for
    pipeline = ChangeStreamPipeline(
        spec(fullDocument="updateLookup"), start, images=ExternalImages()
    )
    assert pipeline.push(log.entries) is None
    assert len(raws(pipeline)) == 2


def test_a_failed_lookup_is_raised_where_the_stage_asks():
    log, _, start = workload()
    pipeline = ChangeStreamPipeline(
        spec(fullDocument="updateLookup"), start, images=ExternalImages()
    )
    needs = pipeline.push(log.entries)
    assert needs is not None
    answers = LookupAnswers()
    for ns in needs.documents:
        answers.fail_documents(ns, MongoError(89, "the upstream did not answer in time"))
    with pytest.raises(MongoError) as failed:
        pipeline.push(log.entries, None, answers)
    assert failed.value.code == 89


def test_two_matching_documents_are_280_where_the_stage_asks():
    log = Oplog()
    start = log.peek_ts()
    log.insert(NS, {"_id": 1})
    log.update(NS, 1, {"u": {"a": 1}})
    pipeline = ChangeStreamPipeline(
        spec(fullDocument="updateLookup"), start, images=ExternalImages()
    )
    needs = pipeline.push(log.entries)
    assert needs is not None
    [(ns, [key])] = needs.documents.items()
    answers = LookupAnswers()
    answers.put_document_candidates(ns, key, [{"_id": 1, "a": 1}, {"_id": 1.0, "a": 2}])
    with pytest.raises(MongoError) as failed:
        pipeline.push(log.entries, None, answers)
    assert failed.value.code == 280


# ---------------------------------------------------------------------------------------------
# Transaction history


class PartialHistory:
    """Holds the entries at or after `since` only; an older one must be looked up."""

    def __init__(self, entries: list[Entry], since: Timestamp) -> None:
        self.held = MemoryHistory(e for e in entries if e["ts"] >= since)
        self.asked: list[Timestamp] = []

    def entry_at(self, ts: Timestamp) -> Entry | None:
        entry = self.held.entry_at(ts)
        if entry is None:
            self.asked.append(ts)
            needs = NeedsLookup()
            needs.add_oplog_entry(ts)
            raise LookupNeeded(needs)
        return entry


def transaction_oplog() -> tuple[Oplog, Timestamp]:
    log = Oplog()
    start = log.peek_ts()
    txn = log.transaction(make_lsid(1), 7)
    txn.partial([log.op_insert(NS, {"_id": i}) for i in range(2)])
    txn.partial([log.op_insert(NS, {"_id": i}) for i in range(2, 4)])
    txn.commit([log.op_insert(NS, {"_id": 4})])
    log.insert(NS, {"_id": "after"})
    return log, start


def test_push_names_each_missing_link_of_a_transaction_chain():
    log, start = transaction_oplog()
    commit = log.entries[2]
    history = PartialHistory(log.entries, commit["ts"])  # the two partial entries are missing
    pipeline = ChangeStreamPipeline(spec(), start, history=history)
    answers = LookupAnswers()
    asked = []
    while (needs := pipeline.push(log.entries, None, answers)) is not None:
        assert pipeline.pending_count == 0
        assert needs.pre_images == [] and needs.documents == {}
        asked.extend(needs.oplog_entries)
        answer_from(MemoryHistory(log.entries), None)(needs, answers)
    # The chain is followed newest first, one link per round.
    assert asked == [log.entries[1]["ts"], log.entries[0]["ts"]]
    expected = ChangeStreamPipeline(spec(), start, history=log.history())
    expected.push(log.entries)
    got = raws(pipeline)
    assert got == raws(expected) and len(got) == 6


def test_push_answering_is_the_synchronous_loop():
    log, start = transaction_oplog()
    history = PartialHistory(log.entries, log.entries[2]["ts"])
    pipeline = ChangeStreamPipeline(spec(), start, history=history)
    push_answering(pipeline, log.entries, None, answer_from(MemoryHistory(log.entries), None))
    expected = ChangeStreamPipeline(spec(), start, history=log.history())
    expected.push(log.entries)
    assert raws(pipeline) == raws(expected)


def test_an_entry_the_source_no_longer_has_is_286():
    log, start = transaction_oplog()
    history = PartialHistory(log.entries, log.entries[2]["ts"])
    pipeline = ChangeStreamPipeline(spec(), start, history=history)
    with pytest.raises(MongoError) as failed:
        push_answering(pipeline, log.entries, None, answer_from(MemoryHistory([]), None))
    assert failed.value.code == 286


def test_process_raises_what_it_needs():
    log, _, start = workload()
    pipeline = ChangeStreamPipeline(
        spec(fullDocument="updateLookup"), start, images=ExternalImages()
    )
    with pytest.raises(LookupNeeded) as needed:
        pipeline.process(log.entries)
    assert needed.value.needs.documents


def test_events_a_leading_match_drops_are_not_looked_up():
    """mongod runs a $match that reads neither image ahead of the image stages: what it drops
    is never looked up, so the push does not name it either."""
    log, images, start = workload()
    options = {"fullDocument": "updateLookup", "fullDocumentBeforeChange": "whenAvailable"}
    cmd = {
        "aggregate": "items",
        "pipeline": [{"$changeStream": options}, {"$match": {"documentKey._id": 1}}],
        "cursor": {},
    }
    pipeline = ChangeStreamPipeline(parse_aggregate(cmd, "shop"), start, images=ExternalImages())
    needs = pipeline.push(log.entries)
    assert needs is not None
    one = [e for e in log.entries if e["op"] in ("u", "d") and e["o2" if e["op"] == "u" else "o"]
           ["_id"] == 1]
    uuid = bytes(log.uuid(NS))
    assert needs.pre_images == [pre_image_id(uuid, e["ts"], 0) for e in one]
    assert {ns: [dict(k) for k in keys] for ns, keys in needs.documents.items()} == {
        ("shop", "items", uuid): [{"_id": 1}]
    }
    answers = LookupAnswers()
    answer_from(None, images)(needs, answers)
    assert pipeline.push(log.entries, None, answers) is None
    expected = ChangeStreamPipeline(parse_aggregate(cmd, "shop"), start, images=images)
    expected.push(log.entries)
    got = raws(pipeline)
    assert got == raws(expected) and len(got) == 3  # insert, update, replace of _id 1
