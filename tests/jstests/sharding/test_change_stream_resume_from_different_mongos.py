"""Translated from mongodb/mongo
`jstests/sharding/query/change_streams/change_stream_resume_from_different_mongos.js` @
05a9f6fe335c104fb2184e56e4ae64f27487f011 (`ChangeStreamTest`: `cst.py`), for a collection, a
whole-db and a whole-cluster stream: a hundred inserts split across two shards are read
through one mongos (the embedded cluster's front), then resumed from the first one's token
through a second mongos, and from every token after it. The second mongos is a sidecar of the
cluster (`serve --upstream <the front>`: `ShardedSidecar`, a mongos to its clients over the same
shards), the only other mongos there is here. As in the jstest, `docsFoundInOrder.splice(i + 1)`
empties the expected list after the first resume: the later resumes are opened and read
nothing expected (each is checked here to give its next event in order, which the jstest does
not check)."""

from __future__ import annotations

from collections.abc import Iterator

import pymongo
import pytest
from cst import ChangeStreamTest

from cdcserver.sharding.testing import ShardedSidecar

N_DOCS = 100
COLL = "change_stream_failover"


@pytest.fixture
def s1(st) -> Iterator[pymongo.MongoClient]:
    with ShardedSidecar(st.server.uri) as sidecar, pymongo.MongoClient(sidecar.uri) as client:
        yield client


def _stream(cst: ChangeStreamTest, mode: str, **options) -> dict:
    if mode == "cluster":
        return cst.start_watching_changes(
            [{"$changeStream": {"allChangesForCluster": True, **options}}], 1)
    return cst.start_watching_changes([{"$changeStream": options}],
                                      COLL if mode == "collection" else 1)


@pytest.mark.parametrize("mode", ["collection", "db", "cluster"])
def test_change_stream_resume_from_different_mongos(st, s1, mode):
    s0 = st.s
    coll = s0.test[COLL]
    coll.drop()
    s0.test.create_collection(COLL)
    st.shard_coll(coll, {"_id": 1}, {"_id": N_DOCS // 2}, {"_id": N_DOCS // 2 + 1}, "test",
                  False)

    def db_for(client: pymongo.MongoClient):
        return client.admin if mode == "cluster" else client.test

    cst = ChangeStreamTest(db_for(s0))
    cs = _stream(cst, mode)
    ids = []
    docs = []
    for i in range(N_DOCS // 2):
        ids += [i, i + N_DOCS // 2]
        docs += [{"_id": i}, {"_id": i + N_DOCS // 2}]
    coll.insert_many(docs, ordered=False)

    first = cst.get_one_change(cs)
    found = [first]
    for _ in range(N_DOCS - 1):
        change = cst.get_one_change(cs)
        assert change["ns"] == {"db": "test", "coll": COLL}
        assert change["operationType"] == "insert"
        found.append(change)
    assert {d["fullDocument"]["_id"] for d in found} == set(ids)
    cst.clean_up()

    other = ChangeStreamTest(db_for(s1))
    try:
        resumed = _stream(other, mode, resumeAfter=first["_id"])
        tokens = [first["_id"]]
        for _ in range(len(ids) - 1):
            tokens.append(other.get_one_change(resumed)["_id"])
        assert tokens == [d["_id"] for d in found]

        expected = list(found)
        for i, token in enumerate(tokens):
            cursor = _stream(other, mode, resumeAfter=token)
            rest, expected = expected[i + 1:], expected[:i + 1]  # JavaScript's splice(i + 1)
            other.assert_next_changes_equal(cursor, rest)
            if not rest and i + 1 < len(found):
                assert other.get_one_change(cursor)["_id"] == found[i + 1]["_id"]
    finally:
        other.clean_up()
