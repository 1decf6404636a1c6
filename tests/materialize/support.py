"""Shared by the materialize tests: a sidecar B with `materialize`, tailing an embedded A."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from bson.raw_bson import RawBSONDocument
from bson.timestamp import Timestamp
from pymongo import MongoClient

from cdcserver.deployments.upstream import UpstreamDeployment
from cdcserver.materialize.sync import Materializer
from cdcserver.sources.mongo import UpstreamOplog, UpstreamOptions
from cdcserver.testing import ThreadServer

GUARD_S = 20.0  # hang guards, never performance expectations


class MaterializedSidecar(ThreadServer):
    """Server B: cdcserver on its own loop thread, tailing `uri` with a retained log in
    `retain_dir` and the copy of `patterns` beside it."""

    def __init__(self, uri: str, retain_dir: str, patterns: Sequence[str], **options: Any):
        self._options = UpstreamOptions(uri=uri, retain_dir=retain_dir, max_await_ms=200,
                                        **options)
        self._patterns = list(patterns)
        super().__init__(make_deployment=lambda: UpstreamDeployment(
            UpstreamOplog(self._options), materialize=self._patterns))

    @property
    def source(self) -> UpstreamOplog:
        return self.state.oplog  # type: ignore[return-value]

    @property
    def materializer(self) -> Materializer:
        copy = self.source.images.copy
        assert isinstance(copy, Materializer)
        return copy

    def wait_applied(self, ts: Timestamp) -> None:
        """Until B's copy has applied every entry up to `ts` (A's latest)."""
        deadline = time.monotonic() + GUARD_S
        m = self.materializer
        while True:
            applied = self.call(lambda: m.applied if m.state == "ready" else None)
            if applied is not None and applied >= ts:
                return
            assert time.monotonic() < deadline, f"B's copy stuck at {applied}, A at {ts}"
            time.sleep(0.01)

    def documents(self, db: str, coll: str, at: Timestamp | None = None) -> list[bytes]:
        """The copy's documents of db.coll as of `at` (default: the last applied entry)."""
        m = self.materializer

        def read() -> list[bytes]:
            ts = at or m.applied
            assert ts is not None
            cid = m.store.collection_at(db, coll, ts)
            return [] if cid is None else list(m.store.documents_at(cid, ts))

        return self.call(read)

    def client(self, **kwargs: Any) -> MongoClient:
        return MongoClient(self.direct_uri, serverSelectionTimeoutMS=5000, **kwargs)


def raw_client(uri: str, **kwargs: Any) -> MongoClient:
    return MongoClient(uri, document_class=RawBSONDocument, serverSelectionTimeoutMS=5000,
                       **kwargs)


def sorted_raw(client: MongoClient, db: str, coll: str) -> list[bytes]:
    """A's documents of db.coll in the copy's order (by `_id`'s equality key)."""
    from pipeline_stages.image_source import equality_key

    docs = list(client[db][coll].find({}))
    docs.sort(key=lambda d: equality_key(d["_id"]))
    return [bytes(d.raw) for d in docs]


class MaterializedShardedSidecar(ThreadServer):
    """A sidecar of a sharded cluster's mongos front (as cdcserver.sharding.testing's
    ShardedSidecar) with `materialize`: a copy per shard under `retain_dir/<shard>`."""

    def __init__(self, mongos_uri: str, retain_dir: str, patterns: Sequence[str],
                 **options: Any) -> None:
        from cdcserver.deployments.sidecar import SidecarDeployment
        from cdcserver.sharding.sidecar import ShardedUpstream, mongos_shards

        shards = mongos_shards(mongos_uri)
        assert shards is not None, f"{mongos_uri} is not a mongos"
        self.upstream = ShardedUpstream(
            UpstreamOptions(uri=mongos_uri, retain_dir=retain_dir, **options), shards, patterns)
        self.upstream.prime()
        deployment = SidecarDeployment(self.upstream)
        super().__init__(make_deployment=lambda: deployment)

    async def _start(self) -> Any:
        server = await super()._start()
        await self.upstream.wait_ready(10.0)
        return server

    def wait_applied(self) -> None:
        """Until every shard's copy is ready and has applied its tail's newest entry."""
        deadline = time.monotonic() + GUARD_S

        def behind() -> list[str]:
            late = []
            for name, copy in self.upstream.copies.items():
                latest = self.upstream.shard(name).log.latest_ts()
                if copy.state != "ready" or latest is None or copy.applied is None or (
                        copy.applied < latest):
                    late.append(name)
            return late

        while late := self.call(behind):
            assert time.monotonic() < deadline, f"copies behind: {late}"
            time.sleep(0.01)
