"""What the upstream modules share: options, errors, the raw codec and cursor helpers.

The upstream source (a live replica set's `local.oplog.rs`) is split along what it asks of
mongod: `mongo_tail.py` tails the oplog and follows the majority commit point,
`mongo_history.py` reads history behind the live window and transaction entries,
`mongo_images.py` fetches pre-images and updateLookup documents; `mongo.py` is the facade.
The tail makes the other two and hands itself to them as an `UpstreamLink` (below), so they
never import mongo_tail.py.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from bson.raw_bson import RawBSONDocument
from bson.timestamp import Timestamp

from cdcserver.sources.retained import RetainedLog
from pipeline_stages import bson_bytes
from pipeline_stages.check_resumability import HISTORY_LOST_MESSAGE
from pipeline_stages.error_codes import CATEGORIES
from pipeline_stages.error_labels import NOT_PRIMARY_ERROR, SHUTDOWN_ERROR
from pipeline_stages.errors import MongoError
from pipeline_stages.oplog_entry import Entry

# pymongo types a RawBSONDocument's `raw` as `bytes | memoryview`; the documents of a cursor
# read with RAW are made by bson's C decoder, which always gives them `bytes` (even from a
# memoryview), so the modules here cast `doc.raw` to bytes where they keep or decode it.
RAW = bson_bytes.codec_options(document_class=RawBSONDocument)
MAX_TS = Timestamp(0xFFFFFFFF, 0xFFFFFFFF)
# Codes of the upstream's errors that say "this oplog position is gone".
CAPPED_POSITION_LOST = 136
# error_codes.yml's NotPrimaryError and ShutdownError categories, less internal-only codes (the
# proxy tells its client's topology, as a driver does, so the next command finds the primary).
NOT_PRIMARY_CODES = NOT_PRIMARY_ERROR | (SHUTDOWN_ERROR - CATEGORIES["InternalOnly"])
# What closing may spend talking to the upstream (killCursors, endSessions), all steps
# together: with the upstream dead or stalled pymongo would wait serverSelectionTimeoutMS for
# each, and a shutdown must end within its grace whatever the upstream's state.
CLOSE_TIMEOUT_S = 1.0


def next_ts(ts: Timestamp) -> Timestamp:
    return Timestamp(ts.time, ts.inc + 1) if ts.inc < 0xFFFFFFFF else Timestamp(ts.time + 1, 0)


@dataclass
class UpstreamOptions:
    """How the upstream is read (`[upstream]` in the config file)."""

    uri: str
    batch_size: int = 1000  # batchSize of the tail's find/getMore
    max_await_ms: int = 1000  # awaitData wait of the tail's getMores
    window_entries: int = 100_000  # live window: entries kept for cursors near the head
    window_bytes: int = 256 * 1024 * 1024
    history_batch: int = 1000  # batchSize of history reads
    history_keep: int = 20_000  # entries a history segment keeps (readers behind re-read)
    history_segments: int = 16  # history readers open at once
    history_idle_s: float = 60.0  # a history reader nobody read from for this long closes
    majority_poll_ms: float = 2.0  # hello interval while entries wait for the commit point
    backoff_initial_ms: float = 50.0  # reconnect backoff (doubles, with jitter)
    backoff_max_ms: float = 5000.0
    oldest_refresh_s: float = 5.0  # how often the upstream's oldest entry is re-read
    lookup_timeout_ms: float = 2000.0  # updateLookup / pre-image / oplog entry lookups
    uuid_cache_s: float = 1.0  # collection UUIDs (updateLookup's UUID check) are re-read after
    # The durable log of what was tailed (sources/retained.py): its data directory (None: no
    # log, history is the window and the upstream's oplog), and its retention (either limit
    # exceeded drops the oldest entries; 0: no limit of that kind).
    retain_dir: str | None = None
    retain_mb: float = 1024
    retain_hours: float = 168.0
    # Options for both clients (AsyncMongoClient for the tail, history and lookups; MongoClient
    # only for `prime`, before serving),
    # beyond what the URI says (its auth and TLS options apply as given).
    client_options: dict[str, Any] = field(default_factory=dict)


class UpstreamError(MongoError):
    """The upstream cannot be reached (6, 89: resumable for a change stream, the driver
    resumes from its last token) or answered an error (its code and codeName)."""

    def __init__(
        self, code: int, errmsg: str, labels: Sequence[str] = (), code_name: str | None = None
    ) -> None:
        super().__init__(code, errmsg, labels)
        self._code_name = code_name

    @property
    def code_name(self) -> str:
        return self._code_name or super().code_name


class UpstreamLink(Protocol):
    """What the history readers (mongo_history.py) and the image fetcher (mongo_images.py) use
    of the tail that owns them (mongo_tail.UpstreamOplog): its options and clients, its state
    (the durable log, the DDL generation, the majority commit point) and its lookup policy."""

    @property
    def options(self) -> UpstreamOptions: ...

    @property
    def retained(self) -> RetainedLog | None:
        """The durable log of what was tailed (None: there is none)."""
        ...

    @property
    def ddl_generation(self) -> int:
        """Bumped by every command entry the tail delivers (cached collection UUIDs expire)."""
        ...

    @property
    def majority_commit_point(self) -> Timestamp | None:
        """The upstream's majority commit point, as last read (None: not yet known)."""
        ...

    async def until_ready(self) -> None:
        """Return once the majority commit point is known."""
        ...

    def async_client(self) -> Any:
        """The AsyncMongoClient to the upstream (made on first use, on the running loop)."""
        ...

    def oplog_collection(self, client: Any) -> Any:
        """`local.oplog.rs` of `client`, read as raw BSON."""
        ...

    def notify(self) -> None:
        """Entries became readable: wake every waiting getMore."""
        ...

    async def close_own_cursor(self, cursor: Any) -> None:
        """Close a cursor of a task of the tail's (within the close budget when closing)."""
        ...

    async def refresh_oldest(self, client: Any) -> Entry | None:
        """Read the upstream's oldest entry again."""
        ...

    def lookup_allowed(self, what: str) -> None:
        """Raise the resumable error a lookup fails fast with while the upstream is silent."""
        ...

    def lookup_error(self, what: str, exc: BaseException) -> UpstreamError:
        """The error a failed lookup raises."""
        ...


def upstream_unavailable(what: str, exc: BaseException) -> UpstreamError:
    """A pymongo error from the upstream as the error of the command it happened in: a
    timeout is NetworkTimeout (89), a lost or refused connection HostUnreachable (6), both
    resumable; an error the upstream answered (e.g. Unauthorized) keeps its code."""
    from pymongo.errors import ConnectionFailure, ExecutionTimeout, NetworkTimeout, OperationFailure

    if isinstance(exc, (NetworkTimeout, ExecutionTimeout)):
        return UpstreamError(89, f"{what}: the upstream did not answer in time: {exc}")
    if isinstance(exc, OperationFailure) and not isinstance(exc, ConnectionFailure):
        details = exc.details or {}
        errmsg = details.get("errmsg", str(exc))
        return UpstreamError(
            exc.code or 1, f"{what}: the upstream answered: {errmsg}",
            code_name=details.get("codeName"),
        )
    return UpstreamError(6, f"{what}: the upstream is unreachable: {exc}")


def history_lost() -> MongoError:
    return MongoError(286, HISTORY_LOST_MESSAGE)


async def next_batch(cursor: Any) -> list[RawBSONDocument]:
    """One batch: what the cursor holds, else one find/getMore (an awaitData getMore waits up
    to its maxAwaitTimeMS). Empty when that getMore found nothing or the cursor is dead."""
    batch: list[RawBSONDocument] = []
    await cursor._next_batch(batch)  # noqa: SLF001  (pymongo >= 4.9; public API reads per doc)
    return batch


async def close_cursor(cursor: Any, timeout_s: float = CLOSE_TIMEOUT_S) -> None:
    """Close a cursor on the upstream (killCursors) within `timeout_s`: a dead upstream must
    not hold a reconnect or a shutdown for a server selection timeout."""
    import pymongo

    if cursor is not None and timeout_s > 0:
        with contextlib.suppress(Exception), pymongo.timeout(timeout_s):
            async with asyncio.timeout(timeout_s + 0.1):
                await cursor.close()
    return None
