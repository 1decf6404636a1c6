"""`pipeline_stages/merge.py`: the mongos merge of shard streams (AsyncResultsMerger, sorted
tailable), on real resume tokens.

* Whatever the batching and the post-batch tokens, the merged stream is every event once, in
  token order (stable by shard), and no event leaves before every open shard promised past it.
* An idle shard holds the others back only until its high-water mark passes them; a shard that
  has not answered holds everything; a shard added at a token holds back what follows it.
* The merged post-batch token never goes back and never passes an event still to come.
"""

from __future__ import annotations

import uuid

import pytest
from bson.timestamp import Timestamp
from hypothesis import given, settings
from hypothesis import strategies as st

from pipeline_stages.merge import ShardMerge, event_key
from pipeline_stages.resume_token import ResumeTokenData, sort_key
from tests.spark.test_spark_replay import restore_logging  # noqa: F401

UUID = uuid.UUID(int=7).bytes


def event(t: int, i: int, shard: int, doc: int = 0) -> dict:
    token = ResumeTokenData.for_event(
        Timestamp(t, i), "insert", uuid=UUID, document_key={"_id": shard * 1000 + doc}
    ).to_document()
    return {"_id": token, "shard": shard, "t": (t, i)}


def hwm(t: int, i: int = 1) -> dict:
    return ResumeTokenData.high_water_mark(Timestamp(t, i)).to_document()


def test_idle_shard_holds_back_only_until_its_high_water_mark_passes():
    merge: ShardMerge[dict] = ShardMerge(["a", "b"])
    merge.push("a", [event(10, 1, 0), event(20, 1, 0)], hwm(20, 2))
    assert merge.pop_ready() == []  # b has not answered: nothing may leave
    assert merge.blocking() == "b"
    merge.push("b", [], hwm(15))
    assert [e["t"] for e in merge.pop_ready()] == [(10, 1)]  # 20 is past b's promise
    assert merge.post_batch_resume_token == event(10, 1, 0)["_id"]
    assert merge.blocking() == "b"
    merge.push("b", [], hwm(30))
    assert [e["t"] for e in merge.pop_ready()] == [(20, 1)]
    # Nothing buffered: the token moves up to the smallest promise.
    assert merge.post_batch_resume_token == hwm(20, 2)
    merge.close("a")
    assert merge.post_batch_resume_token == hwm(30)
    merge.close("b")
    assert merge.exhausted


def test_a_shard_added_at_a_token_holds_back_what_follows_it():
    merge: ShardMerge[dict] = ShardMerge(["a"])
    merge.push("a", [event(10, 1, 0), event(12, 1, 0)], hwm(13))
    start = hwm(11)
    merge.add_shard("new", start)  # kNewShardDetected at clusterTime 11
    assert [e["t"] for e in merge.pop_ready()] == [(10, 1)]
    assert merge.blocking() == "new"
    merge.push("new", [event(11, 5, 1)], hwm(12, 5))
    assert [e["t"] for e in merge.pop_ready()] == [(11, 5), (12, 1)]
    with pytest.raises(ValueError):
        merge.add_shard("a")


def test_out_of_order_input_is_refused():
    merge: ShardMerge[dict] = ShardMerge(["a"])
    merge.push("a", [event(10, 1, 0)], hwm(10, 2))
    with pytest.raises(ValueError, match="not in order"):
        merge.push("a", [event(9, 1, 0)], None)
    merge.close("a")
    with pytest.raises(ValueError, match="ended"):
        merge.push("a", [], hwm(11))


@st.composite
def shard_streams(draw):
    """Per shard: ordered events with (often shared) clusterTimes, cut into batches, each batch
    with a post-batch token at or after its last event (an event token or a high-water mark)."""
    shards = draw(st.integers(1, 4))
    streams = []
    for s in range(shards):
        times = sorted(draw(st.lists(st.integers(1, 40), max_size=25)))
        events = [event(t, 1, s, doc=k) for k, t in enumerate(times)]
        cuts = sorted(draw(st.sets(st.integers(0, len(events)), max_size=6)) | {len(events)})
        batches, prev, last_t = [], 0, 0
        for cut in cuts:
            chunk = events[prev:cut]
            prev = cut
            if chunk:
                last_t = chunk[-1]["t"][0]
            # A promise never passes the shard's next event: a high-water mark at a time sorts
            # before the events at that time.
            later = [e["t"][0] for e in events[cut:]]
            mark = min(last_t + draw(st.integers(0, 5)), later[0] if later else 10**6)
            if chunk and draw(st.booleans()):
                token = chunk[-1]["_id"]
            else:
                token = hwm(max(mark, 1))
            batches.append((chunk, token, mark))
        streams.append(batches)
    order = draw(st.lists(st.integers(0, shards - 1), max_size=200))
    return streams, order


@settings(max_examples=300, deadline=None)
@given(shard_streams())
def test_merged_stream_is_every_event_once_in_token_order(data):
    streams, order = data
    merge: ShardMerge[dict] = ShardMerge(range(len(streams)))
    positions = [0] * len(streams)
    out: list[dict] = []
    tokens: list[str] = []

    def step(s: int) -> None:
        if positions[s] < len(streams[s]):
            chunk, token, _ = streams[s][positions[s]]
            merge.push(s, chunk, token)
            positions[s] += 1
        elif s in merge.shards and positions[s] == len(streams[s]):
            merge.close(s)
            positions[s] += 1
        for e in merge.pop_ready():
            # Every other open shard has promised past it (or has an event waiting after it).
            for r in range(len(streams)):
                if r == e["shard"] or positions[r] > len(streams[r]) or merge.buffered(r):
                    continue
                assert positions[r] > 0, "released before every shard answered"
                chunk, token, _ = streams[r][positions[r] - 1]
                promise = max(sort_key(token), *(event_key(x) for x in chunk[-1:]))
                assert event_key(e) <= promise
            out.append(e)
        pbrt = merge.post_batch_resume_token
        if pbrt is not None:
            tokens.append(sort_key(pbrt))

    for s in order:
        step(s)
    for s in range(len(streams)):  # then every shard to its end
        while positions[s] <= len(streams[s]):
            step(s)
    expected = sorted(
        (e for batches in streams for chunk, _, _ in batches for e in chunk),
        key=lambda e: (event_key(e), e["shard"]),
    )
    assert out == expected
    assert merge.exhausted
    assert tokens == sorted(tokens)  # the merged token never goes back
    keys = [event_key(e) for e in out]
    assert keys == sorted(keys)


def test_cdcserver_replay_of_shards_is_the_merge_of_their_streams(tmp_path, restore_logging):  # noqa: F811
    """`cdcserver replay --oplog s0 --oplog s1 --oplog s2`: each shard's stream as `replay` gives
    it alone, merged by token (stable by shard), a collection stream ending at the first
    invalidate; the CLI writes exactly those lines."""
    import heapq

    from bson import json_util

    from cdcserver.cli import main, replay_shards
    from tests.spark.test_spark_replay import CANONICAL, Workload, command, ddl_story, reference

    base = Timestamp(1_720_000_000, 1)
    shards = [
        [str(Workload(seed=20 + s, shard=s, start=base).write(
            tmp_path / f"shard{s}.bson", 700, extra=ddl_story if s == 1 else None))]
        for s in range(3)
    ]
    for scope in ("cluster", "shop.orders"):
        cmd, db = command(scope)
        expected = []
        for e in heapq.merge(*(reference(p, cmd, db) for p in shards), key=event_key):
            expected.append(e)
            if e["operationType"] == "invalidate":
                break
        got = [e for batch, _ in replay_shards(shards, cmd, db) for e in batch]
        assert [e.raw for e in got] == [e.raw for e in expected], scope
        assert len({s["_id"]["_data"] for s in got}) == len(got)
        out = tmp_path / f"{scope}.jsonl"
        flag = ["--cluster"] if scope == "cluster" else ["--ns", scope]
        args = ["replay", *(a for p in shards for a in ("--oplog", *p)), *flag, "--out", str(out)]
        assert main(args) == 0
        lines = "".join(json_util.dumps(e, json_options=CANONICAL) + "\n" for e in expected)
        assert out.read_text() == lines
    # One shard: what it always was.
    cmd, db = command("cluster")
    one = [e for batch, _ in replay_shards(shards[:1], cmd, db) for e in batch]
    assert [e.raw for e in one] == [e.raw for e in reference(shards[0], cmd, db)]
