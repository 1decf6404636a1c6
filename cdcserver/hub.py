"""Shared work between change-stream cursors.

The source is read once for everyone (`sources/base.py` keeps a window of decoded entries).
On top of that, cursors with the same spec opened at the same position form a `StreamGroup`:
one producer pipeline filters, transforms and encodes each entry once, and every member
queues the result (references to the same encoded events). Each member keeps its own
batches, post-batch token and position, so members can consume at different speeds.

A member that falls too far behind the others is detached: it gets a pipeline of its own,
resumed from the last token it returned, and reads the oplog at its own pace, so a slow
consumer never makes the server hold an unbounded queue for it.

Every read goes through `StreamGroup.read`: when the capped oplog has dropped the group's place
(the last entry it saw, and perhaps entries it has not read), the read fails with
CappedPositionLost, as mongod's tailable oplog scan does, instead of going on after a gap.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

import bson
from bson.timestamp import Timestamp

from cdcserver.sources.base import CappedPositionLost
from pipeline_stages import resume_token
from pipeline_stages.pipeline import ChangeStreamPipeline
from pipeline_stages.spec import ChangeStreamSpec

if TYPE_CHECKING:
    from cdcserver.cursors import ChangeStreamCursor
    from cdcserver.sources.base import OplogLog
    from pipeline_stages.oplog_entry import Entry

# Events a member may have queued and not yet returned before it is detached.
MAX_MEMBER_LAG = 10_000
READ_CHUNK = 1000


def next_ts(ts: Timestamp) -> Timestamp:
    return Timestamp(ts.time, ts.inc + 1) if ts.inc < 0xFFFFFFFF else Timestamp(ts.time + 1, 0)


def prev_ts(ts: Timestamp) -> Timestamp:
    if ts.inc:
        return Timestamp(ts.time, ts.inc - 1)
    return Timestamp(ts.time - 1, 0xFFFFFFFF) if ts.time else ts


def shareable_key(spec: ChangeStreamSpec) -> bytes | None:
    """What must be equal for two streams to share a producer; None for streams that start from
    a token or an operation time (their first events depend on where they start)."""
    if (
        spec.resume_after is not None
        or spec.start_after is not None
        or spec.start_at_operation_time is not None
    ):
        return None
    fields = dataclasses.asdict(spec)
    for name in ("resume_after", "start_after", "start_at_operation_time", "resume_token"):
        fields.pop(name, None)
    return bson.encode({"spec": fields})


class StreamGroup:
    def __init__(
        self,
        key: bytes | None,
        producer: ChangeStreamPipeline,
        log: OplogLog,
        start: Timestamp,
        last_seen: Timestamp | None = None,
    ) -> None:
        self.key = key
        self.producer = producer
        self.log = log
        self.next_ts = start  # the first ts the producer has not read
        # The last entry read (mongod's "last seen record"); before the first read, the place
        # just before the start.
        self.last_seen = prev_ts(start) if last_seen is None else last_seen
        self.members: list[ChangeStreamCursor] = []

    def read(self, chunk: int) -> list[Entry]:
        """Up to `chunk` entries from the group's position. CappedPositionLost when the capped
        oplog dropped the group's place: reading on would silently skip what was dropped."""
        if self.log.position_lost(self.next_ts):
            raise CappedPositionLost(self.last_seen)
        return self.log.read_from(self.next_ts, chunk)

    def pull(self, want: int, member: ChangeStreamCursor) -> None:
        """Read the oplog until `member` has `want` events queued or the oplog is exhausted;
        every member gets what the producer made."""
        while member.pipeline.pending_count < want and not self.producer.invalidated:
            if not self.step(member, READ_CHUNK):
                break

    def step(
        self, member: ChangeStreamCursor, chunk: int, entries: list[Entry] | None = None
    ) -> bool:
        """Read up to `chunk` entries for every member (`member` is the one reading); False
        when there was nothing to read. `entries`: the ones at `next_ts`, already read (their
        image lookups were fetched for them: cursors.py `step_prepared`)."""
        producer = self.producer
        if entries is None:
            entries = self.read(chunk)
        if not entries:
            return False
        last = entries[-1]["ts"]
        producer.push(entries, scanned_to=last)
        self.next_ts = next_ts(last)
        self.last_seen = last
        items = producer.take_pending()
        for m in self.members:
            m.pipeline.share(items, producer)
        self._detach_laggards(member)
        return True

    def _detach_laggards(self, reader: ChangeStreamCursor) -> None:
        for m in list(self.members):
            if m is not reader and m.pipeline.pending_count > MAX_MEMBER_LAG:
                detach(m)

    def remove(self, member: ChangeStreamCursor) -> None:
        if member in self.members:
            self.members.remove(member)


def detach(member: ChangeStreamCursor) -> None:
    """Give `member` its own pipeline, resumed after the last event it returned."""
    group = member.group
    group.remove(member)
    token = member.pipeline.post_batch_resume_token
    data = resume_token.decode(token)
    spec = dataclasses.replace(
        member.pipeline.spec,
        resume_after=dict(token),
        start_after=None,
        start_at_operation_time=None,
        resume_token=data,
    )
    old = member.pipeline
    pipeline = ChangeStreamPipeline(
        spec, data.cluster_time, history=old.history, images=old.images
    )
    member.pipeline = pipeline
    # It reads on from its token (the events queued after it are dropped and read again): if
    # the oplog no longer has the token's entry, its first read fails (CappedPositionLost).
    member.group = StreamGroup(
        None, pipeline, group.log, data.cluster_time, last_seen=data.cluster_time
    )
    member.group.members.append(member)


class Hub:
    """Groups of identical streams, per source."""

    def __init__(self) -> None:
        self.groups: dict[bytes, list[StreamGroup]] = {}

    def group_for(
        self,
        spec: ChangeStreamSpec,
        start: Timestamp,
        log: OplogLog,
        make_pipeline: Any,
    ) -> tuple[StreamGroup, ChangeStreamPipeline]:
        """The group a new stream joins (or a new one) and the stream's own pipeline.

        A new stream joins a group with the same spec whose producer has read exactly up to
        the stream's start: everything the producer makes from then on is what the new
        stream's own pipeline would have made.
        """
        key = shareable_key(spec)
        if key is not None:
            for group in self.groups.get(key, []):
                if (
                    group.log is log
                    and group.next_ts == start
                    and not group.producer.invalidated
                    and group.members
                ):
                    return group, make_pipeline()
        producer = make_pipeline()
        group = StreamGroup(key, producer, log, start)
        if key is None:
            # Nothing to share: the stream's own pipeline is the producer.
            return group, producer
        self.groups.setdefault(key, []).append(group)
        return group, make_pipeline()

    def forget_empty(self) -> None:
        for key, groups in list(self.groups.items()):
            kept = [g for g in groups if g.members]
            if kept:
                self.groups[key] = kept
            else:
                del self.groups[key]
