"""What the `jstests/sharding/` change-stream files get from `jstests/libs/shardingtest.js`
(mongodb/mongo @ 05a9f6fe335c104fb2184e56e4ae64f27487f011; facts learned, code our own) and
from the shell's change-stream cursor, over cdcserver's embedded cluster (`ShardedServer`).

- `ShardingTest.shard_coll` is `st.shardColl(coll, key, split, move, dbName, waitForDelete)`:
  `enableSharding` (an error ignored), `shardCollection`, a `split` at `split` (default: the
  key), then a `moveChunk` of the chunk holding `move` (default: `split`) to a shard other than
  the database's primary.
- `Stream` is the shell's `DBCommandCursor` over a change stream (`cst.ShellCursor`), whose
  `getMore`s wait at most `AWAIT_MS` (the shell sends no `maxTimeMS`: mongod waits 1 s; the
  embedded cluster's idle shards never hold an event back, so a shorter wait only makes "no
  event" answer sooner).
"""

from __future__ import annotations

from typing import Any

import pymongo
from cst import SOON_TRIES, ShellCursor
from pymongo.errors import OperationFailure

from cdcserver.sharding.testing import ShardedServer

AWAIT_MS = 100


class Stream(ShellCursor):
    def has_next(self) -> bool:
        if self.batch:
            return True
        if self.id == 0:
            return False
        command: dict[str, Any] = {"getMore": self.id, "collection": self.coll_name,
                                   "maxTimeMS": AWAIT_MS}
        if self.batch_size:
            command["batchSize"] = self.batch_size
        self._take(self.db.command(command, session=self.session)["cursor"], "nextBatch")
        return bool(self.batch)

    def soon_next(self, tries: int = SOON_TRIES) -> dict[str, Any]:
        """`assert.soon(() => cs.hasNext()); cs.next()`, within `tries` getMores (a hang
        guard: each waits at most AWAIT_MS)."""
        for _ in range(tries):
            if self.has_next():
                return self.next()
        raise AssertionError("no event")

    def soon_exhausted(self) -> None:
        """`assert.soon(() => { assert(!cs.hasNext()); return cs.isExhausted(); })`."""
        for _ in range(SOON_TRIES):
            assert not self.has_next(), self.batch
            if self.is_exhausted():
                return
        raise AssertionError("the cursor was not exhausted")


def watch(coll: Any, pipeline: list[Any] | None = None, collation: Any = None,
          batch_size: int | None = None, comment: Any = None, **options: Any) -> Stream:
    """`coll.watch(pipeline, options)` / `coll.aggregate([{$changeStream: options}, ...])`;
    `collation`, `batch_size` and `comment` are the aggregate's, the others the stage's."""
    from pymongo.database import Database

    if isinstance(coll, Database):  # `db.watch()`: aggregate 1, getMore on $cmd.aggregate
        coll, target = coll["$cmd.aggregate"], 1
    else:
        target = coll.name
    command: dict[str, Any] = {
        "aggregate": target, "pipeline": [{"$changeStream": options}, *(pipeline or [])],
        "cursor": {} if batch_size is None else {"batchSize": batch_size}}
    if collation is not None:
        command["collation"] = collation
    if comment is not None:
        command["comment"] = comment
    session = coll.database.client.start_session()  # the cursor's, for its getMores too
    return Stream(coll, reply=coll.database.command(command, session=session),
                  batch_size=batch_size, session=session)


def watch_db(db: Any, pipeline: list[Any] | None = None, **options: Any) -> Stream:
    """`db.watch(pipeline, options)`: a whole-database stream (`aggregate: 1`)."""
    return watch(db, pipeline, **options)


def watch_cluster(client: Any, pipeline: list[Any] | None = None, **options: Any) -> Stream:
    """`mongos.watch(pipeline, options)`: a whole-cluster stream."""
    return watch_db(client.admin, pipeline, allChangesForCluster=True, **options)


class ShardingTest:
    def __init__(self, server: ShardedServer, s: pymongo.MongoClient) -> None:
        self.server = server
        self.s = s
        self.shard_names = [shard.name for shard in server.cluster.shards]
        self._direct: dict[int, pymongo.MongoClient] = {}

    @property
    def shard0(self) -> str:
        return self.shard_names[0]

    @property
    def shard1(self) -> str:
        return self.shard_names[1]

    def rs(self, index: int) -> pymongo.MongoClient:
        """`st.rsN.getPrimary()`: a direct connection to shard `index`."""
        if index not in self._direct:
            self._direct[index] = pymongo.MongoClient(self.server.shard_uris[index])
        return self._direct[index]

    def rs_url(self, index: int) -> str:
        """`st.rsN.getURL()`: the shard's replica-set connection string, `name/host:port`."""
        return self.server.cluster.shards[index].host_string

    def primary_shard(self, db_name: str) -> str:
        return self.s.config.databases.find_one({"_id": db_name})["primary"]

    def shard_coll(self, coll: Any, key: dict[str, Any], split: Any = None, move: Any = None,
                   db_name: str | None = None, wait_for_delete: bool | None = None) -> None:
        split = key if split is None else split
        move = (split if move is None else move) if split is not False else False
        db_name = db_name or coll.database.name
        ns = f"{db_name}.{coll.name}"
        try:
            self.s.admin.command("enableSharding", db_name)
        except OperationFailure:
            pass
        self.s.admin.command("shardCollection", ns, key=key)
        if split is False:
            return
        self.s.admin.command("split", ns, middle=split)
        if move is False:
            return
        primary = self.primary_shard(db_name)
        other = next(name for name in self.shard_names if name != primary)
        command: dict[str, Any] = {"moveChunk": ns, "find": move, "to": other}
        if wait_for_delete is not None:
            command["_waitForDelete"] = wait_for_delete
        self.s.admin.command(command)

    def close(self) -> None:
        for client in self._direct.values():
            client.close()
        self._direct.clear()
