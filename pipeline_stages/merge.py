"""The mongos merge of shard change streams: `AsyncResultsMerger` in sorted tailable mode.

mongos opens one change-stream cursor per shard and merges their batches on the sort key
`{_id._data: 1}` (the resume token's upper-case hex, `resume_token.sort_key`). Each shard's
stream is in token order, and each batch carries a post-batch resume token: the shard's
promise that nothing it returns later sorts before it. An event leaves the merge only when
every open shard has promised past it, that is when its key is at most

    min over open shards of (the first buffered event's key, or the post-batch token's key)

(`AsyncResultsMerger::_readySortedTailable`, `_minPromisedSortKey`). A shard that has not
answered yet promises nothing and holds the merge back; a shard whose stream has ended
(`close`) holds nothing back. A shard added mid-stream (`kNewShardDetected`, reported by
`$_internalChangeStreamCheckTopologyChange`) starts at the token of the event that announced
it: it promises that token until its first batch, so no event after it leaves before the new
shard has answered for that time.

Equal keys (they do not occur between shards in practice: a token names its shard's document)
leave in the order the shards were added, then in arrival order, as a stable merge.

The merged post-batch resume token is the last returned event's token, or, when no event is
ready, the smallest promise if that is later (`AsyncResultsMerger::getHighWaterMark`).

Pure and synchronous: the caller reads the shards (a server, `cdcserver replay`, a Spark task)
and pushes what each returns.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Hashable, Iterable, Iterator, Mapping
from typing import Any, Generic, TypeVar

from pipeline_stages.resume_token import sort_key

T = TypeVar("T")

__all__ = ["ShardMerge", "event_key"]


def event_key(event: Any) -> str:
    """The sort key of a change event (a document with `_id: {_data}`)."""
    return sort_key(event["_id"])


class _Remote(Generic[T]):
    __slots__ = ("shard", "rank", "buffer", "promise", "token", "closed")

    def __init__(self, shard: Hashable, rank: int) -> None:
        self.shard = shard
        self.rank = rank
        self.buffer: deque[tuple[str, T, Mapping[str, Any]]] = deque()
        self.promise: str | None = None  # None: the shard has not answered yet
        self.token: Mapping[str, Any] | None = None  # the token the promise comes from
        self.closed = False


class ShardMerge(Generic[T]):
    """N ordered shard streams in, one stream out in sort-key order.

    `push(shard, events, post_batch_token)` for every batch a shard returns, `close(shard)`
    when its stream has ended (or the shard was removed), `add_shard` for a shard that joins;
    `pop_ready()` / `ready()` give the events that may leave now."""

    def __init__(
        self,
        shards: Iterable[Hashable] = (),
        *,
        key: Callable[[T], str] = event_key,
        token: Callable[[T], Mapping[str, Any]] | None = None,
    ) -> None:
        self._key = key
        self._token = token if token is not None else (lambda e: e["_id"])
        self._remotes: dict[Hashable, _Remote[T]] = {}
        self._high_water: Mapping[str, Any] | None = None
        self._high_key: str | None = None
        for shard in shards:
            self.add_shard(shard)

    # -- input -----------------------------------------------------------------------------

    def add_shard(self, shard: Hashable, start_token: Mapping[str, Any] | None = None) -> None:
        """A shard that joins. With `start_token` (the token of the event that announced it),
        it promises that token until it answers; without, it promises nothing yet."""
        if shard in self._remotes:
            raise ValueError(f"shard {shard!r} is already merged")
        remote: _Remote[T] = _Remote(shard, len(self._remotes))
        if start_token is not None:
            remote.promise, remote.token = sort_key(start_token), start_token
        self._remotes[shard] = remote

    def push(
        self, shard: Hashable, events: Iterable[T], post_batch_token: Mapping[str, Any] | None
    ) -> None:
        """One batch of a shard: its events (in its stream's order) and its post-batch token."""
        remote = self._remotes[shard]
        if remote.closed:
            raise ValueError(f"shard {shard!r} has ended")
        key_of, token_of = self._key, self._token
        last = remote.buffer[-1][0] if remote.buffer else remote.promise
        for event in events:
            key = key_of(event)
            if last is not None and key < last:
                raise ValueError(
                    f"shard {shard!r} returned {key} after {last}: its stream is not in order"
                )
            remote.buffer.append((key, event, token_of(event)))
            last = key
        if post_batch_token is not None:
            promise = sort_key(post_batch_token)
            # A batch's token is never before its last event; keep the stronger promise.
            if last is None or promise >= last:
                remote.promise, remote.token = promise, post_batch_token
            elif remote.buffer:
                remote.promise, remote.token = last, remote.buffer[-1][2]

    def close(self, shard: Hashable) -> None:
        """The shard's stream has ended: what it buffered still leaves, it holds nothing back."""
        self._remotes[shard].closed = True

    # -- output ----------------------------------------------------------------------------

    @property
    def shards(self) -> list[Hashable]:
        return list(self._remotes)

    def buffered(self, shard: Hashable | None = None) -> int:
        """Events waiting in the merge (of one shard, or of all)."""
        if shard is not None:
            return len(self._remotes[shard].buffer)
        return sum(len(r.buffer) for r in self._remotes.values())

    def blocking(self) -> Hashable | None:
        """The open shard whose promise is the smallest with an empty buffer: the one to read
        next (None when nothing blocks: every open shard has buffered events)."""
        best: _Remote[T] | None = None
        for remote in self._remotes.values():
            if remote.closed or remote.buffer:
                continue
            if remote.promise is None:
                return remote.shard
            if best is None or remote.promise < best.promise:  # type: ignore[operator]
                best = remote
        return None if best is None else best.shard

    def holding_back(self) -> list[Hashable]:
        """The open shards with nothing buffered whose promise does not pass the next event:
        the ones the merge waits for (empty when nothing is buffered or it may leave)."""
        front = self._front()
        if front is None:
            return []
        key = front.buffer[0][0]
        return [r.shard for r in self._remotes.values()
                if not r.closed and not r.buffer and (r.promise is None or r.promise < key)]

    def _min_promise(self) -> tuple[str | None, bool]:
        """(the smallest promise of the open shards, whether every open shard has one)."""
        low: str | None = None
        for remote in self._remotes.values():
            if remote.buffer:
                key = remote.buffer[0][0]
            elif remote.closed:
                continue
            elif remote.promise is None:
                return None, False
            else:
                key = remote.promise
            if low is None or key < low:
                low = key
        return low, True

    def _front(self) -> _Remote[T] | None:
        best: _Remote[T] | None = None
        for remote in self._remotes.values():
            if remote.buffer and (best is None or remote.buffer[0][0] < best.buffer[0][0]):
                best = remote
        return best

    def ready(self) -> bool:
        """Whether an event may leave now."""
        front = self._front()
        if front is None:
            return False
        low, known = self._min_promise()
        return known and low is not None and front.buffer[0][0] <= low

    def next(self) -> T | None:
        """The next event in merged order, if it may leave now."""
        front = self._front()
        if front is None:
            self._advance_high_water()
            return None
        low, known = self._min_promise()
        key = front.buffer[0][0]
        if not known or low is None or key > low:
            self._advance_high_water()
            return None
        _, event, token = front.buffer.popleft()
        self._high_key, self._high_water = key, token
        return event

    def pop_ready(self, limit: int | None = None) -> list[T]:
        """Every event that may leave now (at most `limit`)."""
        out: list[T] = []
        while limit is None or len(out) < limit:
            event = self.next()
            if event is None:
                break
            out.append(event)
        return out

    def __iter__(self) -> Iterator[T]:
        """The events that may leave now."""
        while True:
            event = self.next()
            if event is None:
                return
            yield event

    @property
    def exhausted(self) -> bool:
        """Every shard has ended and every event has left."""
        return all(r.closed and not r.buffer for r in self._remotes.values())

    def _advance_high_water(self) -> None:
        """Nothing is ready: the high-water mark may move up to the smallest promise."""
        low: tuple[str, Mapping[str, Any]] | None = None
        for remote in self._remotes.values():
            if remote.buffer:
                return  # an event is waiting: the mark stays before it
            if remote.closed:
                continue
            if remote.promise is None:
                return
            if low is None or remote.promise < low[0]:
                low = (remote.promise, remote.token)  # type: ignore[assignment]
        if low is None:  # every shard has ended: as far as the furthest promise
            ended = [r for r in self._remotes.values() if r.promise is not None]
            if not ended:
                return
            last = max(ended, key=lambda r: r.promise)  # type: ignore[arg-type,return-value]
            low = (last.promise, last.token)  # type: ignore[assignment]
        assert low is not None  # set by one branch above or returned
        if self._high_key is None or low[0] > self._high_key:
            self._high_key, self._high_water = low

    @property
    def post_batch_resume_token(self) -> Mapping[str, Any] | None:
        """The merged stream's post-batch resume token (None before any shard answered)."""
        if not self.ready():
            self._advance_high_water()
        return self._high_water
